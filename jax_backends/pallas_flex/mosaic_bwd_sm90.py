"""jax.pallas_flex's backward through Pallas's Mosaic GPU lowering (Hopper).

Two kernels over one FlexPlan of 128 x 128 tiles, as the Triton backward
(triton.py) but with wgmma from shared memory and a TMA warpgroup:

- dQ, one program per (q block, q head, batch): two compute warpgroups of
  64 query rows each hold Q, dO, lse and delta; the memory warpgroup
  feeds K/V tiles along the plan's q-block row into a ring of `stages`
  slots. Per tile: S = Q K^T, P = exp2(S - lse), dP = dO V^T,
  dS = P (dP - delta), dQ += dS K.
- dK/dV, one program per (kv block, kv head, batch): two compute
  warpgroups of 64 key rows each hold K and V; the memory warpgroup feeds
  Q, dO, lse and delta tiles along the plan's kv-block column, for every
  query head of the group in turn (GQA: K/V never repeated, no atomics).
  Per tile, transposed so the key rows stay the wgmma's M: S^T = K Q^T,
  P^T, dV += P^T dO, dP^T = V dO^T, dK += dS^T Q.

Partial tiles are masked as in the Mosaic forward (mosaic_walk.masked,
one column range per row and slice). Needs bf16 or f16, head_dim 64 or
128 (shared memory) and a 128 x 128 plan (`problem`). Like the forward it
has no CPU run; the tests lower it to Mosaic GPU's MLIR.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_backends.pallas_flex import head_split
from jax_backends.pallas_flex.mosaic_walk import (
    COMPUTE_WARPGROUPS,
    ROWS_PER_WARPGROUP,
    accumulate,
    feed_kv,
    fold_visits,
    launch_grid,
    masked,
    slice_bounds,
    wait_free,
)
from jax_backends.pallas_flex.plan import Geometry

_LOG2E = math.log2(math.e)
BLOCK = ROWS_PER_WARPGROUP * COMPUTE_WARPGROUPS  # both plan blocks: 128
TRANSFORMS = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
ROW = plgpu.Layout.WGMMA.reduce(1)  # one value per tile row
COLUMN = plgpu.Layout.WGMMA.reduce(0)  # one value per tile column
PARTS = (1, 2)  # strips per tile (Config.parts)
# dK/dV's registers per thread: compute and memory warpgroups (setmaxnreg;
# 2 x 128 x 240 + 128 x 24 of the SM's 64k, FA3's split). Timed alone on
# a GPU, dK/dV was faster so than with 232 / 40 (docs/pallas_flex.md).
DKV_REGISTERS = (240, 24)
# How each kernel tests a partial tile's elements (mosaic_walk.MASK_TESTS;
# docs/pallas_flex.md, v12 and v14). dQ: "bounds"; the forward's "offset"
# cost the backward 2-3 % on causal documents. dK/dV: "folded", its tile's
# first column taken off the row's bounds once per row instead of added to
# every element: 164-272 bytes a thread spilled (244 with "bounds") and
# +1.3-2.1 % backward on the window (level on causal documents).
DQ_MASK_TEST = "bounds"
DKV_MASK_TEST = "folded"
# A dK/dV strip reads its lse and delta (column vectors in shared memory)
# before the products they follow are issued: lse before S^T's, delta
# before dV's and dP^T's, so the loads' latency passes under the matmuls
# (v28, docs/pallas_flex.md). Read right before their first use instead,
# their consumers held most of dK/dV's short-scoreboard stalls, and the
# backward ran 2.5-7 % slower at 16k-32k on an H100 though ptxas spills
# less that way (164-192 against 232-280 bytes a thread).


def problem(block_q: int, block_k: int, dtype, head_dim: int) -> str | None:
    """Why this backward cannot run these inputs; None if it can."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"the Mosaic backward takes bf16 or f16 (wgmma), not {jnp.dtype(dtype).name}"
    if head_dim not in (64, 128):
        return f"the Mosaic backward takes head_dim 64 or 128 (shared memory), not {head_dim}"
    if (block_q, block_k) != (BLOCK, BLOCK):
        return (f"the Mosaic backward needs backward blocks {BLOCK} x {BLOCK}, "
                f"not {block_q} x {block_k}")
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """The Mosaic backward's settings."""

    stages: int = 2  # shared-memory slots of the streamed tiles' ring
    # Each tile's streamed side (dQ's keys, dK/dV's queries) in this many
    # strips, so a warpgroup's scores take 1/parts of the registers (2 was
    # the faster measured: docs/pallas_flex.md, "Constants").
    parts: int = 2

    def __post_init__(self):
        if self.parts not in PARTS:
            raise ValueError(f"parts={self.parts}: choose one of {', '.join(map(str, PARTS))}")
        if self.stages < 2:
            raise ValueError(f"stages={self.stages}: the ring needs 2 or more")


