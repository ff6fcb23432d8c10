"""jax.pallas_flex's kernels through Pallas's Triton lowering (any GPU;
Pallas interpret mode on a CPU).

- Forward: one program per (q block, q head, batch) walks the kv blocks its
  plan row lists: runs of full tiles with no mask and direct addresses
  (so Triton can prefetch them), then the partial tiles, masked by their
  slices; online softmax in float32.
- dQ: the same walk. dK/dV: one program per (kv block, kv head, batch)
  walks the q blocks that see it, for every q head of the group, so K/V
  are never repeated and nothing is added atomically.
- Blocks are launched heaviest first (the walk's `order`), so a program
  finds its block in the table and addresses its rows itself rather than
  through a BlockSpec.

Inputs come padded to the plan's blocks (ops pads them); scores are kept
in base 2 (exp2) and lse2 is the base-2 log-sum-exp. Masked scores are
-inf; a row that sees nothing gives out 0 and lse2 -inf, and every exp is
guarded so such rows never make a NaN.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jax_backends.pallas_flex import head_split
from jax_backends.pallas_flex.plan import Geometry
from lcab.masks.slices import BI_CAUSAL, CAUSAL, INV_CAUSAL

_LOG2E = math.log2(math.e)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """Triton launch settings of the forward and of the backward kernels."""

    num_warps: int = 8
    num_stages: int = 2
    # 4 warps for the 64 x 64 backward tiles: the fastest measured
    # (docs/pallas_flex.md, "Constants").
    backward_num_warps: int = 4
    backward_num_stages: int = 2

    def params(self, interpret: bool, backward: bool = False):
        if interpret:
            return None
        return plgpu.CompilerParams(
            num_warps=self.backward_num_warps if backward else self.num_warps,
            num_stages=self.backward_num_stages if backward else self.num_stages,
        )


def _tile_visible(slices_ref, ids_ref, lo, hi, row0, col0, block_q, block_k):
    """The element mask of a partial tile: the union of slices ids[lo:hi]
    (row and column 0 of the tile at row0, col0)."""
    rows = row0 + jnp.arange(block_q, dtype=jnp.int32)[:, None]
    cols = col0 + jnp.arange(block_k, dtype=jnp.int32)[None, :]

    def add(t, visible):
        base = ids_ref[t] * 5
        q0, q1 = slices_ref[base], slices_ref[base + 1]
        k0, k1 = slices_ref[base + 2], slices_ref[base + 3]
        kind = slices_ref[base + 4]
        r, c = rows - q0, cols - k0
        inside = (r >= 0) & (rows < q1) & (c >= 0) & (cols < k1)
        below_right_edge = c <= r + ((k1 - k0) - (q1 - q0))  # causal, bottom-right
        right_of_left_edge = c >= r  # inverse causal, top-left
        needs_right = (kind == CAUSAL) | (kind == BI_CAUSAL)
        needs_left = (kind == INV_CAUSAL) | (kind == BI_CAUSAL)
        seen = inside & (below_right_edge | ~needs_right) & (right_of_left_edge | ~needs_left)
        return jnp.maximum(visible, seen.astype(jnp.int32))

    return lax.fori_loop(lo, hi, add, jnp.zeros((block_q, block_k), jnp.int32)) > 0


def _own_block(tables, size: int, axis: int):
    """This program's block of the walk (grid axis `axis` runs through the
    walk's launch order) and the pl.ds of its rows."""
    block = tables[7][pl.program_id(axis)]  # the walk's order (Walk.arrays)
    return block, pl.ds(pl.multiple_of(block * size, size), size)


def _walk(tables, program, step, carry, row0, col0, block_q, block_k, by_k=False):
    """Fold `step(block, visible, carry)` over one program's tiles: its full
    runs first (visible None: no mask), then its partial tiles."""
    run_start, run_stop, runs, blocks, lo, hi, partials, _, ids, slices = tables

    def full_run(r, carry):
        return lax.fori_loop(run_start[program, r], run_stop[program, r],
                             lambda b, c: step(b, None, c), carry)

    def partial(j, carry):
        block = blocks[program, j]
        rows0, cols0 = (block * block_q, col0) if by_k else (row0, block * block_k)
        visible = _tile_visible(slices, ids, lo[program, j], hi[program, j],
                                rows0, cols0, block_q, block_k)
        return step(block, visible, carry)

    carry = lax.fori_loop(0, runs[program], full_run, carry)
    return lax.fori_loop(0, partials[program], partial, carry)


