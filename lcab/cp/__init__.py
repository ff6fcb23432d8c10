"""Framework-free context parallelism: who holds which tokens, and the work.

    from lcab.cp import make_dispatch, pair_areas, sub_mask
    dispatch = make_dispatch("zigzag", mask, cp=8)
    pair_areas(mask, dispatch)   # (cp, cp) visible pairs per ring step
    sub_mask(mask, dispatch.ranges[i], dispatch.ranges[j])   # rank i vs j's keys
"""

from lcab.cp.dispatch import (
    DISPATCH_NAMES,
    Dispatch,
    balanced,
    cached_dispatch,
    contiguous,
    default_chunk,
    imbalance,
    make_dispatch,
    pair_areas,
    rank_areas,
    rank_tiles,
    ring_balanced,
    ring_lockstep_area,
    ring_step_areas,
    tile_imbalance,
    zigzag,
)
from lcab.cp.ranks import sub_workload, ulysses_heads_problem, ulysses_kv_repeat
from lcab.cp.submask import sub_mask

__all__ = [
    "DISPATCH_NAMES",
    "Dispatch",
    "balanced",
    "cached_dispatch",
    "contiguous",
    "default_chunk",
    "imbalance",
    "make_dispatch",
    "pair_areas",
    "rank_areas",
    "rank_tiles",
    "ring_balanced",
    "ring_lockstep_area",
    "ring_step_areas",
    "sub_mask",
    "sub_workload",
    "tile_imbalance",
    "ulysses_heads_problem",
    "ulysses_kv_repeat",
    "zigzag",
]
