"""What one rank of a CP strategy computes, for every framework: its
sub-workload, and whether a Ulysses all_to_all can split its heads."""

from __future__ import annotations

import dataclasses

from lcab.masks.mask import AttnMask
from lcab.workloads import Workload


def sub_workload(workload: Workload, mask: AttnMask, head_share: int = 1) -> Workload:
    """`workload` cut to one rank's sub-mask and its share of the heads."""
    return dataclasses.replace(
        workload, seqlen_q=mask.seqlen_q, seqlen_k=mask.seqlen_k, mask=mask,
        heads_q=workload.heads_q // head_share, heads_kv=workload.heads_kv // head_share)


def ulysses_heads_problem(workload: Workload, ranks: int, what_ranks: str) -> str | None:
    """Why a Ulysses all_to_all over `ranks` (named `what_ranks`) cannot split
    the query and K/V heads, if it cannot."""
    for what, heads in (("query", workload.heads_q), ("kv", workload.heads_kv)):
        if heads % ranks:
            return (f"Ulysses splits heads over {what_ranks}: {heads} {what} heads do not "
                    f"divide by {what_ranks} {ranks}")
    return None