def _forward_kernel(*refs, scale: float, block_q: int, block_k: int):
    *tables, q_ref, k_ref, v_ref, o_ref, lse_ref = refs
    qi, rows = _own_block(tables, block_q, axis=0)
    head_dim = q_ref.shape[-1]
    q = q_ref[rows, :]
    qk_scale = scale * _LOG2E

    def step(kb, visible, carry):
        acc, m_prev, l_prev = carry
        span = pl.ds(pl.multiple_of(kb * block_k, block_k), block_k)
        s = plgpu.dot(q, k_ref[span, :].T) * qk_scale
        if visible is not None:
            s = jnp.where(visible, s, -jnp.inf)
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1))
        m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)  # rows that saw nothing yet
        correction = jnp.exp2(m_prev - m_safe)
        p = jnp.exp2(s - m_safe[:, None])
        v = v_ref[span, :]
        acc = acc * correction[:, None] + plgpu.dot(p.astype(v.dtype), v)
        return acc, m_next, l_prev * correction + jnp.sum(p, axis=1)

    acc = jnp.zeros((block_q, head_dim), jnp.float32)
    m = jnp.full((block_q,), -jnp.inf, jnp.float32)
    l = jnp.zeros((block_q,), jnp.float32)
    acc, m, l = _walk(tables, qi, step, (acc, m, l), qi * block_q, 0, block_q, block_k)
    seen = l > 0
    o_ref[rows, :] = (acc / jnp.where(seen, l, 1.0)[:, None]).astype(o_ref.dtype)
    lse_ref[rows] = jnp.where(seen, m + jnp.log2(jnp.where(seen, l, 1.0)), -jnp.inf)


def _probabilities(q, k, lse2, visible, qk_scale):
    """exp(s - lse) of a tile, 0 where masked or where the row saw nothing."""
    s = plgpu.dot(q, k.T) * qk_scale
    lse_safe = jnp.where(lse2 == -jnp.inf, 0.0, lse2)
    p = jnp.exp2(s - lse_safe[:, None])
    # Rows that see nothing (lse -inf) only meet partial tiles, where they
    # are masked out.
    return p if visible is None else jnp.where(visible, p, 0.0)


def _dq_kernel(*refs, scale: float, block_q: int, block_k: int):
    *tables, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref = refs
    qi, rows = _own_block(tables, block_q, axis=0)
    q, do = q_ref[rows, :], do_ref[rows, :]
    lse2, delta = lse_ref[rows], delta_ref[rows]
    qk_scale = scale * _LOG2E

    def step(kb, visible, dq):
        span = pl.ds(pl.multiple_of(kb * block_k, block_k), block_k)
        k, v = k_ref[span, :], v_ref[span, :]
        p = _probabilities(q, k, lse2, visible, qk_scale)
        ds = p * (plgpu.dot(do, v.T) - delta[:, None])
        return dq + plgpu.dot(ds.astype(k.dtype), k)

    dq = jnp.zeros(q.shape, jnp.float32)
    dq = _walk(tables, qi, step, dq, qi * block_q, 0, block_q, block_k) * scale
    dq_ref[rows, :] = dq.astype(dq_ref.dtype)


def _dkv_kernel(*refs, scale: float, block_q: int, block_k: int, group: int,
                block_axis: int = 0):
    *tables, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref = refs
    kj, cols = _own_block(tables, block_k, axis=block_axis)
    k, v = k_ref[cols, :], v_ref[cols, :]
    qk_scale = scale * _LOG2E

    def one_head(head, carry):
        def step(qb, visible, carry):
            dk, dv = carry
            span = pl.ds(pl.multiple_of(qb * block_q, block_q), block_q)
            q, do = q_ref[span, head, :], do_ref[span, head, :]
            p = _probabilities(q, k, lse_ref[head, span], visible, qk_scale)
            dv = dv + plgpu.dot(p.astype(do.dtype).T, do)
            ds = p * (plgpu.dot(do, v.T) - delta_ref[head, span][:, None])
            return dk + plgpu.dot(ds.astype(q.dtype).T, q), dv

        return _walk(tables, kj, step, carry, 0, kj * block_k, block_q, block_k, by_k=True)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, group, one_head, (zeros, zeros))
    dk = dk * scale
    dk_ref[cols, :] = dk.astype(dk_ref.dtype)
    dv_ref[cols, :] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------- calls


def _whole(array):
    """A BlockSpec giving every program the whole (small, int32) table."""
    return pl.BlockSpec(array.shape, lambda *_: (0,) * array.ndim)


