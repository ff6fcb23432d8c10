"""jax.xla's ring kernel: dense boolean masks and XLA einsums, float32 inside.

Each rank holds one (S/cp)^2 boolean mask per ring step, passed as a
sharded input; steps that see nothing are computed too. GQA reads each
query head's K/V head in place: nothing is repeated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from lcab import expressions
from lcab.masks import AttnMask
from lcab.workloads import Workload


class DenseRing:
    """The RingKernel (ring_kernel.py) of jax.xla."""

    how = ("dense boolean mask per rank and step (O(S^2/cp^2) memory a step), out and lse "
           "from XLA einsums in float32; GQA unrepeated")
    from_tables = False

    def problem(self, rank_masks: Sequence[AttnMask]) -> str | None:
        cells = sum(mask.seqlen_q * mask.seqlen_k for mask in rank_masks)
        if cells <= expressions.DENSE_MASK_CELLS:
            return None
        first = rank_masks[0]
        return (f"the dense ring kernel of inner jax.xla holds {len(rank_masks)} step masks of "
                f"{first.seqlen_q} x {first.seqlen_k} per rank, over "
                f"{expressions.DENSE_MASK_CELLS} cells")

    def bind(self, masks: Sequence[AttnMask], workload: Workload):
        return self, np.stack([mask.to_dense(expressions.DENSE_MASK_CELLS) for mask in masks])

    def attend(self, q, k, v, visible):
        return dense_attention(q, k, v, visible)

    def gradients(self, q, k, v, out, lse, dout, visible):
        return dense_block_gradients(q, k, v, out, lse, dout, visible)


def _grouped(q, kv_heads):
    """(b, s, h, d) -> (b, s, kv_heads, group, d): query head h reads K/V head
    h // group, so nothing is repeated."""
    b, s, h, d = q.shape
    return q.reshape(b, s, kv_heads, h // kv_heads, d)


def _scores(q, k, visible):
    """Masked, scaled float32 scores (b, kv_heads, group, sq, sk)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", _grouped(q, k.shape[2]), k,
                        preferred_element_type=jnp.float32) * scale
    return jnp.where(visible, scores, -jnp.inf)


def dense_attention(q, k, v, visible):
    """(out, lse) of attention under a dense (sq, sk) boolean mask.

    lse is (b, heads, sq) float32, natural log; a row that sees nothing
    gives out 0 and lse -inf (pallas_flex's and lcab.reference's convention).
    """
    b, sq, h, d = q.shape
    scores = _scores(q, k, visible)
    peak = scores.max(axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    weights = jnp.exp(scores - peak)
    total = weights.sum(axis=-1, keepdims=True)
    lse = jnp.where(total > 0, jnp.log(jnp.where(total > 0, total, 1.0)) + peak, -jnp.inf)
    probs = weights / jnp.where(total > 0, total, 1.0)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs.astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    return out.reshape(b, sq, h, d).astype(q.dtype), lse[..., 0].reshape(b, h, sq)


def dense_block_gradients(q, k, v, out, lse, dout, visible):
    """float32 dq, dk, dv of attention of q against this K/V block, where out
    and lse are the rows' final values over all their keys (a ring's step)."""
    b, sq, h, d = q.shape
    kv_heads = k.shape[2]
    scale = 1.0 / math.sqrt(d)
    lse = lse.reshape(b, kv_heads, h // kv_heads, sq)[..., None]
    probs = jnp.exp(_scores(q, k, visible) - jnp.where(jnp.isfinite(lse), lse, 0.0))
    dout_g = _grouped(dout, kv_heads).astype(jnp.float32)
    delta = jnp.einsum("bqhgd,bqhgd->bhgq", dout_g,
                       _grouped(out, kv_heads).astype(jnp.float32))[..., None]
    dv = jnp.einsum("bhgqk,bqhgd->bkhd", probs, dout_g)
    dprobs = jnp.einsum("bqhgd,bkhd->bhgqk", dout_g, v.astype(jnp.float32))
    dscores = probs * (dprobs - delta) * scale
    dq = jnp.einsum("bhgqk,bkhd->bqhgd", dscores, k.astype(jnp.float32)).reshape(b, sq, h, d)
    dk = jnp.einsum("bhgqk,bqhgd->bkhd", dscores, _grouped(q, kv_heads).astype(jnp.float32))
    return dq, dk, dv