def backward(q, k, v, dout, lse2, delta, geometry: Geometry, tables,
             heads_together: bool = False, config: Config = Config(),
             dq_heads_together: bool = True, dkv_split: int = 1):
    """(dq, dk, dv) of padded inputs: lse2 (base 2) and delta are
    (batch, heads, padded_q) float32, as ops._backward takes them.
    heads_together: dK/dV launches every kv head of a block together;
    dq_heads_together: dQ every q head of a block (launch_grid);
    dkv_split: dK/dV programs a kv head's block (head_split)."""
    stages, parts = config.stages, config.parts
    scale = 1.0 / math.sqrt(q.shape[3])
    lse_safe = jnp.where(lse2 == -jnp.inf, 0.0, lse2)  # rows that see nothing meet only masks
    dq = _dq(q, k, v, dout, lse_safe, delta, geometry, tables, scale, stages, parts,
             dq_heads_together)
    dk, dv = _dkv(q, head_split.spread(k, dkv_split), head_split.spread(v, dkv_split), dout,
                  lse_safe, delta, geometry, tables, scale, stages, heads_together, parts)
    return dq, head_split.fold(dk, dkv_split), head_split.fold(dv, dkv_split)


def _dq(q, k, v, dout, lse, delta, geometry: Geometry, tables, scale, stages, parts,
        heads_together):
    batch, _, heads, head_dim = q.shape
    group = heads // k.shape[2]
    rows, dtype = ROWS_PER_WARPGROUP, q.dtype
    cols = geometry.block_k // parts
    qk_scale = scale * _LOG2E

    def kernel(*refs):
        *walk, ids, slices, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, scoped = refs
        (q_smem2, do_smem2, lse_smem2, delta_smem2, k_smem, v_smem), own, loaded, consumed = scoped
        k_loaded, v_loaded = loaded
        k_consumed, v_consumed = consumed
        lo, hi = walk[4], walk[5]
        b, head = lax.axis_index("batch"), lax.axis_index("heads")
        qi = walk[7][lax.axis_index("q_seq")]
        wg = lax.axis_index("wg")
        slot_of = lambda step: lax.rem(step, jnp.int32(stages))

        @pl.when(wg < COMPUTE_WARPGROUPS)
        def _compute():
            plgpu.set_max_registers(232, action="increase")
            q_smem, do_smem = q_smem2.at[wg], do_smem2.at[wg]
            row0 = qi * BLOCK + wg * rows
            span = (b, pl.ds(row0, rows), head)
            vector = (b, head, pl.ds(row0, rows))
            copy_and_wait(((q_ref.at[span], q_smem), (do_ref.at[span], do_smem),
                            (lse_ref.at[vector], lse_smem2.at[wg]),
                            (delta_ref.at[vector], delta_smem2.at[wg])), own, wg)
            lse = plgpu.load(lse_smem2.at[wg], (), layout=ROW)
            delta = plgpu.load(delta_smem2.at[wg], (), layout=ROW)

            def visit(step, kb, j, dq):
                slot = slot_of(step)
                first = None if j is None else slice_bounds(ids, slices, lo[qi, j])
                plgpu.barrier_wait(k_loaded.at[slot])
                for part in range(parts):  # the tile's keys in `parts` column strips
                    k_part = k_smem.at[slot, pl.ds(part * cols, cols)]
                    v_part = v_smem.at[slot, pl.ds(part * cols, cols)]
                    s = product(q_smem, plgpu.transpose_ref(k_part, (1, 0)))
                    if j is not None:
                        s = masked(s, first, ids, slices, lo[qi, j], hi[qi, j], row0,
                                   kb * geometry.block_k + part * cols, test=DQ_MASK_TEST)
                    p = jnp.exp2(s * qk_scale - lax.broadcast_in_dim(lse, s.shape, [0]))
                    if part == 0:
                        plgpu.barrier_wait(v_loaded.at[slot])
                    dp = product(do_smem, plgpu.transpose_ref(v_part, (1, 0)))
                    ds = p * (dp - lax.broadcast_in_dim(delta, dp.shape, [0]))
                    dq = accumulate(dq, ds.astype(dtype), k_part)
                plgpu.barrier_arrive(v_consumed.at[slot])
                plgpu.barrier_arrive(k_consumed.at[slot])
                return dq

            dq = plgpu.layout_cast(jnp.zeros((rows, head_dim), jnp.float32), plgpu.Layout.WGMMA)
            _, dq = fold_visits(walk, qi, visit, (jnp.int32(0), dq))
            q_smem[...] = (dq * scale).astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[span])
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == COMPUTE_WARPGROUPS)
        def _memory():
            feed_kv(walk, qi, (b, lax.div(head, jnp.int32(group))), geometry.block_k, stages,
                    ((k_ref, k_smem, k_loaded, k_consumed), (v_ref, v_smem, v_loaded, v_consumed)))

    def entry(*refs):
        pl.run_scoped(
            lambda *scoped: kernel(*refs, scoped),
            [tiles(COMPUTE_WARPGROUPS, rows, head_dim, dtype),
             tiles(COMPUTE_WARPGROUPS, rows, head_dim, dtype),
             plgpu.SMEM((COMPUTE_WARPGROUPS, rows), jnp.float32),
             plgpu.SMEM((COMPUTE_WARPGROUPS, rows), jnp.float32),
             tiles(stages, geometry.block_k, head_dim, dtype),
             tiles(stages, geometry.block_k, head_dim, dtype)],
            (plgpu.Barrier(num_barriers=COMPUTE_WARPGROUPS),) * 4,
            (plgpu.Barrier(num_barriers=stages),) * 2,
            (plgpu.Barrier(num_arrivals=COMPUTE_WARPGROUPS, num_barriers=stages),) * 2,
            collective_axes="wg",
        )

    grid, grid_names = launch_grid(("q_seq", geometry.num_q_blocks), ("heads", heads), batch,
                                   heads_together)
    call = plgpu.kernel(
        entry,
        out_type=jax.ShapeDtypeStruct(q.shape, dtype),
        grid=grid,
        grid_names=grid_names,
        num_threads=COMPUTE_WARPGROUPS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        kernel_name="lcab_flex_dq_mosaic",
    )
    return call(*walk_inputs(tables, "by_q"), q, k, v, dout, lse, delta)


