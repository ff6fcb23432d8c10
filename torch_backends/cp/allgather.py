"""torch.cp_allgather: all-gather K/V over the process group, then the
rank's queries against every key (Llama-3 style), the inner kernel on the
rank's exact share of the mask."""

from __future__ import annotations

import torch.distributed as dist

from lcab.cp import sub_mask, sub_workload
from lcab.workloads import Workload
from torch_backends import distributed
from torch_backends.cp.base import InnerKernelBackend, reorder_tokens, token_index
from torch_backends.device import device_name
from torch_backends.distributed import AllGatherSeq


class AllGatherBackend(InnerKernelBackend):
    name = "torch.cp_allgather"
    strategy = "allgather"
    description = ("all-gather K/V over the process group, then the rank's queries against "
                   "every key (Llama-3 style), any torch kernel inside (inner option)")

    def rank_workloads(self, workload: Workload, dispatch) -> list[Workload]:
        every_key = ((0, workload.seqlen_k),)
        return [sub_workload(workload, sub_mask(workload.mask, ranges, every_key))
                for ranges in dispatch.ranges]

    def strategy_support(self, workload, dispatch):
        return self.inner_support([(f"rank {rank}'s queries", sub) for rank, sub
                                   in enumerate(self.rank_workloads(workload, dispatch))])

    def build(self, workload):
        dispatch = self.dispatch(workload)
        mine = self.rank_workloads(workload, dispatch)[distributed.rank()]
        attend = self.inner_function(mine)
        to_natural = token_index(dispatch, True, device_name())
        group = dist.group.WORLD

        def local(q, k, v):
            k, v = (reorder_tokens(AllGatherSeq.apply(x, group), to_natural) for x in (k, v))
            return attend(q, k, v)

        return self.sharded(local, dispatch)
