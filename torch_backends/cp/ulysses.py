"""torch.cp_ulysses: yunchang's all_to_all from sequence- to head-sharded,
the inner kernel over the whole sequence for the rank's heads, and back."""

from __future__ import annotations

import torch.distributed as dist

from lcab.backend import Support
from lcab.cp import sub_workload, ulysses_heads_problem
from lcab.workloads import Workload
from torch_backends.cp.base import InnerKernelBackend, reorder_tokens, token_index
from torch_backends.device import device_name


class UlyssesBackend(InnerKernelBackend):
    name = "torch.cp_ulysses"
    strategy = "ulysses"
    requires = ("torch", "yunchang")
    description = ("Ulysses with yunchang's all_to_all (sequence- to head-sharded and back), "
                   "any torch kernel inside (inner option)")

    def probe_heads_kv(self, workload):
        return min(workload.heads_kv, self.cp_size)  # fewer would not split

    def imbalance(self, workload, dispatch, *, by_tiles: bool = False) -> float:
        return 1.0  # every rank attends the whole sequence for its share of the heads

    def head_workload(self, workload: Workload) -> Workload:
        return sub_workload(workload, workload.mask, head_share=self.cp_size)

    def strategy_support(self, workload, dispatch):
        problem = ulysses_heads_problem(workload, self.cp_size, "cp_size")
        if problem:
            return Support.no(problem)
        # Every rank runs the same sub-workload: its share of the heads.
        return self.inner_support([("rank 0's heads", self.head_workload(workload))])

    def build(self, workload):
        from yunchang.comm.all_to_all import SeqAllToAll4D

        dispatch = self.dispatch(workload)
        attend = self.inner_function(self.head_workload(workload))
        device = device_name()
        to_natural = token_index(dispatch, True, device)
        to_dispatch = token_index(dispatch, False, device)
        group = dist.group.WORLD

        def local(q, k, v):
            # (b, S/cp, h, d) -> (b, S, h/cp, d): ranks' tokens, rank-major;
            # a contiguous block of heads keeps each query head with its K/V head.
            q, k, v = (reorder_tokens(SeqAllToAll4D.apply(group, x, 2, 1, False), to_natural)
                       for x in (q, k, v))
            out = reorder_tokens(attend(q, k, v), to_dispatch)
            return SeqAllToAll4D.apply(group, out, 1, 2, False)

        return self.sharded(local, dispatch)
