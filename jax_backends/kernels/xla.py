"""jax.xla: jax.nn.dot_product_attention(implementation='xla').

The reference-grade XLA path: it materialises the S x S scores, so long
sequences run out of memory (a valid result). Causal is the native
is_causal flag and full needs no mask; every other family is a dense
boolean mask built on the host, allowed up to DENSE_MASK_CELLS.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_backends.kernels.xla_ring import DenseRing
from lcab import expressions
from lcab.backend import Backend, Support
from lcab.masks import MASK_NAMES
from lcab.workloads import Workload


class XlaBackend(Backend):
    name = "jax.xla"
    framework = "jax"
    description = "jax.nn.dot_product_attention, implementation='xla' (dense scores)"
    requires = ("jax",)
    claimed_masks = frozenset(MASK_NAMES)  # any mask, as a dense one up to DENSE_MASK_CELLS

    def mask_support(self, workload: Workload) -> Support:
        native = expressions.flag_path(workload.mask)
        if native:
            return Support.yes(native)
        if not expressions.dense_mask_fits(workload.mask):
            return Support.no(
                f"a dense mask of {workload.seqlen_q} x {workload.seqlen_k} exceeds "
                f"{expressions.DENSE_MASK_CELLS} cells"
            )
        return Support.yes("dense boolean mask")

    def build(self, workload: Workload):
        native = expressions.flag_path(workload.mask)
        if native:
            kwargs = {"is_causal": native == "is_causal"}
        else:
            dense = workload.mask.to_dense(max_elements=expressions.DENSE_MASK_CELLS)
            kwargs = {"mask": jnp.asarray(dense)[None, None]}

        def attend(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, implementation="xla", **kwargs)

        return attend

    def ring_kernel(self) -> DenseRing:
        return DenseRing()
