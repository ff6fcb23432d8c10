"""jax.pallas_flex's kernels: flash attention over a FlexPlan, in Pallas.

`flex_attention(q, k, v, plan, ...)` returns (out, lse) and is
differentiable (jax.custom_vjp); `flex_attention_with_tables` takes the
plan's tables as arrays (context-parallel ranks pass their own), and
`block_gradients` gives one K/V block's share of the gradients from the
rows' final out and lse (a ring's backward). Layout (batch, seq, heads,
head_dim); K/V may have fewer heads than Q (GQA): a Q head reads its
group's K/V head, and dK/dV programs loop over the group's Q heads, so
nothing is repeated in memory.

- Forward: one program per (q block, q head, batch) walks the kv blocks its
  plan row lists: runs of full tiles with no mask and direct addresses
  (so Triton can prefetch them), then the partial tiles, masked by their
  slices; online softmax in float32.
- dQ: the same walk. dK/dV: one program per (kv block, kv head, batch)
  walks the q blocks that see it, for every q head of the group.
- Blocks are launched heaviest first (the walk's `order`), so a program
  finds its block in the table and addresses its rows itself rather than
  through a BlockSpec. Forward and dQ launch one head after another (its
  blocks heaviest first): the running programs then share one K/V head in
  L2. dK/dV, with group-times fewer programs and the longest ones, does so
  too unless its heaviest program could outlast the rest (dkv_launch
  "auto"): then every head of a block goes together. Measured on an H100:
  every head together gained dK/dV 8-19 % on packed documents at 16k-32k
  and cost 6-10 % on the full mask.

Masked scores are -inf, and a row that sees nothing gives out 0 and
lse -inf (lcab.reference's convention); every exp is guarded so such rows
never make a NaN. Scores are kept in base 2 inside (exp2), lse is returned
in natural log. On a CPU the same kernels run in Pallas interpret mode. On
Hopper the forward goes through Mosaic GPU instead where it fits
(flex_kernel_mosaic; Lowering.forward_lowering), and the backward does
where asked (flex_backward_mosaic; Lowering.backward_lowering).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jax_backends import (
    _shared,
    flex_backward_fused_mosaic,
    flex_backward_mosaic,
    flex_kernel_mosaic,
)
from jax_backends.flex_plan import FlexPlan, Geometry
from lcab.masks.slices import BI_CAUSAL, CAUSAL, INV_CAUSAL

_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)


DKV_LAUNCHES = ("auto", "head_major", "heads_together")
FORWARD_LOWERINGS = ("auto", "triton", "mosaic")
BACKWARD_LOWERINGS = ("auto", "triton", "mosaic")
# Programs that run at once: two 4-warp dK/dV programs per SM of an H100's
# 132 (an estimate; only the launch choice depends on it).
_CONCURRENT_PROGRAMS = 264
# Measured on an H100 (2026-11-26): heads together gained dK/dV 19 % and 8 %
# at estimated tails of 0.38 and 0.20 (packed documents, 16k and 32k) and
# was even at 0.13 and 0.09 (causal 16k, documents 64k).
_TAIL_LIMIT = 0.15


@dataclasses.dataclass(frozen=True)
class Lowering:
    """How the kernels are compiled: Triton launch options or interpret mode."""

    interpret: bool = False
    num_warps: int = 8
    num_stages: int = 2
    backward_num_warps: int = 4  # measured: 64x64 tiles run 2.3x faster than with 8 (H100)
    backward_num_stages: int = 2
    # dK/dV launch: "head_major" (one kv head after another), "heads_together"
    # (every kv head of a block together) or "auto" (heads_together where the
    # heaviest program, started last, would outrun the others by more than
    # _TAIL_LIMIT of the pass).
    dkv_launch: str = "auto"
    # One backward pass instead of two: the dK/dV programs also add each
    # tile's dQ share into a float32 buffer, so P is computed once per tile
    # rather than twice: by atomics in Triton (FA2's original scheme,
    # measured 2.6x slower), by TMA reduce-adds in Mosaic GPU (FA3's;
    # flex_backward_fused_mosaic: correct, measured at half the two-pass
    # speed; docs/pallas_flex.md says why).
    fused_backward: bool = False
    # The forward's lowering: "triton" (also the CPU's, interpreted),
    # "mosaic" (Hopper: wgmma, TMA, warp specialised; flex_kernel_mosaic) or
    # "auto" (mosaic where it fits, else triton).
    forward_lowering: str = "auto"
    # Shared-memory slots of the Mosaic forward's K/V ring.
    forward_stages: int = 2
    # The Mosaic forward as a persistent kernel, one program per SM (v8;
    # flex_kernel_mosaic.forward).
    forward_persistent: bool = False
    # The backward's, as the forward's (flex_backward_mosaic, on 128 x 128
    # backward tiles): 1.16-1.34x the Triton backward on an H100
    # (results/gpu/2026-11-26-pallas-flex-mosaic-backward/).
    backward_lowering: str = "auto"
    # The Mosaic backward's tiles in this many strips along the streamed side
    # (flex_backward_mosaic.PARTS): 2 halves a warpgroup's score registers,
    # which took dK/dV from 392 to 552 TFLOP/s of its matmuls (H100).
    backward_parts: int = 2

    def __post_init__(self):
        if self.dkv_launch not in DKV_LAUNCHES:
            raise ValueError(f"dkv_launch={self.dkv_launch!r}: choose one of "
                             f"{', '.join(DKV_LAUNCHES)}")
        if self.forward_lowering not in FORWARD_LOWERINGS:
            raise ValueError(f"forward_lowering={self.forward_lowering!r}: choose one of "
                             f"{', '.join(FORWARD_LOWERINGS)}")
        if self.interpret and self.forward_lowering == "mosaic":
            raise ValueError("forward_lowering=mosaic has no interpret mode (a CUDA GPU only)")
        if self.backward_lowering not in BACKWARD_LOWERINGS:
            raise ValueError(f"backward_lowering={self.backward_lowering!r}: choose one of "
                             f"{', '.join(BACKWARD_LOWERINGS)}")
        if self.interpret and self.backward_lowering == "mosaic":
            raise ValueError("backward_lowering=mosaic has no interpret mode (a CUDA GPU only)")
        if self.backward_parts not in flex_backward_mosaic.PARTS:
            raise ValueError(f"backward_parts={self.backward_parts}: choose one of "
                             f"{', '.join(map(str, flex_backward_mosaic.PARTS))}")
        if self.forward_stages < 2:
            raise ValueError(f"forward_stages={self.forward_stages}: the K/V ring needs 2 or more")

    def mosaic_problem(self, direction: str, block_q: int, block_k: int, dtype,
                       head_dim: int) -> str | None:
        """Why the "forward" or "backward" of these blocks and inputs cannot
        be Mosaic's (None: it is)."""
        chosen = getattr(self, f"{direction}_lowering")
        if self.interpret or chosen == "triton":
            return f"{direction}_lowering={chosen}, interpret={self.interpret}"
        kernels = (flex_kernel_mosaic if direction == "forward"
                   else flex_backward_fused_mosaic if self.fused_backward
                   else flex_backward_mosaic)
        return (_shared.gpu_problem(capability=flex_kernel_mosaic.SM90, exact=True)
                or kernels.problem(block_q, block_k, dtype, head_dim))

    def is_mosaic(self, direction: str, block_q: int, block_k: int, dtype, head_dim: int) -> bool:
        """Mosaic where asked; with "auto", where it fits. An explicit
        "mosaic" that does not fit raises (mask_support reports it first)."""
        problem = self.mosaic_problem(direction, block_q, block_k, dtype, head_dim)
        if getattr(self, f"{direction}_lowering") == "mosaic" and problem:
            raise ValueError(f"{direction}_lowering=mosaic: {problem}")
        return problem is None

    def params(self, backward: bool = False):
        if self.interpret:
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