def _dkv(q, k, v, dout, lse, delta, geometry: Geometry, tables, scale, stages,
         heads_together, parts):
    batch, _, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    rows, dtype, block_q = ROWS_PER_WARPGROUP, q.dtype, geometry.block_q
    cols = block_q // parts
    qk_scale = scale * _LOG2E

    def kernel(*refs):
        *walk, ids, slices, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, \
            scoped = refs
        (k_smem2, v_smem2, q_smem, do_smem, lse_smem, delta_smem), own, loaded, consumed = scoped
        lo, hi = walk[4], walk[5]
        b, kv_head = lax.axis_index("batch"), lax.axis_index("kv_heads")
        kj = walk[7][lax.axis_index("kv_seq")]
        wg = lax.axis_index("wg")
        slot_of = lambda step: lax.rem(step, jnp.int32(stages))

        def for_each_head(body, carry):
            """body(step, q head, q block, j, carry) over the group's heads
            and the column's visits; the step runs on across heads."""
            def one_head(h, state):
                head = kv_head * group + h
                return fold_visits(walk, kj, lambda step, qb, j, c: body(step, head, qb, j, c),
                                   state)

            return lax.fori_loop(0, group, one_head, (jnp.int32(0), carry))

        @pl.when(wg < COMPUTE_WARPGROUPS)
        def _compute():
            plgpu.set_max_registers(DKV_REGISTERS[0], action="increase")
            k_smem, v_smem = k_smem2.at[wg], v_smem2.at[wg]
            row0 = kj * BLOCK + wg * rows
            span = (b, pl.ds(row0, rows), kv_head)
            copy_and_wait(((k_ref.at[span], k_smem), (v_ref.at[span], v_smem)), own, wg)
            q_loaded, do_loaded, lse_loaded, delta_loaded = loaded

            def mask_strip(first, j, col0, s_t):
                return masked(s_t, first, ids, slices, lo[kj, j], hi[kj, j], row0, col0,
                              transposed=True, test=DKV_MASK_TEST)

            def visit(step, head, qb, j, carry):
                dk, dv = carry
                slot = slot_of(step)
                first = None if j is None else slice_bounds(ids, slices, lo[kj, j])
                plgpu.barrier_wait(q_loaded.at[slot])
                for part in range(parts):  # the tile's queries in `parts` strips
                    strip = pl.ds(part * cols, cols)
                    mask = None if j is None else functools.partial(
                        mask_strip, first, j, qb * block_q + part * cols)
                    waits = (lse_loaded.at[slot], do_loaded.at[slot],
                             delta_loaded.at[slot]) if part == 0 else ()
                    dk, dv, _ = dkv_strip(
                        k_smem, v_smem, q_smem.at[slot, strip], do_smem.at[slot, strip],
                        lse_smem.at[slot, strip], delta_smem.at[slot, strip], dk, dv, mask,
                        waits, qk_scale)
                plgpu.barrier_arrive(consumed.at[slot])
                return dk, dv

            zeros = plgpu.layout_cast(jnp.zeros((rows, head_dim), jnp.float32),
                                      plgpu.Layout.WGMMA)
            _, (dk, dv) = for_each_head(visit, (zeros, zeros))
            store_kv_gradients(dk * scale, dv, k_smem, v_smem, dk_ref.at[span], dv_ref.at[span])

        @pl.when(wg == COMPUTE_WARPGROUPS)
        def _memory():
            plgpu.set_max_registers(DKV_REGISTERS[1], action="decrease")

            def load(step, head, qb, j, carry):
                slot = slot_of(step)
                wait_free(step, stages, consumed.at[slot])
                load_query_rows((q_ref, do_ref, lse_ref, delta_ref),
                                (q_smem, do_smem, lse_smem, delta_smem), loaded, slot,
                                (b, head), qb * block_q, block_q)
                return carry

            for_each_head(load, jnp.int32(0))

    def entry(*refs):
        pl.run_scoped(
            lambda *scoped: kernel(*refs, scoped),
            [tiles(COMPUTE_WARPGROUPS, rows, head_dim, dtype),
             tiles(COMPUTE_WARPGROUPS, rows, head_dim, dtype),
             tiles(stages, block_q, head_dim, dtype),
             tiles(stages, block_q, head_dim, dtype),
             plgpu.SMEM((stages, block_q), jnp.float32),
             plgpu.SMEM((stages, block_q), jnp.float32)],
            (plgpu.Barrier(num_barriers=COMPUTE_WARPGROUPS),) * 2,
            (plgpu.Barrier(num_barriers=stages),) * 4,
            plgpu.Barrier(num_arrivals=COMPUTE_WARPGROUPS, num_barriers=stages),
            collective_axes="wg",
        )

    # Every kv head of a block together, or one head after another (ops decides).
    grid, names = launch_grid(("kv_seq", geometry.num_k_blocks), ("kv_heads", kv_heads), batch,
                              heads_together)
    call = plgpu.kernel(
        entry,
        out_type=[jax.ShapeDtypeStruct(k.shape, dtype), jax.ShapeDtypeStruct(v.shape, dtype)],
        grid=grid,
        grid_names=names,
        num_threads=COMPUTE_WARPGROUPS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        kernel_name="lcab_flex_dkv_mosaic",
    )
    return call(*walk_inputs(tables, "by_k"), q, k, v, dout, lse, delta)


