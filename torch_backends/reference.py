"""The full-size check's float32 reference (lcab.fullcheck), in plain torch ops.

It shares no code with any kernel: per chunk of query rows, scores, a
softmax and a weighted sum, the mask applied from the mask's slices as
lcab.masks.slices defines them, and gradients by autograd of that chunk
(dK and dV add up over the chunks). A few chunks can be run alone
(`chunks`): their out, and dQ by autograd w.r.t. each chunk's own rows (the
check's sampled rows, lcab.fullcheck). Deliberately plain; a chunk bounds
its memory, nothing makes it fast. Arrays are (batch, seq, heads, head_dim)
with GQA: query head h reads K/V head h // (heads_q // heads_kv).
"""

from __future__ import annotations

import math

import torch

from lcab.masks.slices import CAUSAL, FULL, INV_CAUSAL


def visible(slices, row0: int, rows: int, seqlen_k: int, device) -> torch.Tensor:
    """(rows, seqlen_k) booleans: which keys rows [row0, row0 + rows) see.

    Slice (q0, q1, k0, k1, kind) covers rows [q0, q1) and keys [k0, k1); its
    row r (from q0) sees its column c (from k0) always (full), when
    c <= r + (n - m) (causal, bottom-right aligned), when c >= r
    (inv_causal), or both (bi_causal).
    """
    r = torch.arange(row0, row0 + rows, device=device)[:, None]
    c = torch.arange(seqlen_k, device=device)[None, :]
    seen = torch.zeros((rows, seqlen_k), dtype=torch.bool, device=device)
    for q0, q1, k0, k1, kind in slices.tolist():
        if q1 <= q0:
            continue  # padding
        m, n = q1 - q0, k1 - k0
        row, col = r - q0, c - k0
        inside = (row >= 0) & (row < m) & (col >= 0) & (col < n)
        up_to_diagonal = col <= row + (n - m)
        from_row = col >= row
        if kind == FULL:
            allowed = inside
        elif kind == CAUSAL:
            allowed = inside & up_to_diagonal
        elif kind == INV_CAUSAL:
            allowed = inside & from_row
        else:
            allowed = inside & up_to_diagonal & from_row
        seen |= allowed
    return seen


def chunk_attention(q, k, v, seen):
    """softmax(q k^T / sqrt(d), over the seen keys) v for one chunk of rows;
    a row that sees no key gives 0."""
    batch, rows, heads_q, head_dim = q.shape
    heads_kv = k.shape[2]
    grouped = q.reshape(batch, rows, heads_kv, heads_q // heads_kv, head_dim)
    scores = torch.einsum("brhgd,bkhd->bhgrk", grouped, k) / math.sqrt(head_dim)
    scores = scores.masked_fill(~seen, float("-inf"))
    top = scores.detach().amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(scores - top)
    total = weights.sum(dim=-1, keepdim=True)
    probs = weights / torch.where(total > 0, total, torch.ones_like(total))
    out = torch.einsum("bhgrk,bkhd->brhgd", probs, v)
    return out.reshape(batch, rows, heads_q, head_dim)


def attention(q, k, v, dout, chunk_slices, rows: int, backward: bool, chunks=None):
    """(out,) or (out, dq, dk, dv) in float32, chunk by chunk of `rows` query rows.

    With `chunks` (ascending chunk indices), q and dout hold only the rows
    of those chunks, one after the other (only the last may be short), and
    chunk_slices their slices, one entry per chunk; the result is (out,) or
    (out, dq) of those rows: dK and dV need every row, so none is made.
    """
    q, k, v, dout = (x.detach().to(torch.float32) for x in (q, k, v, dout))
    given_rows, seqlen_k = q.shape[1], k.shape[1]
    key_grads = backward and chunks is None
    if chunks is None:
        chunks = range(len(chunk_slices))
    outs, dqs = [], []
    if key_grads:
        k.requires_grad_(True)
        v.requires_grad_(True)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products, not TF32
    try:
        for position, (index, slices) in enumerate(zip(chunks, chunk_slices)):
            start = position * rows  # in the given rows
            stop = min(start + rows, given_rows)
            seen = visible(slices, int(index) * rows, stop - start, seqlen_k, q.device)
            q_chunk = q[:, start:stop].clone().requires_grad_(backward)
            with torch.set_grad_enabled(backward):
                out = chunk_attention(q_chunk, k, v, seen)
            if backward:  # k and v are leaves only when their gradients are asked for
                out.backward(dout[:, start:stop])
                dqs.append(q_chunk.grad)
            outs.append(out.detach())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    if not backward:
        return (torch.cat(outs, dim=1),)
    if not key_grads:
        return torch.cat(outs, dim=1), torch.cat(dqs, dim=1)
    return torch.cat(outs, dim=1), torch.cat(dqs, dim=1), k.grad, v.grad


def pick(x, selection, kv: bool):
    """The checked batch rows and heads of one (b, s, h, d) tensor; `kv`: its
    heads are K/V heads."""
    heads = selection.kv_heads if kv else selection.q_heads
    x = x[list(selection.batch_rows)]
    return x[:, :, list(heads)]


def pick_rows(x, rows):
    """Query rows `rows` (ascending indices) of one (b, s, h, d) tensor, every
    batch row and head."""
    return x[:, torch.as_tensor(rows, dtype=torch.long, device=x.device)]


def normalised_error(got, want) -> float:
    """max |got - want| / max |want|, infinite where got is not finite."""
    got = got.detach().to(torch.float32)
    if not bool(torch.isfinite(got).all()):
        return float("inf")
    scale = max(float(want.abs().max()), 1e-6)
    return float((got - want).abs().max()) / scale