def _forward_kernel(*refs, scale: float, block_q: int, block_k: int, onto: bool = False):
    # onto: the rows' partial result over other keys comes in (o_in float32,
    # lse_in base 2) and the kernel continues from it (a ring's merge).
    if onto:
        *tables, q_ref, k_ref, v_ref, o_in_ref, lse_in_ref, o_ref, lse_ref = refs
    else:
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

    if onto:
        # (out, lse) is the state (acc / l, m + log2 l) with m = lse, l = 1.
        m = lse_in_ref[rows]
        l = jnp.where(m == -jnp.inf, 0.0, 1.0)
        acc = o_in_ref[rows, :]
    else:
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


def _dq_kernel(*refs, scale: float, block_q: int, block_k: int, onto: bool = False):
    # onto: dq_in (float32) comes in and the kernel writes dq_in + this dQ.
    if onto:
        *tables, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_in_ref, dq_ref = refs
    else:
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
    if onto:
        dq = dq + dq_in_ref[rows, :]
    dq_ref[rows, :] = dq.astype(dq_ref.dtype)


def _dkv_kernel(*refs, scale: float, block_q: int, block_k: int, group: int,
                fused: bool = False, onto: bool = False, block_axis: int = 0):
    # fused: dq_ref, the group's float32 dQ (aliased to its input: zeros, or
    # the running dQ), is added to atomically. onto: dk_in and dv_in (float32)
    # come in and the kernel writes them plus this dK, dV.
    extra = 2 * onto + (4 if fused else 2)  # refs after delta_ref
    *tables, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = refs[:-extra]
    rest = list(refs[-extra:])
    dk_in_ref = dv_in_ref = dq_ref = None
    if onto:
        dk_in_ref, dv_in_ref = rest[:2]
        rest = rest[2:]
    if fused:
        _, dk_ref, dv_ref, dq_ref = rest
    else:
        dk_ref, dv_ref = rest
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
            if fused:
                plgpu.atomic_add(dq_ref, (span, head, slice(None)),
                                 plgpu.dot(ds.astype(k.dtype), k) * scale)
            return dk + plgpu.dot(ds.astype(q.dtype).T, q), dv

        return _walk(tables, kj, step, carry, 0, kj * block_k, block_q, block_k, by_k=True)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, group, one_head, (zeros, zeros))
    dk = dk * scale
    if onto:
        dk, dv = dk + dk_in_ref[cols, :], dv + dv_in_ref[cols, :]
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