def dkv_strip(k_smem, v_smem, q_part, do_part, lse_part, delta_part, dk, dv, mask, waits,
              qk_scale):
    """One strip of a dK/dV tile, transposed so the warpgroup's key rows
    are wgmma's M: S^T = K Q^T (mask(S^T) on a partial tile), P^T,
    dV += P^T dO, dP^T = V dO^T, dS^T, dK += dS^T Q. waits: the lse, dO and
    delta barriers to wait for before their first use (empty: loaded).
    lse and delta are read before the products they follow are issued.
    Returns dK, dV and dS^T in the inputs' dtype."""
    lse_wait, do_wait, delta_wait = waits or (None,) * 3
    dtype = q_part.dtype

    def column(wait, part):
        if wait is not None:
            plgpu.barrier_wait(wait)
        return plgpu.load(part, (), layout=COLUMN)

    lse = column(lse_wait, lse_part)
    s_t = product(k_smem, plgpu.transpose_ref(q_part, (1, 0)))
    if mask is not None:
        s_t = mask(s_t)
    p_t = jnp.exp2(s_t * qk_scale - lax.broadcast_in_dim(lse, s_t.shape, [1]))
    if do_wait is not None:
        plgpu.barrier_wait(do_wait)
    delta = column(delta_wait, delta_part)

    def dv_and_dp(refs):  # two wgmmas, one wait
        dv_ref, dp_ref = refs
        plgpu.wgmma(dv_ref, p_t.astype(dtype), do_part)
        plgpu.wgmma(dp_ref, v_smem, plgpu.transpose_ref(do_part, (1, 0)))

    zeros = plgpu.layout_cast(jnp.zeros(s_t.shape, jnp.float32), plgpu.Layout.WGMMA)
    dv, dp_t = pl.run_state(dv_and_dp)((plgpu.ACC.init(dv), plgpu.ACC.init(zeros)))
    ds_t = (p_t * (dp_t - lax.broadcast_in_dim(delta, dp_t.shape, [1]))).astype(dtype)
    return accumulate(dk, ds_t, q_part), dv, ds_t


