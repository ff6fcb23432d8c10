"""K/V moved and work balance of each dispatch under a group-cast plan
(lcab.cp.groupcast): exact counts from the masks' slices, no GPU.

The masks are the CP sweeps' (experiments/cp_jax.flags: the documents
drawn by the magi_pack sampler from chatqa2_long_sft, mask seed 0). One
row per mask, cp and dispatch at --tokens_per_gpu:
- area: the largest rank's visible pairs over the mean (the rows' notes'
  `imbalance`);
- tiles: the largest rank's touched 128 x 128 tiles over the mean (the
  rows' `tile_imbalance`; what a block-sparse kernel's time follows);
- seen: the K/V chunks some other rank's queries see (what ragged
  transfers would move) over what a ring or an all-gather moves, at
  512-token chunks (or the dispatch's own, where coarser ranges allow no
  finer);
- all_to_all, shifts: what jax.cp_groupcast moves with this dispatch,
  padding included, over a ring's: one all_to_all of buckets padded to
  the largest rank pair's, or one ppermute per ring shift padded to that
  shift's largest.

    python experiments/lab/groupcast_counts.py --tokens_per_gpu=32768 --cp=4
"""

from absl import app, flags

from lcab.cp import imbalance, make_dispatch, tile_imbalance
from lcab.cp.groupcast import coarsest_chunk, plan
from lcab.masks import make_mask
from lcab.masks.factory import taken_params

DISPATCHES = ("contiguous", "zigzag", "balanced", "groupcast", "groupcast_tiles")
MASKS = ("causal_document", "full_document", "causal", "sliding_window_causal")

_TOKENS = flags.DEFINE_integer("tokens_per_gpu", 8192, "Tokens each rank holds.", lower_bound=512)
_CP = flags.DEFINE_list("cp", ["2", "4", "8"], "CP sizes.")
_MASKS = flags.DEFINE_list("masks", list(MASKS), "Masks.")
_DISPATCHES = flags.DEFINE_list("dispatches", list(DISPATCHES), "Dispatches.")


def sweep_mask(name: str, seqlen: int):
    """The mask the CP sweeps time at this length."""
    params = taken_params(name, distribution="chatqa2_long_sft", sampler="magi_pack",
                          doc_cap=None)
    return make_mask(name, seqlen, seed=0, **params)


def main(argv) -> None:
    del argv
    print(f"{_TOKENS.value} tokens per GPU\n")
    print("| mask | cp | dispatch | area | tiles | seen | all_to_all | shifts |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for name in _MASKS.value:
        for cp in map(int, _CP.value):
            mask = sweep_mask(name, _TOKENS.value * cp)
            for dispatch_name in _DISPATCHES.value:
                dispatch = make_dispatch(dispatch_name, mask, cp)
                cast = plan(mask, dispatch, min(512, coarsest_chunk(dispatch)))
                ring = cast.all_gather_chunks()
                print(f"| {name} | {cp} | {dispatch_name} | {imbalance(mask, dispatch):.3f} | "
                      f"{tile_imbalance(mask, dispatch):.3f} | "
                      f"{cast.moved_chunks() / ring:.2f} | {cast.padded_chunks() / ring:.2f} | "
                      f"{cast.shifted_chunks() / ring:.2f} |", flush=True)


if __name__ == "__main__":
    app.run(main)