def _walk_tables(tables, walk: str):
    """The arrays one kernel reads, in its reference order."""
    return [*tables[walk], tables["slice_ids"], tables["slices"]]


def _forward(q, k, v, plan: Geometry, tables, lowering: Lowering, out_dtype=None,
             onto=None):
    """(out, lse2) of the padded inputs; onto = (out float32, lse2) of the
    same rows over other keys to continue from."""
    if (onto is None and out_dtype is None
            and lowering.is_mosaic("forward", plan.block_q, plan.block_k, q.dtype, q.shape[3])):
        return flex_kernel_mosaic.forward(q, k, v, plan, tables, stages=lowering.forward_stages,
                                          persistent=lowering.forward_persistent)
    batch, seq_q, heads, head_dim = q.shape
    group = heads // k.shape[2]
    bq, bk = plan.block_q, plan.block_k
    tables = _walk_tables(tables, "by_q")
    kernel = functools.partial(_forward_kernel, scale=1.0 / math.sqrt(head_dim),
                               block_q=bq, block_k=bk, onto=onto is not None)
    row_spec, lse_spec, kv_spec = _head_specs(plan, head_dim, group)
    out, lse2 = pl.pallas_call(
        kernel,
        grid=(plan.num_q_blocks, heads, batch),
        in_specs=[*map(_whole, tables), row_spec, kv_spec, kv_spec,
                  *([row_spec, lse_spec] if onto is not None else [])],
        out_specs=[row_spec, lse_spec],
        out_shape=[jax.ShapeDtypeStruct(q.shape, out_dtype or q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, seq_q), jnp.float32)],
        interpret=lowering.interpret,
        compiler_params=lowering.params(),
        name="lcab_flex_forward_onto" if onto is not None else "lcab_flex_forward",
    )(*tables, q, k, v, *(onto or ()))
    return out, lse2


