"""PyTorch context parallelism, one process per rank (torchrun).

The strategies that run an LCAB kernel inside, on any mask:
`torch.cp_ulysses` (yunchang's all_to_all from sequence- to head-sharded,
the inner kernel over the whole sequence, and back) and `torch.cp_allgather`
(all-gather K/V, then the rank's queries against every key, Llama-3 style).
The inner kernel is any torch kernel backend (`inner` option, default
torch.flex); it must express the rank's exact share of the mask (its own
`supports()` decides), so nothing quietly runs a different mask.

Tokens go to ranks by an lcab.cp dispatch (contiguous, zigzag, balanced),
the same as the JAX strategies use. The function takes the global inputs
and returns the rank's rows (torch_backends.distributed.ShardedFunction);
the timed call is the strategy on the rank's shards.

Library strategies that compute only some masks (yunchang's ring and USP,
ring-flash-attn, torch's native CP) live in torch_backends/cp_libraries.py.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import torch
import torch.distributed as dist

from lcab import registry
from lcab.backend import Backend, Support
from lcab.cp import DISPATCH_NAMES, imbalance, make_dispatch, sub_mask
from lcab.workloads import Workload
from torch_backends import distributed
from torch_backends.distributed import AllGatherSeq, ShardedFunction

DEFAULT_INNER = "torch.flex"


@functools.lru_cache(maxsize=16)
def _cached_dispatch(name: str, mask, ranks: int):
    # supports(), case_notes() and build() of one case all ask.
    return make_dispatch(name, mask, ranks)


def inner_kernel_names() -> list[str]:
    return registry.backend_names(framework="torch", suite="kernel")


class TorchCpBackend(Backend):
    """Shared by the torch strategies: options, the process group, dispatch."""

    framework = "torch"
    suite = "cp"
    layout = "bshd"
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    strategy: ClassVar[str] = ""
    options = {"cp_size": int, "dispatch": str}

    def __init__(self, cp_size: int = 2, dispatch: str = "zigzag"):
        if dispatch not in DISPATCH_NAMES:
            raise ValueError(f"dispatch={dispatch!r} is not one of {', '.join(DISPATCH_NAMES)}")
        self.cp_size, self.dispatch_name = cp_size, dispatch

    @classmethod
    def environment_problem(cls) -> str | None:
        if not distributed.launched():
            return ("runs one process per rank under torchrun; `python -m lcab.experiments "
                    "--framework=torch --suite=cp --cp_size=N` starts it")
        return None

    def mask_support(self, workload: Workload) -> Support:
        ranks = distributed.world_size()
        if ranks != self.cp_size:
            return Support.no(f"cp_size {self.cp_size} needs {self.cp_size} processes; "
                              f"torchrun started {ranks}")
        if workload.seqlen_q != workload.seqlen_k:
            return Support.no("context parallelism here shards one sequence: seqlen_q == seqlen_k")
        try:
            dispatch = self.dispatch(workload)
        except ValueError as exc:
            return Support.no(str(exc))
        return self.strategy_support(workload, dispatch)

    def dispatch(self, workload: Workload):
        return _cached_dispatch(self.dispatch_name, workload.mask, self.cp_size)

    def case_notes(self, workload: Workload) -> str:
        return f"imbalance={self.imbalance(workload, self.dispatch(workload)):.3f}"

    def imbalance(self, workload: Workload, dispatch) -> float:
        """Max over mean of the ranks' exact attention areas."""
        return imbalance(workload.mask, dispatch)

    def strategy_support(self, workload: Workload, dispatch) -> Support:
        raise NotImplementedError

    def sharded(self, local_fn, dispatch) -> ShardedFunction:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return ShardedFunction(local_fn, dispatch.rank_rows(distributed.rank()),
                               dispatch.order(), device)


class InnerKernelBackend(TorchCpBackend):
    """A strategy with an LCAB torch kernel backend inside."""

    options = {**TorchCpBackend.options, "inner": str}

    def __init__(self, inner: str = DEFAULT_INNER, **options):
        super().__init__(**options)
        names = inner_kernel_names()
        if inner not in names:
            raise ValueError(f"inner={inner!r} is not a torch kernel backend; choose one of "
                             f"{', '.join(names)}")
        self.inner_name = inner

    @functools.cached_property
    def inner(self) -> Backend | str:
        """The inner kernel backend, or why it cannot run here."""
        try:
            return registry.load_backend(self.inner_name)
        except registry.Unavailable as exc:
            return str(exc)

    def inner_support(self, workloads: list[Workload], what: str) -> Support:
        """The inner kernel's support of every rank's sub-workload (every rank
        must decide alike, or the collectives of the others would wait)."""
        if isinstance(self.inner, str):
            return Support.no(f"inner kernel {self.inner_name} is unavailable: {self.inner}")
        directions = set(self.inner.directions)
        hows = []
        for rank, sub in enumerate(workloads):
            support = self.inner.supports(sub)
            if not support.ok:
                return Support.no(f"inner kernel {self.inner_name} cannot run rank {rank}'s "
                                  f"{what}: {support.reason}")
            directions &= set(support.directions or self.inner.directions)
            hows.append(support.how)
        how = hows[0] if len(set(hows)) == 1 else " / ".join(sorted(set(hows)))
        kept = tuple(d for d in self.directions if d in directions)
        return Support.yes(f"{self.strategy}; dispatch={self.dispatch_name}; "
                           f"inner {self.inner_name} ({how})",
                           directions=None if kept == self.directions else kept)

    def inner_function(self, workload: Workload):
        """The inner kernel's f(q, k, v) on (batch, seq, heads, dim) tensors."""
        fn = self.inner.build(workload)
        if self.inner.layout == "bshd":
            return fn
        return lambda q, k, v: fn(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)


