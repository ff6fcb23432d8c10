"""K/V moved by each dispatch under a group-cast plan (lcab.cp.groupcast):
exact counts from the masks' slices, no GPU. One row per mask and cp at
8k tokens per GPU; 'seen' is the chunks some other rank's queries see
(what ragged transfers would move) over what a ring or an all-gather
moves (every rank gets every other rank's K/V), counted at 512-token
chunks (or the dispatch's own, where coarser ranges allow no finer);
'imbalance' is the largest rank area over the mean. The last two columns
are what jax.cp_groupcast moves with the groupcast dispatch, padding
included: one all_to_all of buckets padded to the largest rank pair's, or
one ppermute per ring shift padded to that shift's largest.

    python experiments/lab/groupcast_counts.py
"""

from lcab.cp import imbalance, make_dispatch
from lcab.cp.groupcast import coarsest_chunk, plan, solve
from lcab.masks import make_mask

TOKENS_PER_GPU = 8192
DISPATCHES = ("contiguous", "zigzag", "balanced", "groupcast")


def main() -> None:
    print("| mask | cp | " + " | ".join(f"{name}: imbalance, seen" for name in DISPATCHES)
          + " | all_to_all | shifts |")
    print("|---|---:|" + "---:|" * (len(DISPATCHES) + 2))
    for name in ("causal_document", "full_document", "causal", "sliding_window_causal"):
        for cp in (2, 4, 8):
            mask = make_mask(name, TOKENS_PER_GPU * cp, seed=0)
            cells = []
            for dispatch_name in DISPATCHES:
                dispatch = (solve(mask, cp) if dispatch_name == "groupcast"
                            else make_dispatch(dispatch_name, mask, cp))
                cast = plan(mask, dispatch, min(512, coarsest_chunk(dispatch)))
                cells.append(f"{imbalance(mask, dispatch):.3f}, "
                             f"{cast.moved_chunks() / cast.all_gather_chunks():.2f}")
            # cast: the groupcast dispatch's, the last of DISPATCHES.
            ring = cast.all_gather_chunks()
            cells += [f"{cast.padded_chunks() / ring:.2f}", f"{cast.shifted_chunks() / ring:.2f}"]
            print(f"| {name} | {cp} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