def _backward(q, k, v, delta, lse2, dout, plan: Geometry, tables, lowering: Lowering,
              onto=None):
    """(dq, dk, dv) of the padded inputs; onto = float32 (dq, dk, dv) to add
    them to (a ring's running sums), returned as float32 sums."""
    batch, seq_q, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    bq, bk = plan.block_q, plan.block_k
    scale = 1.0 / math.sqrt(head_dim)
    fused = lowering.fused_backward
    dq_in, dk_in, dv_in = onto if onto is not None else (None, None, None)
    if onto is None and lowering.is_mosaic("backward", bq, bk, q.dtype, head_dim):
        together = _heads_together(plan, kv_heads * batch, lowering)
        if fused:
            return flex_backward_fused_mosaic.backward(q, k, v, dout, lse2, delta, plan, tables,
                                                       heads_together=together)
        return flex_backward_mosaic.backward(q, k, v, dout, lse2, delta, plan, tables,
                                             heads_together=together,
                                             parts=lowering.backward_parts)
    dq = None if fused else _dq(q, k, v, delta, lse2, dout, plan, tables, lowering, scale,
                                dq_in)

    by_k = _walk_tables(tables, "by_k")
    together = _heads_together(plan, kv_heads * batch, lowering)
    # Grid (kv head, kv block, batch) when together, else (kv block, kv head, batch).
    if together:
        rows_at, lse_at = (lambda g, j, b: (b, 0, g, 0)), (lambda g, j, b: (b, g, 0))
    else:
        rows_at, lse_at = (lambda j, g, b: (b, 0, g, 0)), (lambda j, g, b: (b, g, 0))
    kv_block = pl.BlockSpec((None, plan.padded_k, None, head_dim), rows_at)
    group_rows = pl.BlockSpec((None, plan.padded_q, group, head_dim), rows_at)
    group_lse = pl.BlockSpec((None, group, plan.padded_q), lse_at)
    inputs = [*by_k, q, k, v, dout, lse2, delta]
    in_specs = [*map(_whole, by_k), group_rows, kv_block, kv_block, group_rows,
                group_lse, group_lse]
    if onto is not None:
        inputs += [dk_in, dv_in]
        in_specs += [kv_block, kv_block]
    out_specs = [kv_block, kv_block]
    kv_dtype = jnp.float32 if onto is not None else k.dtype
    out_shape = [jax.ShapeDtypeStruct(k.shape, kv_dtype), jax.ShapeDtypeStruct(v.shape, kv_dtype)]
    aliases = {}
    if fused:
        aliases = {len(inputs): 2}  # this buffer becomes the dQ output, added to in place
        inputs.append(dq_in if onto is not None else jnp.zeros(q.shape, jnp.float32))
        in_specs.append(group_rows)
        out_specs.append(group_rows)
        out_shape.append(jax.ShapeDtypeStruct(q.shape, jnp.float32))
    grads = pl.pallas_call(
        functools.partial(_dkv_kernel, scale=scale, block_q=bq, block_k=bk, group=group,
                          fused=fused, onto=onto is not None, block_axis=int(together)),
        grid=((kv_heads, plan.num_k_blocks, batch) if together
              else (plan.num_k_blocks, kv_heads, batch)),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        input_output_aliases=aliases,
        interpret=lowering.interpret,
        compiler_params=lowering.params(backward=True),
        name="lcab_flex_dkv_dq" if fused else "lcab_flex_dkv",
    )(*inputs)
    if fused:
        dk, dv, dq = grads
        return (dq if onto is not None else dq.astype(q.dtype)), dk, dv
    dk, dv = grads
    return dq, dk, dv


def _heads_together(plan: Geometry, programs_per_block: int, lowering: Lowering) -> bool:
    """Whether dK/dV launches every head of a block together: the heaviest
    program's excess run against the pass's share of work per running
    program (all are equal: never)."""
    if lowering.dkv_launch != "auto":
        return lowering.dkv_launch == "heads_together"
    return plan.dkv_tail * _CONCURRENT_PROGRAMS / programs_per_block > _TAIL_LIMIT


