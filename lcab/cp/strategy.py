"""What a context-parallel strategy backend of either framework checks and
reports the same way: its dispatch, one sequence over enough ranks, and the
ranks' load imbalance.

A mixin for lcab.backend.Backend subclasses (jax_backends/cp/base.py,
torch_backends/cp/base.py); the framework says how many ranks it has.
"""

from __future__ import annotations

from lcab.cp.dispatch import (
    DISPATCH_NAMES,
    cached_dispatch,
    check_chunks_per_rank,
    imbalance,
    tile_imbalance,
)
from lcab.workloads import Workload


class Strategy:
    """cp_size ranks, tokens dealt by the dispatch named `dispatch_name`."""

    cp_size: int
    dispatch_name: str
    dispatch_chunks: int | None = None

    def set_layout(self, cp_size: int, dispatch: str, chunks: int | None = None) -> None:
        """`chunks`: chunks per rank for a mask-aware dispatch (None: its
        default; finer chunks even ranks' work, and change what moves)."""
        if dispatch not in DISPATCH_NAMES:
            raise ValueError(f"dispatch={dispatch!r} is not one of {', '.join(DISPATCH_NAMES)}")
        if chunks is not None:
            check_chunks_per_rank(dispatch, chunks)
        self.cp_size, self.dispatch_name, self.dispatch_chunks = cp_size, dispatch, chunks

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
        return cached_dispatch(self.dispatch_name, workload.mask, self.dispatch_ranks,
                               self.dispatch_chunks)

    def imbalance(self, workload: Workload, dispatch, *, by_tiles: bool = False) -> float:
        """Max over mean of the ranks' exact attention areas (by_tiles: of
        the 128 x 128 tiles their queries touch, what a block-sparse inner
        kernel's time follows)."""
        return (tile_imbalance if by_tiles else imbalance)(workload.mask, dispatch)

    def case_notes(self, workload: Workload) -> str:
        dispatch = self.dispatch(workload)
        chunks = "" if self.dispatch_chunks is None else f"dispatch_chunks={self.dispatch_chunks}; "
        return (f"{chunks}imbalance={self.imbalance(workload, dispatch):.3f}; "
                f"tile_imbalance={self.imbalance(workload, dispatch, by_tiles=True):.3f}")
