"""What a context-parallel strategy backend of either framework checks and
reports the same way: its dispatch, one sequence over enough ranks, and the
ranks' load imbalance.

A mixin for lcab.backend.Backend subclasses (jax_backends/cp/base.py,
torch_backends/cp/base.py); the framework says how many ranks it has.
"""

from __future__ import annotations

from lcab.cp.dispatch import DISPATCH_NAMES, cached_dispatch, imbalance
from lcab.workloads import Workload


class Strategy:
    """cp_size ranks, tokens dealt by the dispatch named `dispatch_name`."""

    cp_size: int
    dispatch_name: str

    def set_layout(self, cp_size: int, dispatch: str) -> None:
        if dispatch not in DISPATCH_NAMES:
            raise ValueError(f"dispatch={dispatch!r} is not one of {', '.join(DISPATCH_NAMES)}")
        self.cp_size, self.dispatch_name = cp_size, dispatch

    def layout_problem(self, workload: Workload, ranks: int, unit: str, found: str,
                       exact: bool = False) -> str | None:
        """Why this run cannot shard the workload: `ranks` ranks (`unit`:
        devices, processes; `found`: who counted them) where it needs
        cp_size (exactly, or at least), or not one square sequence."""
        if ranks < self.cp_size or (exact and ranks != self.cp_size):
            return f"cp_size {self.cp_size} needs {self.cp_size} {unit}; {found} {ranks}"
        if workload.seqlen_q != workload.seqlen_k:
            return "context parallelism here shards one sequence: seqlen_q == seqlen_k"
        return None

    def dispatch_or_reason(self, workload: Workload, problem: str | None = None):
        """The workload's dispatch, or why this run cannot shard it: `problem`
        (the layout's, the strategy's) where one is given, else why the
        dispatch cannot be (a str either way)."""
        if problem:
            return problem
        try:
            return self.dispatch(workload)
        except ValueError as exc:
            return str(exc)

    @property
    def dispatch_ranks(self) -> int:
        """How many ranks the dispatch splits tokens over."""
        return self.cp_size

    def dispatch(self, workload: Workload):
        """The tokens of each rank; ValueError says why this dispatch cannot be."""
        return cached_dispatch(self.dispatch_name, workload.mask, self.dispatch_ranks)

    def imbalance(self, workload: Workload, dispatch) -> float:
        """Max over mean of the ranks' exact attention areas."""
        return imbalance(workload.mask, dispatch)

    def case_notes(self, workload: Workload) -> str:
        return f"imbalance={self.imbalance(workload, self.dispatch(workload)):.3f}"
