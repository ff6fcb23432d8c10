"""dK/dV programs over a share of a K/V head's query heads.

A dK/dV program owns one K/V block of one K/V head and sums over every
query head of its group, so a short sequence has few programs: 64:8 heads
at 1k tokens in 128-key blocks make 64, where a Hopper card runs 132 of
the Mosaic kernel's (one an SM) at once. Split `split` ways, each program
takes group / split of the query heads and writes its share of dK and dV;
the shares are summed after, in float32. Written as K/V heads repeated
`split` times, so the kernels run unchanged: query head h reads K/V head
h // (group / split) of the repeated array, a copy of K/V head h // group.
"""

from __future__ import annotations

import jax.numpy as jnp


def spread(x, split: int):
    """(b, s, kv, d) -> (b, s, kv * split, d), each head `split` times."""
    return x if split == 1 else jnp.repeat(x, split, axis=2)


def fold(x, split: int):
    """(b, s, kv * split, d) shares -> (b, s, kv, d), summed in float32."""
    if split == 1:
        return x
    batch, seq, heads, dim = x.shape
    shares = x.reshape(batch, seq, heads // split, split, dim)
    return shares.sum(axis=3, dtype=jnp.float32).astype(x.dtype)
