"""Float64 NumPy attention: the truth every backend is checked against.

Dense and deliberately plain; use small sizes only. Arrays are
(batch, seq, heads, head_dim); K and V may have fewer heads (GQA), query
head h reading K/V head h // (heads_q // heads_kv).
"""

from __future__ import annotations

import numpy as np

from lcab.masks import AttnMask


def _einsum(subscripts, *operands):
    # optimize=True routes the contractions through BLAS (plain einsum loops).
    return np.einsum(subscripts, *operands, optimize=True)


def _prepare(q, k, v, mask: AttnMask, scale):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4:
        raise ValueError(
            f"expected q (b, sq, hq, d) and k, v (b, sk, hkv, d); got {q.shape=} "
            f"{k.shape=} {v.shape=}"
        )
    batch, seqlen_q, heads_q, head_dim = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    if heads_q % heads_kv:
        raise ValueError(f"{heads_q=} is not a multiple of {heads_kv=}")
    if (mask.seqlen_q, mask.seqlen_k) != (seqlen_q, seqlen_k):
        raise ValueError(
            f"mask is {mask.seqlen_q} x {mask.seqlen_k}, arrays are {seqlen_q} x {seqlen_k}"
        )
    scale = 1.0 / np.sqrt(head_dim) if scale is None else float(scale)
    group = heads_q // heads_kv
    # Repeat K/V heads so every query head has its own: (b, sk, hq, d).
    k = np.repeat(k, group, axis=2)
    v = np.repeat(v, group, axis=2)
    return q, k, v, mask.to_dense(), scale, group


def _probabilities(q, k, visible, scale):
    """Softmax probabilities (b, hq, sq, sk) and lse (b, hq, sq)."""
    scores = _einsum("bqhd,bkhd->bhqk", q, k) * scale
    scores = np.where(visible, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(scores - safe_max)  # exp(-inf) = 0 for hidden keys
    total = weights.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (np.log(total) + safe_max)[..., 0]  # -inf where a row sees nothing
    probs = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    return probs, lse


def attention(q, k, v, mask: AttnMask, scale: float | None = None):
    """(out (b, sq, hq, d), lse (b, hq, sq)) in float64.

    A query row that sees no key gives output 0 and lse -inf.
    """
    q, k, v, visible, scale, _ = _prepare(q, k, v, mask, scale)
    probs, lse = _probabilities(q, k, visible, scale)
    out = _einsum("bhqk,bkhd->bqhd", probs, v)
    return out, lse


def attention_grads(q, k, v, mask: AttnMask, dout, scale: float | None = None):
    """(dq, dk, dv) of sum(attention(q, k, v) * dout), in float64."""
    q, k_full, v_full, visible, scale, group = _prepare(q, k, v, mask, scale)
    dout = np.asarray(dout, dtype=np.float64)
    probs, _ = _probabilities(q, k_full, visible, scale)
    out = _einsum("bhqk,bkhd->bqhd", probs, v_full)
    dv_full = _einsum("bhqk,bqhd->bkhd", probs, dout)
    dprobs = _einsum("bqhd,bkhd->bhqk", dout, v_full)
    row_dot = _einsum("bqhd,bqhd->bhq", dout, out)[..., None]
    dscores = probs * (dprobs - row_dot) * scale
    dq = _einsum("bhqk,bkhd->bqhd", dscores, k_full)
    dk_full = _einsum("bhqk,bqhd->bkhd", dscores, q)
    # Sum the gradients of query heads that shared one K/V head.
    b, sk, hq, d = dk_full.shape
    dk = dk_full.reshape(b, sk, hq // group, group, d).sum(axis=3)
    dv = dv_full.reshape(b, sk, hq // group, group, d).sum(axis=3)
    return dq, dk, dv
