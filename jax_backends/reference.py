"""The full-size check's float32 reference (lcab.fullcheck), in plain XLA.

It shares no code with any kernel: per chunk of query rows, scores, a
softmax and a weighted sum, the mask applied from the mask's slices as
lcab.masks.slices defines them, and gradients by autodiff of that chunk.
A few chunks can be run alone (`chunks`): their out, and dQ by each chunk's
vjp w.r.t. its own rows (the check's sampled rows, lcab.fullcheck).
Deliberately plain; a chunk bounds its memory, nothing makes it fast.
Arrays are (batch, seq, heads, head_dim) with GQA: query head h reads K/V
head h // (heads_q // heads_kv).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_backends import distributed, kept

from lcab.masks.slices import CAUSAL, FULL, INV_CAUSAL

_HIGHEST = lax.Precision.HIGHEST


def visible(slices, row0, rows: int, seqlen_k: int):
    """(rows, seqlen_k) booleans: which keys rows [row0, row0 + rows) see.

    Slice i covers rows [q0, q1) and keys [k0, k1); its row r (from q0) sees
    its column c (from k0) always (full), when c <= r + (n - m) (causal,
    bottom-right aligned), when c >= r (inv_causal), or both (bi_causal).
    """
    r = row0 + jnp.arange(rows)[:, None]
    c = jnp.arange(seqlen_k)[None, :]

    def add(i, seen):
        q0, q1, k0, k1, kind = (slices[i, j] for j in range(5))
        m, n = q1 - q0, k1 - k0
        row, col = r - q0, c - k0
        inside = (row >= 0) & (row < m) & (col >= 0) & (col < n)
        up_to_diagonal = col <= row + (n - m)
        from_row = col >= row
        allowed = jnp.where(kind == FULL, True,
                            jnp.where(kind == CAUSAL, up_to_diagonal,
                                      jnp.where(kind == INV_CAUSAL, from_row,
                                                up_to_diagonal & from_row)))
        return seen | (inside & allowed)

    return lax.fori_loop(0, slices.shape[0], add, jnp.zeros((rows, seqlen_k), dtype=bool))


def chunk_attention(q, k, v, seen):
    """softmax(q k^T / sqrt(d), over the seen keys) v for one chunk of rows;
    a row that sees no key gives 0."""
    batch, rows, heads_q, head_dim = q.shape
    heads_kv = k.shape[2]
    grouped = q.reshape(batch, rows, heads_kv, heads_q // heads_kv, head_dim)
    scores = jnp.einsum("brhgd,bkhd->bhgrk", grouped, k, precision=_HIGHEST)
    scores = jnp.where(seen, scores / math.sqrt(head_dim), -jnp.inf)
    top = lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    weights = jnp.exp(scores - jnp.where(jnp.isfinite(top), top, 0.0))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    probs = weights / jnp.where(total > 0, total, 1.0)
    out = jnp.einsum("bhgrk,bkhd->brhgd", probs, v, precision=_HIGHEST)
    return out.reshape(batch, rows, heads_q, head_dim)


def attention(q, k, v, dout, chunk_slices, rows: int, backward: bool, chunks=None):
    """(out,) or (out, dq, dk, dv) in float32, chunk by chunk of `rows` query
    rows; chunk_slices is lcab.fullcheck's (n_chunks, n_max, 5) table.

    With `chunks` (ascending chunk indices), q and dout hold only the rows
    of those chunks, one after the other (only the last may be short), and
    chunk_slices their slices, one entry per chunk; the result is (out,) or
    (out, dq) of those rows: dK and dV need every row, so none is made.
    """
    chunk_slices = jnp.asarray(chunk_slices)
    key_grads = backward and chunks is None
    if chunks is None:
        chunks = np.arange(chunk_slices.shape[0])
    return _attention(q, k, v, dout, chunk_slices, jnp.asarray(chunks, dtype=jnp.int32),
                      rows=rows, backward=backward, key_grads=key_grads)


# XLA's GEMM autotuning took 14-17 s of each compile on an H100 (1 s
# without), for a function run once per workload whose speed does not matter.
@functools.partial(jax.jit, static_argnames=("rows", "backward", "key_grads"),
                   compiler_options={"xla_gpu_autotune_level": 0})
def _attention(q, k, v, dout, chunk_slices, chunk_index, *, rows: int, backward: bool,
               key_grads: bool):
    q, k, v, dout = (x.astype(jnp.float32) for x in (q, k, v, dout))
    batch, given_rows, heads_q, head_dim = q.shape
    n_chunks = chunk_slices.shape[0]
    padding = ((0, 0), (0, n_chunks * rows - given_rows), (0, 0), (0, 0))

    def chunked(x):
        x = jnp.pad(x, padding).reshape(batch, n_chunks, rows, heads_q, head_dim)
        return jnp.swapaxes(x, 0, 1)

    def step(sums, chunk):
        q_chunk, dout_chunk, slices, index = chunk
        seen = visible(slices, index * rows, rows, k.shape[1])
        if not backward:
            return sums, (chunk_attention(q_chunk, k, v, seen),)
        if not key_grads:  # the chunk's own vjp w.r.t. its rows alone
            out, pullback = jax.vjp(lambda q_: chunk_attention(q_, k, v, seen), q_chunk)
            return sums, (out, *pullback(dout_chunk))
        out, pullback = jax.vjp(lambda q_, k_, v_: chunk_attention(q_, k_, v_, seen),
                                q_chunk, k, v)
        dq, dk, dv = pullback(dout_chunk)
        return (sums[0] + dk, sums[1] + dv), (out, dq)

    sums = (jnp.zeros_like(k), jnp.zeros_like(v)) if key_grads else ()
    sums, per_chunk = lax.scan(step, sums, (chunked(q), chunked(dout), chunk_slices,
                                            chunk_index))

    def unchunked(x):
        return jnp.swapaxes(x, 0, 1).reshape(batch, n_chunks * rows, heads_q, head_dim)[
            :, :given_rows]

    return (*(unchunked(x) for x in per_chunk), *sums)


def pick(x, selection, kv: bool):
    """The checked batch rows and heads of one (b, s, h, d) array; `kv`: its
    heads are K/V heads."""
    return kept.call(_pick, x, batch_rows=selection.batch_rows,
                     heads=selection.kv_heads if kv else selection.q_heads)


def pick_rows(x, rows):
    """Query rows `rows` (ascending indices) of one (b, s, h, d) array, every
    batch row and head."""
    return kept.call(_pick_rows, x, jnp.asarray(rows))


def _pick(x, batch_rows, heads):
    x = jnp.take(x, jnp.asarray(batch_rows), axis=0)
    return jnp.take(x, jnp.asarray(heads), axis=2)


def _pick_rows(x, rows):
    return jnp.take(x, rows, axis=1)


def normalised_error(got, want) -> float:
    """max |got - want| / max |want|, infinite where got is not finite."""
    return float(np.asarray(distributed.to_host(kept.call(_normalised_error, got, want))))


def _normalised_error(got, want):
    got = got.astype(jnp.float32)
    scale = jnp.maximum(jnp.max(jnp.abs(want)), 1e-6)
    error = jnp.max(jnp.abs(got - want)) / scale
    return jnp.where(jnp.all(jnp.isfinite(got)), error, jnp.inf)
