"""Fingerprints of jax.pallas_flex's lowered kernels (no GPU needed).

Lowers the Triton kernels (forward, dQ, dK/dV, the ring's onto forms) and
the Mosaic GPU forward and backward for every mask family to the CUDA
platform on the host and prints one sha256 per (kernel, family, setting).
Run it on two commits and diff the output: equal lines mean the refactor
left the kernels' IR unchanged.

    python experiments/lab/pallas_flex_ir.py > ir.txt
"""

from __future__ import annotations

import functools
import hashlib
import re

import jax
import jax.numpy as jnp
from jax._src import source_info_util

from lcab.masks import MASK_NAMES, small_mask


try:  # the package layout
    from jax_backends.pallas_flex import mosaic_bwd_sm90, mosaic_fwd_sm90, ops
    from jax_backends.pallas_flex.plan import make_plan
    NEW = True
except ImportError:  # the flat layout before it
    from jax_backends import flex_backward_mosaic as mosaic_bwd_sm90
    from jax_backends import flex_kernel as ops
    from jax_backends import flex_kernel_mosaic as mosaic_fwd_sm90
    from jax_backends.flex_plan import make_plan
    NEW = False


def digest(text: str) -> str:
    # Source locations name files and lines, which a move changes: drop them.
    text = re.sub(r"loc\([^)]*\)", "", text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def lowered(fn, *args) -> str:
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def triton_lines(name: str):
    mask = small_mask(name, 300)
    fplan, bplan = make_plan(mask, 128, 64), make_plan(mask, 64, 64)
    q = jax.ShapeDtypeStruct((2, 300, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 300, 2, 64), jnp.bfloat16)
    if NEW:
        attention = lambda q, k, v: ops.flex_attention(q, k, v, fplan, bplan,  # noqa: E731
                                                       ops.Lowering(forward="triton",
                                                                    backward="triton"))
    else:
        lowering = ops.Lowering(forward_lowering="triton", backward_lowering="triton")
        attention = lambda q, k, v: ops.flex_attention(q, k, v, fplan, bplan,  # noqa: E731
                                                       lowering)

    def loss(q, k, v):
        out, lse = attention(q, k, v)
        return out.astype(jnp.float32).sum() + lse.sum()

    yield "triton fwd+bwd", digest(lowered(jax.grad(loss, argnums=(0, 1, 2)), q, kv, kv))


def mosaic_lines(name: str):
    plan = make_plan(small_mask(name, 300), 128, 128)
    tables = jax.tree.map(jnp.asarray, plan.tables())
    q = jax.ShapeDtypeStruct((2, plan.padded_q, 4, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, plan.padded_k, 2, 128), jnp.bfloat16)
    rows = jax.ShapeDtypeStruct((2, 4, plan.padded_q), jnp.float32)
    forward = lambda q, k, v, t: mosaic_fwd_sm90.forward(q, k, v, plan.geometry, t)  # noqa: E731
    yield "mosaic fwd", digest(lowered(forward, q, kv, kv, tables))
    for together in (False, True):
        for parts in (1, 2):
            def backward(q, k, v, dout, lse2, delta, t, together=together, parts=parts):
                if NEW:
                    return mosaic_bwd_sm90.backward(
                        q, k, v, dout, lse2, delta, plan.geometry, t, heads_together=together,
                        config=mosaic_bwd_sm90.Config(parts=parts))
                return mosaic_bwd_sm90.backward(q, k, v, dout, lse2, delta, plan.geometry, t,
                                                heads_together=together, parts=parts)

            yield (f"mosaic bwd together={together} parts={parts}",
                   digest(lowered(backward, q, kv, kv, q, rows, rows, tables)))


def main():
    # No source locations in the IR (Mosaic's serialised kernels carry them
    # inside): a move or a shifted line must not read as a changed kernel.
    # No frame counts as the user's, so every location is unknown.
    source_info_util.is_user_filename = functools.lru_cache(lambda _: False)
    source_info_util.user_frame.cache_clear()
    for name in MASK_NAMES:
        for lines in (triton_lines, mosaic_lines):
            for kernel, value in lines(name):
                print(f"{name:24s} {kernel:36s} {value}")


if __name__ == "__main__":
    main()
