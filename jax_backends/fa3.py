"""jax.fa3: FlashAttention-3 through the flash_attn3_jax wheel (XLA FFI).

flash_mha states full, causal (is_causal) and both sliding windows
(window_size=(w, 0) and (w, w), FlashAttention's own convention, which
LCAB's windows follow). Packed documents go through flash_mha_varlen with
cu_seqlens: the (batch, seq, heads, dim) inputs are viewed as one packed
(batch * seq, heads, dim) sequence, every batch row's documents offset by
its start, which is exact because rows never see each other. GQA is native.
The published wheel is built for sm90 and head_dim 128 only.

Known upstream fault (flash_attn3_jax 0.2.3, jax 0.11.2, H200): flash_mha's
backward without causal or a window (the full mask) returns garbage
gradients, different from call to call; causal, windowed and varlen
backwards are right. The full mask is still stated through flash_mha, as a
user would, so its backward row is a MISMATCH rather than a number.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jax_backends import _shared
from lcab import expressions
from lcab.backend import Backend, Support
from lcab.workloads import Workload

_API = "flash_attn3_jax (flash_mha, flash_mha_varlen)"
_EXPRESSES = "full, causal, sliding windows and packed documents (cu_seqlens)"


def _call(workload: Workload) -> tuple[Support, dict]:
    """How the mask is stated to FA3, and the keyword arguments that state it."""
    causal = expressions.causal_flag(workload.mask)
    if causal is not None:
        how = "flash_mha(is_causal=True)" if causal else "flash_mha"
        return Support.yes(how), {"is_causal": causal}
    window = expressions.sliding_window(workload.mask)
    if window is not None:
        how = f"flash_mha(window_size={_shared.window_shape(window)})"
        return Support.yes(how), {"window_size": window}
    documents = expressions.cu_seqlens(workload.mask)
    if documents is not None:
        cu_seqlens, causal = documents
        how = "flash_mha_varlen(cu_seqlens" + (", is_causal=True)" if causal else ")")
        if workload.batch > 1:
            how += "; batch rows packed into one sequence"
        return Support.yes(how), {"cu_seqlens": cu_seqlens, "is_causal": causal}
    return _shared.not_expressible(workload, _API, _EXPRESSES), {}


def packed_cu_seqlens(cu_seqlens: np.ndarray, batch: int, seqlen: int) -> np.ndarray:
    """The documents of every batch row, back to back in one packed sequence."""
    starts = [cu_seqlens[:-1] + row * seqlen for row in range(batch)]
    return np.concatenate([*starts, [batch * seqlen]]).astype(np.int32)


class Fa3Backend(Backend):
    name = "jax.fa3"
    framework = "jax"
    description = "FlashAttention-3 for JAX (flash_attn3_jax: flash_mha, flash_mha_varlen)"
    dtypes = ("bfloat16", "float16")
    head_dims = (128,)  # the only head_dim the published wheel is built for
    requires = ("flash_attn3_jax",)

    @classmethod
    def environment_problem(cls) -> str | None:
        return _shared.gpu_problem(capability=(9, 0), exact=True)

    def plan(self, workload: Workload) -> tuple[Support, dict]:
        return _call(workload)

    def build(self, workload: Workload):
        import flash_attn3_jax

        kwargs = self.planned_kwargs(workload)
        scale = 1.0 / math.sqrt(workload.head_dim)  # must be a Python float
        if "cu_seqlens" not in kwargs:

            def attend(q, k, v):
                return flash_attn3_jax.flash_mha(q, k, v, softmax_scale=scale, **kwargs)

            return attend

        documents = kwargs["cu_seqlens"]
        cu_seqlens = jnp.asarray(packed_cu_seqlens(documents, workload.batch, workload.seqlen_q))
        longest = int(np.max(np.diff(documents)))  # sizes the kernel's grid
        is_causal = kwargs["is_causal"]

        def attend_packed(q, k, v):
            batch, seqlen = q.shape[:2]
            out = flash_attn3_jax.flash_mha_varlen(
                q.reshape(batch * seqlen, *q.shape[2:]),
                k.reshape(batch * seqlen, *k.shape[2:]),
                v.reshape(batch * seqlen, *v.shape[2:]),
                cu_seqlens,
                max_seqlen_q=longest,
                max_seqlen_k=longest,
                softmax_scale=scale,
                is_causal=is_causal,
            )
            return out.reshape(q.shape)

        return attend_packed
