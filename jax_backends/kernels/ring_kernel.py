"""The form of a kernel inside a context-parallel ring (Backend.ring_kernel).

A ring attends each query block to one K/V block per step, merges the
steps' partial results by log-sum-exp, and in the backward takes each
step's gradients from the rows' final out and lse. A kernel that offers
this form returns a RingKernel from its backend's ring_kernel(); the CP
strategies (jax_backends/cp) call nothing else of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from lcab.masks import AttnMask
from lcab.workloads import Workload


@runtime_checkable
class RingKernel(Protocol):
    # Replaces the inner's Support.how in a ring's notes; None keeps it.
    how: str | None
    # True: one compiled program serves any rank's sub-mask, read from
    # tables passed as a sharded input (all-gather and Ulysses then use it
    # too, instead of building each rank's sub-workload).
    from_tables: bool

    def problem(self, rank_masks: Sequence[AttnMask]) -> str | None:
        """Why one rank's step masks cannot run (None: they can)."""

    def bind(self, masks: Sequence[AttnMask], workload: Workload) -> tuple["RingKernel", Any]:
        """(the kernel for these masks, a pytree describing them with leaves
        stacked on axis 0, one entry per mask)."""

    def attend(self, q, k, v, tables) -> tuple[Any, Any]:
        """(out, lse) of q against this K/V block under one mask's entry of
        the tables; lse is (batch, heads, seqlen_q) float32, natural log,
        -inf where a row sees nothing."""

    def gradients(self, q, k, v, out, lse, dout, tables) -> tuple[Any, Any, Any]:
        """(dq, dk, dv): this K/V block's share, given the rows' final out and lse."""
