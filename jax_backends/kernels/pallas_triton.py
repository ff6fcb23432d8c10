"""jax.pallas_triton: the Triton-lowered Pallas flash attention shipped in JAX.

jax.experimental.pallas.ops.gpu.attention.mha, forward and its own fused
backward (a custom VJP). It states causal with causal=True and packed
documents with segment_ids (one id per token, shared by queries and keys),
optionally with causal=True inside them; its causal mask is aligned top-left,
which equals LCAB's for the square masks it is given. It has no GQA: K and V
heads are repeated inside the function (the repeat is part of the timed
work, as it would be for a user). Sequences must split into its 128-token
blocks. On a CPU it runs in Pallas interpret mode, so the tests check it
against the float64 reference without a GPU; on a GPU it runs compiled.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np

from jax_backends import _shared
from jax_backends.kernels.mask_api import MaskApi, Stated, causal_flag
from lcab import expressions
from lcab.backend import Backend, Support
from lcab.masks import Documents
from lcab.workloads import Workload

BLOCK = 128  # block_q = block_k of the forward kernel
_BACKWARD_BLOCK = 32  # block_q_dkv = block_kv_dkv = block_q_dq = block_kv_dq
_FLOAT32_MAX_HEAD_DIM = 64  # float32 tiles at 128 overflow shared memory (H200)


def _attention_module():
    # jax >= 0.11 warns that this module is deprecated in favour of tokamax;
    # it is still the kernel this backend measures.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.experimental.pallas.ops.gpu import attention
    return attention


def _segment_ids(workload: Workload, documents: Documents) -> Stated:
    how = "segment_ids; causal=True" if documents.causal else "segment_ids"
    return Support.yes(how), {"causal": documents.causal,
                              "segment_ids": expressions.document_ids(documents)}


_API = MaskApi(
    "pallas.ops.gpu.attention.mha",
    "full, causal and packed documents (segment_ids, optionally causal)",
    flag=causal_flag("causal=True", keyword="causal"),
    documents=_segment_ids,
)


class PallasTritonBackend(Backend):
    name = "jax.pallas_triton"
    framework = "jax"
    description = "jax.experimental.pallas.ops.gpu.attention.mha (Pallas, Triton lowering)"
    dtypes = ("bfloat16", "float16", "float32")
    # Checked against the reference (JAX's own tests run 32, 64, 72 and 128).
    # The kernel pads head_dim to a power of two; at 256 it asks an H200 for
    # 328192 bytes of shared memory (232448 available).
    head_dims = (16, 32, 64, 72, 128)
    requires = ("jax", "jax.experimental.pallas")
    probe_seqlen = 2 * BLOCK
    claimed_masks = frozenset({"full", "causal", "full_document", "causal_document"})

    @classmethod
    def environment_problem(cls) -> str | None:
        return _shared.pallas_platform_problem()

    def supports(self, workload: Workload) -> Support:
        if workload.dtype == "float32" and workload.head_dim > _FLOAT32_MAX_HEAD_DIM:
            return Support.no(
                f"float32 at head_dim {workload.head_dim} > {_FLOAT32_MAX_HEAD_DIM} needs more "
                f"shared memory than a Hopper GPU has (at 128 it asked an H200 for 262656 "
                f"bytes, 232448 available)"
            )
        return super().supports(workload)

    def plan(self, workload: Workload) -> Stated:
        ragged = _shared.multiple_problem(workload, BLOCK, "the kernel's block size")
        if ragged:
            return ragged, {}
        support, kwargs = _API.state(workload)
        if not support.ok:
            return support, {}
        notes = [support.how]
        if workload.gqa_ratio > 1:
            notes.append("K/V heads repeated")
        notes.append("interpret mode" if _shared.interpret_mode() else "compiled")
        return Support.yes("; ".join(notes)), kwargs

    def build(self, workload: Workload):
        call = self.planned_kwargs(workload)
        attention = _attention_module()
        segment_ids = call.get("segment_ids")
        if segment_ids is not None:
            # One row of ids per batch row: the kernel indexes them by batch.
            segment_ids = jnp.asarray(np.tile(segment_ids, (workload.batch, 1)))
        group = workload.gqa_ratio
        options = {
            "sm_scale": float(1.0 / np.sqrt(workload.head_dim)),  # mha's default is 1.0
            "causal": call["causal"],
            "block_sizes": attention.BlockSizes(
                block_q=BLOCK, block_k=BLOCK,
                block_q_dkv=_BACKWARD_BLOCK, block_kv_dkv=_BACKWARD_BLOCK,
                block_q_dq=_BACKWARD_BLOCK, block_kv_dq=_BACKWARD_BLOCK,
            ),
            "interpret": _shared.interpret_mode(),
        }

        def attend(q, k, v):
            if group > 1:
                k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
            return attention.mha(q, k, v, segment_ids, **options)

        return attend
