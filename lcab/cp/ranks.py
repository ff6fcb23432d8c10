"""What one rank of a CP strategy computes, for every framework: its
sub-workload, and whether a Ulysses all_to_all can split its heads."""

from __future__ import annotations

import dataclasses
import math

from lcab.masks.mask import AttnMask
from lcab.workloads import Workload


def sub_workload(workload: Workload, mask: AttnMask, head_share: int = 1) -> Workload:
    """`workload` cut to one rank's sub-mask and its share of the heads."""
    return dataclasses.replace(
        workload, seqlen_q=mask.seqlen_q, seqlen_k=mask.seqlen_k, mask=mask,
        heads_q=workload.heads_q // head_share, heads_kv=workload.heads_kv // head_share)


def ulysses_heads_problem(workload: Workload, ranks: int, what_ranks: str,
                          repeat_kv: bool = False) -> str | None:
    """Why a Ulysses all_to_all over `ranks` (named `what_ranks`) cannot split
    the query and K/V heads, if it cannot. With `repeat_kv` the K/V heads
    may be repeated (ulysses_kv_repeat), so only the query heads must
    divide: then lcm(K/V heads, ranks) divides them too, and every query
    group stays whole."""
    for what, heads in (("query", workload.heads_q), ("kv", workload.heads_kv)):
        if heads % ranks and not (what == "kv" and repeat_kv):
            return (f"Ulysses splits heads over {what_ranks}: {heads} {what} heads do not "
                    f"divide by {what_ranks} {ranks}")
    return None


def ulysses_kv_repeat(workload: Workload, ranks: int) -> int:
    """Copies of each K/V head a Ulysses split over `ranks` needs: 1 where
    the K/V heads divide by the ranks; else enough that every rank holds
    the K/V head of its query heads (the K/V all_to_all grows as much)."""
    return math.lcm(workload.heads_kv, ranks) // workload.heads_kv
