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
from jax_backends.kernels.mask_api import MaskApi, Stated, causal_flag
from lcab.backend import Backend, Support
from lcab.masks import Documents
from lcab.workloads import Workload


def _window(workload: Workload, window: tuple[int, int]) -> Stated:
    how = f"flash_mha(window_size={_shared.window_shape(window)})"
    return Support.yes(how), {"window_size": window}


def _varlen(workload: Workload, documents: Documents) -> Stated:
    how = "flash_mha_varlen(cu_seqlens" + (", is_causal=True)" if documents.causal else ")")
    if workload.batch > 1:
        how += "; batch rows packed into one sequence"
    return Support.yes(how), {"cu_seqlens": documents.cu_seqlens(), "is_causal": documents.causal}


_API = MaskApi(
    "flash_attn3_jax (flash_mha, flash_mha_varlen)",
    "full, causal, sliding windows and packed documents (cu_seqlens)",
    flag=causal_flag("flash_mha(is_causal=True)", "flash_mha"),
    window=_window,
    documents=_varlen,
)


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
    claimed_masks = frozenset({"full", "causal", "sliding_window", "sliding_window_causal",
                               "full_document", "causal_document"})
    no_ring_kernel = ("flash_attn3_jax's public flash_mha and flash_mha_varlen return the "
                      "output only; the log-sum-exp stays inside the package")

    @classmethod
    def environment_problem(cls) -> str | None:
        return _shared.gpu_problem(capability=(9, 0), exact=True)

    def plan(self, workload: Workload) -> Stated:
        return _API.state(workload)

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