def _head_specs(plan: Geometry, head_dim: int, group: int):
    """BlockSpecs of a program of grid (q block, q head, batch): the head's
    whole rows, its lse row and its group's whole K/V (the program picks
    its q block's rows itself: _own_block)."""
    rows = pl.BlockSpec((None, plan.padded_q, None, head_dim), lambda i, h, b: (b, 0, h, 0))
    lse = pl.BlockSpec((None, None, plan.padded_q), lambda i, h, b: (b, h, 0))
    kv = pl.BlockSpec((None, plan.padded_k, None, head_dim),
                      lambda i, h, b: (b, 0, h // group, 0))
    return rows, lse, kv


def walk_tables(tables, walk: str):
    """The arrays one kernel reads, in its reference order."""
    return [*tables[walk], tables["slice_ids"], tables["slices"]]


def forward(q, k, v, plan: Geometry, tables, config: Config, interpret: bool):
    """(out, lse2) of the padded inputs."""
    batch, seq_q, heads, head_dim = q.shape
    group = heads // k.shape[2]
    tables = walk_tables(tables, "by_q")
    kernel = functools.partial(_forward_kernel, scale=1.0 / math.sqrt(head_dim),
                               block_q=plan.block_q, block_k=plan.block_k)
    row_spec, lse_spec, kv_spec = _head_specs(plan, head_dim, group)
    return pl.pallas_call(
        kernel,
        grid=(plan.num_q_blocks, heads, batch),
        in_specs=[*map(_whole, tables), row_spec, kv_spec, kv_spec],
        out_specs=[row_spec, lse_spec],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, seq_q), jnp.float32)],
        interpret=interpret,
        compiler_params=config.params(interpret),
        name="lcab_flex_forward",
    )(*tables, q, k, v)


def backward(q, k, v, delta, lse2, dout, plan: Geometry, tables, config: Config,
             interpret: bool, heads_together: bool, dkv_split: int = 1):
    """(dq, dk, dv) of the padded inputs: dQ in its own pass over the
    q-block rows, then dK/dV over the kv-block columns, dkv_split programs
    a kv head's block (head_split)."""
    dq = _dq(q, k, v, delta, lse2, dout, plan, tables, config, interpret,
             1.0 / math.sqrt(q.shape[3]))
    dk, dv = _dkv(q, head_split.spread(k, dkv_split), head_split.spread(v, dkv_split), delta,
                  lse2, dout, plan, tables, config, interpret, heads_together)
    return dq, head_split.fold(dk, dkv_split), head_split.fold(dv, dkv_split)


def _dkv(q, k, v, delta, lse2, dout, plan: Geometry, tables, config: Config,
         interpret: bool, heads_together: bool):
    batch, _, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim)

    by_k = walk_tables(tables, "by_k")
    # Grid (kv head, kv block, batch) when together, else (kv block, kv head, batch).
    if heads_together:
        rows_at, lse_at = (lambda g, j, b: (b, 0, g, 0)), (lambda g, j, b: (b, g, 0))
    else:
        rows_at, lse_at = (lambda j, g, b: (b, 0, g, 0)), (lambda j, g, b: (b, g, 0))
    kv_block = pl.BlockSpec((None, plan.padded_k, None, head_dim), rows_at)
    group_rows = pl.BlockSpec((None, plan.padded_q, group, head_dim), rows_at)
    group_lse = pl.BlockSpec((None, group, plan.padded_q), lse_at)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, scale=scale, block_q=plan.block_q,
                          block_k=plan.block_k, group=group, block_axis=int(heads_together)),
        grid=((kv_heads, plan.num_k_blocks, batch) if heads_together
              else (plan.num_k_blocks, kv_heads, batch)),
        in_specs=[*map(_whole, by_k), group_rows, kv_block, kv_block, group_rows,
                  group_lse, group_lse],
        out_specs=[kv_block, kv_block],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        interpret=interpret,
        compiler_params=config.params(interpret, backward=True),
        name="lcab_flex_dkv",
    )(*by_k, q, k, v, dout, lse2, delta)
    return dk, dv


def _dq(q, k, v, delta, lse2, dout, plan: Geometry, tables, config: Config, interpret: bool,
        scale):
    group = q.shape[2] // k.shape[2]
    q_spec, lse_spec, kv_whole = _head_specs(plan, q.shape[3], group)
    by_q = walk_tables(tables, "by_q")
    return pl.pallas_call(
        functools.partial(_dq_kernel, scale=scale, block_q=plan.block_q, block_k=plan.block_k),
        grid=(plan.num_q_blocks, q.shape[2], q.shape[0]),
        in_specs=[*map(_whole, by_q), q_spec, kv_whole, kv_whole, q_spec, lse_spec, lse_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret,
        compiler_params=config.params(interpret, backward=True),
        name="lcab_flex_dq",
    )(*by_q, q, k, v, dout, lse2, delta)