def _dq(q, k, v, delta, lse2, dout, plan: Geometry, tables, lowering: Lowering, scale,
        dq_in=None):
    """dQ in its own pass over the q-block rows (the unfused backward); with
    dq_in (float32), dq_in + dQ in float32."""
    group = q.shape[2] // k.shape[2]
    bq, bk = plan.block_q, plan.block_k
    q_spec, lse_spec, kv_whole = _head_specs(plan, q.shape[3], group)
    by_q = _walk_tables(tables, "by_q")
    onto = dq_in is not None
    return pl.pallas_call(
        functools.partial(_dq_kernel, scale=scale, block_q=bq, block_k=bk, onto=onto),
        grid=(plan.num_q_blocks, q.shape[2], q.shape[0]),
        in_specs=[*map(_whole, by_q), q_spec, kv_whole, kv_whole, q_spec, lse_spec, lse_spec,
                  *([q_spec] if onto else [])],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, jnp.float32 if onto else q.dtype),
        interpret=lowering.interpret,
        compiler_params=lowering.params(backward=True),
        name="lcab_flex_dq_onto" if onto else "lcab_flex_dq",
    )(*by_q, q, k, v, dout, lse2, delta, *([dq_in] if onto else []))


def _pad(x, length):
    extra = length - x.shape[1]
    return x if extra == 0 else jnp.pad(x, ((0, 0), (0, extra), (0, 0), (0, 0)))


def flex_attention(q, k, v, forward_plan: FlexPlan, backward_plan: FlexPlan | None = None,
                   lowering: Lowering = Lowering()):
    """(out, lse) of attention under the plans' mask; differentiable in q, k, v.

    q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, kv_heads,
    head_dim) with heads a multiple of kv_heads. lse: (batch, heads, seqlen_q)
    float32, natural log, -inf on rows that see nothing. The backward walks
    backward_plan (the same mask, other block sizes), forward_plan if None.
    """
    backward_plan = backward_plan or forward_plan
    as_arrays = lambda plan: jax.tree.map(jnp.asarray, plan.tables())  # noqa: E731
    return flex_attention_with_tables(
        q, k, v, forward_plan.geometry, as_arrays(forward_plan),
        backward_plan.geometry, as_arrays(backward_plan), lowering)


def flex_attention_with_tables(q, k, v, forward_geometry: Geometry, forward_tables,
                               backward_geometry: Geometry, backward_tables,
                               lowering: Lowering = Lowering()):
    """flex_attention with the plans' tables as (possibly traced) arrays:
    inside shard_map each context-parallel rank passes its own tables
    (flex_plan.stack_plans), compiled once for their shared geometry."""
    _check(q, k, v, forward_geometry, backward_geometry)
    return _attention(forward_geometry, backward_geometry, lowering, q, k, v,
                      forward_tables, backward_tables)


def flex_attention_onto(q, k, v, partial, geometry: Geometry, tables,
                        lowering: Lowering = Lowering()):
    """Continue attention of q's rows onto more keys: `partial` is (out
    float32, lse natural log) of the same rows over other keys (None: none
    yet); returns their (out float32, lse) over both. A ring's merge done
    inside the kernel, so no pass over the float32 output follows each
    step. Forward only (a ring takes its gradients from the final out and
    lse, not through this)."""
    _check(q, k, v, geometry)
    return _forward_padded(geometry, tables, lowering, q, k, v, out_dtype=jnp.float32,
                           partial=partial)


def _check(q, k, v, *geometries):
    if q.ndim != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape} are not (b, s, h, d) "
                         "with matching batch and head_dim")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"{q.shape[2]} query heads are not a multiple of {k.shape[2]} kv heads")
    for geometry in geometries:
        if (geometry.seqlen_q, geometry.seqlen_k) != (q.shape[1], k.shape[1]):
            raise ValueError(f"a plan for {geometry.seqlen_q} x {geometry.seqlen_k} tokens was "
                             f"given q of {q.shape[1]} and k of {k.shape[1]}")


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _attention(forward_geometry, backward_geometry, lowering, q, k, v, forward_tables,
               backward_tables):
    return _forward_padded(forward_geometry, forward_tables, lowering, q, k, v)


