"""What every torch CP strategy shares: options, the process group, dispatch
and, for those that run an LCAB kernel inside, the inner kernel.

A torch CP run is one process per rank (torchrun). Tokens go to ranks by an
lcab.cp dispatch (contiguous, zigzag, balanced, ring_balanced), the same as
the JAX strategies use. A strategy's function takes the global inputs and
returns the rank's rows (torch_backends.distributed.ShardedFunction); the
timed call is the strategy on the rank's shards.

The inner kernel is any torch kernel backend of the registry (`inner`
option, default torch.flex), loaded with the strategy. It must express the
rank's exact share of the mask (its own `supports()` decides), so nothing
quietly runs a different mask; an inner that cannot run here makes the
strategy UNAVAILABLE, naming it.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from lcab import registry
from lcab.backend import Backend, Support
from lcab.cp.strategy import Strategy
from lcab.workloads import Workload
from torch_backends import distributed
from torch_backends.device import device_name
from torch_backends.distributed import ShardedFunction

DEFAULT_INNER = "torch.flex"

Labelled = list[tuple[str, Workload]]  # ("rank 1's queries", its sub-workload)


def inner_kernel_names() -> list[str]:
    return registry.backend_names(framework="torch", suite="kernel")


class TorchCpBackend(Strategy, Backend):
    """Every strategy's checks: the process count, one sequence, the dispatch."""

    framework = "torch"
    suite = "cp"
    layout = "bshd"
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    strategy: ClassVar[str] = ""
    options = {"cp_size": int, "dispatch": str, "dispatch_chunks": int}

    def __init__(self, cp_size: int = 2, dispatch: str = "zigzag",
                 dispatch_chunks: int | None = None):
        self.set_layout(cp_size, dispatch, dispatch_chunks)
        # FlexAttention's GPU kernels failed to lower for 64 tokens per rank
        # (Inductor: "No choices to select", H100, cp 4): the probe gives
        # every rank at least 128.
        self.probe_seqlen = max(type(self).probe_seqlen, 128 * cp_size)

    @classmethod
    def environment_problem(cls) -> str | None:
        if not distributed.launched():
            return ("runs one process per rank under torchrun; `python -m lcab.experiments "
                    "--framework=torch --suite=cp --cp_size=N` starts it")
        return None

    def mask_support(self, workload: Workload) -> Support:
        dispatch = self.dispatch_or_reason(workload, self.layout_problem(
            workload, distributed.world_size(), "processes", "torchrun started", exact=True))
        if isinstance(dispatch, str):
            return Support.no(dispatch)
        return self.strategy_support(workload, dispatch)

    def strategy_support(self, workload: Workload, dispatch) -> Support:
        raise NotImplementedError

    def describe(self, what: str) -> str:
        """The row's notes for a case it runs: strategy, dispatch, then `what` runs inside."""
        return f"{self.strategy}; dispatch={self.dispatch_name}; {what}"

    def sharded(self, local_fn, dispatch) -> ShardedFunction:
        return ShardedFunction(local_fn, dispatch.rank_rows(distributed.rank()),
                               dispatch.order(), device_name())


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
        self.inner_backend: Backend | None = None  # load_dependencies() loads it

    def load_dependencies(self) -> None:
        try:
            self.inner_backend = registry.load_backend(self.inner_name)
        except registry.Unavailable as exc:
            raise registry.Unavailable(
                f"inner kernel {self.inner_name} is unavailable: {exc}") from exc
        problem = self.inner_backend.directions_problem
        if problem:  # a pass the inner lacks on this machine only: so does the strategy
            self.directions = tuple(d for d in self.directions
                                    if d in self.inner_backend.directions)
            self.directions_problem = f"inner kernel {self.inner_name}: {problem}"

    def inner(self) -> tuple[str, dict[str, str]]:
        return self.inner_name, {}  # torch kernels take no options

    def inner_support(self, labelled: Labelled, how: str | None = None) -> Support:
        """The inner kernel's support of every rank's sub-workload (every rank
        must decide alike, or the collectives of the others would wait).
        `how`: what runs, where that is not the inner's own Support.how."""
        inner = self.inner_backend
        directions = set(inner.directions)
        hows = []
        for label, sub in labelled:
            support = inner.supports(sub)
            if not support.ok:
                return Support.no(f"inner kernel {self.inner_name} cannot run {label}: "
                                  f"{support.reason}")
            directions &= set(support.directions or inner.directions)
            hows.append(support.how)
        if how is None:
            how = hows[0] if len(set(hows)) == 1 else " / ".join(sorted(set(hows)))
        kept = tuple(d for d in self.directions if d in directions)
        return Support.yes(self.describe(f"inner {self.inner_name} ({how})"),
                           directions=None if kept == self.directions else kept)

    def inner_function(self, workload: Workload):
        """The inner kernel's f(q, k, v) on (batch, seq, heads, dim) tensors."""
        fn = self.inner_backend.build(workload)
        if self.inner_backend.layout == "bshd":
            return fn
        return lambda q, k, v: fn(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)


def reorder_tokens(x, index):
    """x's sequence axis taken in `index` order (None: as it is)."""
    return x if index is None else x.index_select(1, index)


def token_index(dispatch, to_natural: bool, device):
    """The index that takes rank-major dispatch order to natural order
    (to_natural) or back; None for the contiguous dispatch, which needs neither."""
    order = dispatch.order()
    if (order == range(len(order))).all():
        return None
    index = order.argsort() if to_natural else order
    return torch.as_tensor(index, dtype=torch.long, device=device)
