"""How evenly the persistent Mosaic forward's deal of work items spreads
over the SMs (v23, mosaic_fwd_sm90.WorkItems): no GPU needed.

The seed blog's masks (experiments/seed_blog.flags: window 1024, the
documents of chatqa2_long_sft packed by magi_pack, mask seed 0), 64 query
heads, batch 1, 128 x 128 tiles, 132 SMs. An item is one (q block, head);
its cost is its full tiles, its partial tiles at PARTIAL each and ITEM for
its start, loads and epilogue, in full tiles. Per row: the longest
program over the mean under the persistent grid's snake deal (the
kernel's own WorkItems), a plain stride (program p: p, p + 132, ...), and
the GPU's own dispatch of one program per item in launch order (each
next item to the first SM free), all in the walk's heaviest-first order.

    python experiments/lab/forward_deal.py
"""

import heapq

import jax.numpy as jnp
import numpy as np

from jax_backends.pallas_flex.mosaic_fwd_sm90 import WorkItems
from jax_backends.pallas_flex.plan import make_plan
from lcab.masks import make_mask, taken_params

SMS, HEADS = 132, 64
PARTIAL, ITEM = 1.6, 1.0  # costs in full tiles (rough: forward rows of the H200 blog)
MASKS = ("full", "causal", "causal_document", "sliding_window_causal")
LENGTHS = (1024, 2048, 4096, 16384)


def item_costs(name: str, length: int) -> np.ndarray:
    """Each item's cost in launch order (heads together, q blocks heaviest first)."""
    params = taken_params(name, window=1024, sampler="magi_pack")
    walk = make_plan(make_mask(name, length, **params), 128, 128).by_q
    full = (walk.run_stop - walk.run_start).sum(axis=1)
    rows = full + PARTIAL * walk.partials + ITEM
    return np.repeat(rows[walk.order], HEADS)


def snake(costs: np.ndarray) -> float:
    items = WorkItems(len(costs) // HEADS, HEADS, 1, True, SMS)
    loads = [sum(costs[int(items.item(jnp.int32(p), jnp.int32(n)))]
                 for n in range(int(items.share(jnp.int32(p)))))
             for p in range(items.programs)]
    return max(loads)


def stride(costs: np.ndarray) -> float:
    return max(costs[p::SMS].sum() for p in range(SMS))


def dispatch(costs: np.ndarray) -> float:
    free = [(0.0, p) for p in range(SMS)]
    for cost in costs:
        at, p = heapq.heappop(free)
        heapq.heappush(free, (at + cost, p))
    return max(at for at, _ in free)


def main():
    print("| mask | length | items | snake (persistent) | stride | one program per item |")
    print("|---|---|---|---|---|---|")
    for name in MASKS:
        for length in LENGTHS:
            costs = item_costs(name, length)
            mean = costs.sum() / SMS
            print(f"| {name} | {length} | {len(costs)} | {snake(costs) / mean:.3f} | "
                  f"{stride(costs) / mean:.3f} | {dispatch(costs) / mean:.3f} |")


if __name__ == "__main__":
    main()
