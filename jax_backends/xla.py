"""jax.xla: jax.nn.dot_product_attention(implementation='xla').

The reference-grade XLA path: it materialises the S x S scores, so long
sequences run out of memory (a valid result). Causal is the native
is_causal flag and full needs no mask; every other family is a dense
boolean mask built on the host, allowed up to DENSE_MASK_CELLS.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lcab import expressions
from lcab.backend import Backend, Support
from lcab.workloads import Workload


class XlaBackend(Backend):
    name = "jax.xla"
    framework = "jax"
    description = "jax.nn.dot_product_attention, implementation='xla' (dense scores)"
    requires = ("jax",)

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
            causal = native == "is_causal"

            def attend(q, k, v):
                return jax.nn.dot_product_attention(
                    q, k, v, is_causal=causal, implementation="xla"
                )

            return attend
        dense = jnp.asarray(workload.mask.to_dense(max_elements=expressions.DENSE_MASK_CELLS))

        def attend_masked(q, k, v):
            return jax.nn.dot_product_attention(
                q, k, v, mask=dense[None, None], implementation="xla"
            )

        return attend_masked
