"""K/V moved by each dispatch under a group-cast plan (lcab.cp.groupcast):
exact counts from the masks' slices, no GPU. One row per mask and cp at
8k tokens per GPU; 'moved' is the chunks moved over what a ring or an
all-gather moves (every rank gets every other rank's K/V), counted at
512-token chunks (or the dispatch's own, where coarser ranges allow no
finer); 'imbalance' is the largest rank area over the mean.

    python experiments/lab/groupcast_counts.py
"""

from lcab.cp import imbalance, make_dispatch
from lcab.cp.groupcast import coarsest_chunk, plan, solve
from lcab.masks import make_mask

TOKENS_PER_GPU = 8192
DISPATCHES = ("contiguous", "zigzag", "balanced", "groupcast")


def main() -> None:
    print("| mask | cp | " + " | ".join(f"{name}: imbalance, moved" for name in DISPATCHES)
          + " |")
    print("|---|---:|" + "---:|" * len(DISPATCHES))
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
            print(f"| {name} | {cp} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