def _natural_order(x, positions):
    """Tokens of the sequence axis put back in natural order (None: already)."""
    return x if positions is None else x.index_select(1, positions)


def _positions(dispatch, inverse: bool, device):
    """Index tensor that reorders rank-major dispatch order to natural order
    (inverse) or back; None for the contiguous dispatch, which needs neither."""
    order = dispatch.order()
    if (order == range(len(order))).all():
        return None
    index = order.argsort() if inverse else order
    return torch.as_tensor(index, dtype=torch.long, device=device)


class UlyssesBackend(InnerKernelBackend):
    name = "torch.cp_ulysses"
    strategy = "ulysses"
    requires = ("torch", "yunchang")
    description = ("Ulysses with yunchang's all_to_all (sequence- to head-sharded and back), "
                   "any torch kernel inside (inner option)")

    def probe_heads_kv(self, workload):
        return min(workload.heads_kv, self.cp_size)  # fewer would not split

    def imbalance(self, workload, dispatch) -> float:
        return 1.0  # every rank attends the whole sequence for its share of the heads

    def head_workload(self, workload: Workload) -> Workload:
        cp = self.cp_size
        return Workload(workload.batch, workload.seqlen_q, workload.seqlen_k,
                        workload.heads_q // cp, workload.heads_kv // cp, workload.head_dim,
                        workload.dtype, workload.mask)

    def strategy_support(self, workload, dispatch):
        for what, heads in (("query", workload.heads_q), ("kv", workload.heads_kv)):
            if heads % self.cp_size:
                return Support.no(f"Ulysses splits heads over cp_size: {heads} {what} heads do "
                                  f"not divide by cp_size {self.cp_size}")
        return self.inner_support([self.head_workload(workload)], "heads")

    def build(self, workload):
        from yunchang.comm.all_to_all import SeqAllToAll4D

        dispatch = self.dispatch(workload)
        attend = self.inner_function(self.head_workload(workload))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        to_natural = _positions(dispatch, True, device)
        to_dispatch = _positions(dispatch, False, device)
        group = dist.group.WORLD

        def local(q, k, v):
            # (b, S/cp, h, d) -> (b, S, h/cp, d): ranks' tokens, rank-major;
            # a contiguous block of heads keeps each query head with its K/V head.
            q, k, v = (_natural_order(SeqAllToAll4D.apply(group, x, 2, 1, False), to_natural)
                       for x in (q, k, v))
            out = _natural_order(attend(q, k, v), to_dispatch)
            return SeqAllToAll4D.apply(group, out, 1, 2, False)

        return self.sharded(local, dispatch)


class AllGatherBackend(InnerKernelBackend):
    name = "torch.cp_allgather"
    strategy = "allgather"
    description = ("all-gather K/V over the process group, then the rank's queries against "
                   "every key (Llama-3 style), any torch kernel inside (inner option)")

    def rank_workloads(self, workload: Workload, dispatch) -> list[Workload]:
        every_key = ((0, workload.seqlen_k),)
        rows = workload.seqlen_q // self.cp_size
        return [Workload(workload.batch, rows, workload.seqlen_k, workload.heads_q,
                         workload.heads_kv, workload.head_dim, workload.dtype,
                         sub_mask(workload.mask, ranges, every_key))
                for ranges in dispatch.ranges]

    def strategy_support(self, workload, dispatch):
        return self.inner_support(self.rank_workloads(workload, dispatch), "queries")

    def build(self, workload):
        dispatch = self.dispatch(workload)
        mine = self.rank_workloads(workload, dispatch)[distributed.rank()]
        attend = self.inner_function(mine)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        to_natural = _positions(dispatch, True, device)
        group = dist.group.WORLD

        def local(q, k, v):
            k, v = (_natural_order(AllGatherSeq.apply(x, group), to_natural) for x in (k, v))
            return attend(q, k, v)

        return self.sharded(local, dispatch)
