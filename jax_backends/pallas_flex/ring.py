"""jax.pallas_flex as a context-parallel ring's inner kernel.

Every rank and ring step attends its own exact sub-mask from plan tables
that travel as a sharded input, so one compiled program serves every rank
(their plans are stacked to a shared geometry: plan.stack_plans) and an
empty step costs only its empty walk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from jax_backends.pallas_flex import ops
from jax_backends.pallas_flex import plan as plan_lib
from lcab.masks import AttnMask
from lcab.workloads import Workload


class PallasRing:
    """The ring kernel protocol (jax_backends/kernels/ring_kernel.py) over
    per-(rank, step) plan tables."""

    how = None  # the inner's own Support.how describes each step
    from_tables = True

    def __init__(self, forward_blocks: tuple[int, int],
                 backward_blocks: Callable[[Workload], tuple[int, int]], lowering: ops.Lowering,
                 geometries: tuple[plan_lib.Geometry, plan_lib.Geometry] | None = None):
        self.forward_blocks, self.backward_blocks = forward_blocks, backward_blocks
        self.lowering = lowering
        self.geometries = geometries  # (forward, backward), set by bind

    def problem(self, rank_masks: Sequence[AttnMask]) -> str | None:
        return None  # any sub-mask, exactly

    def bind(self, masks: Sequence[AttnMask], workload: Workload):
        """(this kernel for the masks' shared geometry, their (forward,
        backward) tables stacked on axis 0)."""
        backward_blocks = self.backward_blocks(workload)
        forward = [plan_lib.make_plan(m, *self.forward_blocks) for m in masks]
        backward = [plan_lib.make_plan(m, *backward_blocks) for m in masks]
        as_arrays = lambda tree: jax.tree.map(jnp.asarray, tree)  # noqa: E731
        forward_geometry, forward_tables = plan_lib.stack_plans(forward)
        backward_geometry, backward_tables = plan_lib.stack_plans(backward)
        bound = PallasRing(self.forward_blocks, self.backward_blocks, self.lowering,
                           (forward_geometry, backward_geometry))
        return bound, (as_arrays(forward_tables), as_arrays(backward_tables))

    def attend(self, q, k, v, tables):
        (forward_geometry, backward_geometry), (forward_tables, backward_tables) = (
            self.geometries, tables)
        return ops.flex_attention_with_tables(q, k, v, forward_geometry, forward_tables,
                                              backward_geometry, backward_tables, self.lowering)

    def gradients(self, q, k, v, out, lse, dout, tables):
        return ops.block_gradients(q, k, v, out, lse, dout, self.geometries[1], tables[1],
                                   self.lowering)