def store_kv_gradients(dk, dv, k_smem, v_smem, dk_gmem, dv_gmem):
    """A dK/dV program's epilogue: both gradients through the (now free) K
    and V tiles in shared memory to global memory by TMA, then waited."""
    k_smem[...] = dk.astype(k_smem.dtype)
    v_smem[...] = dv.astype(v_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(k_smem, dk_gmem)
    plgpu.copy_smem_to_gmem(v_smem, dv_gmem)
    plgpu.wait_smem_to_gmem(0)


def load_query_rows(sources, rings, loaded, slot, at, row0, rows: int):
    """A dK/dV memory warpgroup's feed: rows [row0, row0 + rows) of Q and
    dO (tiles) and of lse and delta (vectors) of sources, at (batch, query
    head) = `at`, copied by TMA into ring slot `slot` of each of rings, each
    on its own barrier array of `loaded`."""
    batch, head = at
    tile, vector = (batch, pl.ds(row0, rows), head), (batch, head, pl.ds(row0, rows))
    q_ref, do_ref, lse_ref, delta_ref = sources
    chosen = (q_ref.at[tile], do_ref.at[tile], lse_ref.at[vector], delta_ref.at[vector])
    for source, ring, ready in zip(chosen, rings, loaded):
        plgpu.copy_gmem_to_smem(source, ring.at[slot], ready.at[slot])


def product(a_smem, b_smem):
    """a @ b of two shared-memory operands, into a fresh float32 accumulator."""
    def run(acc_ref):
        plgpu.wgmma(acc_ref, a_smem, b_smem)
        return acc_ref[...]

    rows, cols = a_smem.shape[0], b_smem.shape[1]
    return pl.run_scoped(run, plgpu.ACC((rows, cols), jnp.float32))


def copy_and_wait(copies, barriers, wg):
    """A compute warpgroup's own tiles: each (source, target) copied by TMA
    on its barrier array's slot `wg`, all issued before any is waited for."""
    for (source, target), barrier in zip(copies, barriers):
        plgpu.copy_gmem_to_smem(source, target, barrier.at[wg])
    for barrier in barriers:
        plgpu.barrier_wait(barrier.at[wg])


def tiles(count: int, rows: int, head_dim: int, dtype):
    return plgpu.SMEM((count, rows, head_dim), dtype, transforms=TRANSFORMS)


def walk_inputs(tables, walk: str):
    return [*tables[walk], tables["slice_ids"], tables["slices"]]