def _forward_padded(plan, tables, lowering, q, k, v, out_dtype=None, partial=None):
    """_forward on inputs padded to the plan's blocks, (out, natural lse)
    cut back; partial: (out, lse) to continue from, as flex_attention_onto."""
    seq_q = q.shape[1]
    onto = None
    if partial is not None:
        out, lse = partial
        onto = (_pad(out.astype(jnp.float32), plan.padded_q), _lse2_padded(lse, plan.padded_q))
    out, lse2 = _forward(_pad(q, plan.padded_q), _pad(k, plan.padded_k),
                         _pad(v, plan.padded_k), plan, tables, lowering, out_dtype, onto)
    return out[:, :seq_q], lse2[:, :, :seq_q] * _LN2


def _lse2_padded(lse, length):
    """A natural (batch, heads, seq) lse in base 2, padded with -inf rows."""
    tail = ((0, 0), (0, 0), (0, length - lse.shape[2]))
    return jnp.pad(lse / _LN2, tail, constant_values=-jnp.inf)


def _attention_fwd(forward_geometry, backward_geometry, lowering, q, k, v, forward_tables,
                   backward_tables):
    out, lse = _forward_padded(forward_geometry, forward_tables, lowering, q, k, v)
    return (out, lse), (q, k, v, out, lse, forward_tables, backward_tables)


def _attention_bwd(forward_geometry, backward_geometry, lowering, residuals, cotangents):
    q, k, v, out, lse, forward_tables, backward_tables = residuals
    dout, dlse = cotangents
    dq, dk, dv = block_gradients(q, k, v, out, lse, dout, backward_geometry, backward_tables,
                                 lowering, dlse)
    return dq, dk, dv, no_gradients(forward_tables), no_gradients(backward_tables)


def no_gradients(tables):
    """The (float0) cotangents of a custom_vjp's integer plan tables."""
    return jax.tree.map(lambda t: np.zeros(t.shape, jax.dtypes.float0), tables)


def block_gradients(q, k, v, out, lse, dout, geometry: Geometry, tables, lowering: Lowering,
                    dlse=None, onto=None):
    """dq, dk, dv of attention of q against this k, v block, where out and lse
    are the rows' final values over *all* their keys (so a ring backward can
    take each block's share in turn), and dlse the lse's own cotangent. With
    onto = float32 running sums (dq, dk, dv), the kernels add this block's
    share to them and return the float32 sums (a ring's accumulation done
    inside the kernels)."""
    seq_q, seq_k = q.shape[1], k.shape[1]
    # dS = P * (dP - delta) with delta = rowsum(dO * O) - dlse: lse's own
    # cotangent (context-parallel merges differentiate through it) enters
    # here, since d lse / d S = P. One cheap pass, left to XLA.
    delta = jnp.einsum("bshd,bshd->bhs", dout.astype(jnp.float32), out.astype(jnp.float32))
    if dlse is not None:
        delta = delta - dlse.astype(jnp.float32)
    tail = ((0, 0), (0, 0), (0, geometry.padded_q - seq_q))
    lse2 = _lse2_padded(lse, geometry.padded_q)
    pad_q = lambda x: _pad(x, geometry.padded_q)  # noqa: E731
    if onto is not None:
        dq_in, dk_in, dv_in = onto
        onto = (pad_q(dq_in.astype(jnp.float32)), _pad(dk_in.astype(jnp.float32),
                geometry.padded_k), _pad(dv_in.astype(jnp.float32), geometry.padded_k))
    dq, dk, dv = _backward(pad_q(q), _pad(k, geometry.padded_k), _pad(v, geometry.padded_k),
                           jnp.pad(delta, tail), lse2, pad_q(dout.astype(q.dtype)), geometry,
                           tables, lowering, onto)
    return dq[:, :seq_q], dk[:, :seq_k], dv[:, :seq_k]


_attention.defvjp(_attention_fwd, _attention_bwd)
