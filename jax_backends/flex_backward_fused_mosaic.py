"""jax.pallas_flex's one-pass Mosaic GPU backward (Hopper; v7): dK, dV and
dQ from one kernel, FA3's scheme. Correct on an H100, but at half the
two-pass backward's speed (registers spill, the reduce-adds are not
hidden, the warpgroups meet each strip; docs/pallas_flex.md), so an
option, off by default.

flex_backward_mosaic's dK/dV kernel, with the dQ pass folded in: one
program per (kv block, kv head, batch); two compute warpgroups of 64 key
rows hold K and V while the memory warpgroup feeds 64-row strips of Q,
dO, lse and delta along the plan's kv-block column, for every query head
of the group in turn. Per strip each compute warpgroup forms its 64 x 64
dS^T as the two-kernel backward does (S^T = K Q^T, P^T, dV += P^T dO,
dP^T = V dO^T, dK += dS^T Q), writes it to shared memory, and once both
halves are there computes half of the strip's dQ share, dS K over the
block's 128 keys and 64 of the head's columns, which a TMA reduce-add
puts into a float32 dQ in global memory. The dQ kernel and its recompute
of S and dP go: 5 tile matmuls instead of 7.

Shared memory at head_dim 128: K and V by rows (32 KiB each), K by column
halves for dQ's right operand (32 KiB), two slots of Q and dO strips (64
KiB), lse and delta strips, dS^T (16 KiB) and two float32 dQ halves (32
KiB): 215,184 bytes as lowered (each buffer rounded up to 1 KiB) of the
232,448 an H100 block may use; a third slot would not fit.
Needs what flex_backward_mosaic.problem asks, and head_dim 128 (its
column halves are 64 wide).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_backends import flex_backward_mosaic as two_pass
from jax_backends.flex_kernel_mosaic import (
    COMPUTE_WARPGROUPS,
    ROWS_PER_WARPGROUP,
    fold_visits,
    masked,
    slice_bounds,
    wait_free,
)
from jax_backends.flex_plan import Geometry

_LOG2E = math.log2(math.e)
STRIP = ROWS_PER_WARPGROUP  # query rows a step: half a plan tile
HEAD_DIM = 2 * STRIP  # dQ's columns split between the two compute warpgroups
# dQ shares' float32 staging in shared memory: 128-byte swizzled rows, so
# the wgmma-layout store avoids bank conflicts (unswizzled, a warp's rows
# 256 bytes apart share banks). Measured no faster than unswizzled on an
# H100 (results/gpu/2026-11-27-pallas-flex-v6b/), but not slower.
DQ_TRANSFORMS = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
# The float32 dQ sum in global memory: "tiles" gives each (strip, column
# half) share one contiguous 16 KiB (FA3 keeps its dQ sum contiguous per
# block too), permuted to dQ's layout afterwards; "rows" is dQ's own
# layout, each share 64 runs of 256 bytes, 32 KiB apart. Both read the
# same on an H100 (the same rows).
DQ_LAYOUT = "tiles"


def problem(block_q: int, block_k: int, dtype, head_dim: int) -> str | None:
    """Why this backward cannot run these inputs; None if it can."""
    if head_dim != HEAD_DIM:
        return f"the one-pass Mosaic backward takes head_dim {HEAD_DIM}, not {head_dim}"
    return two_pass.problem(block_q, block_k, dtype, head_dim)


def backward(q, k, v, dout, lse2, delta, geometry: Geometry, tables, *,
             heads_together: bool = False, stages: int = 2):
    """(dq, dk, dv) of padded inputs, as flex_backward_mosaic.backward."""
    if stages != 2:
        raise ValueError(f"stages={stages}: the one-pass backward fits two slots only")
    batch, padded_q, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    rows, dtype, block_q = ROWS_PER_WARPGROUP, q.dtype, geometry.block_q
    strips = block_q // STRIP
    scale = 1.0 / math.sqrt(head_dim)
    qk_scale = scale * _LOG2E
    lse = jnp.where(lse2 == -jnp.inf, 0.0, lse2)  # rows that see nothing meet only masks
    layout = DQ_LAYOUT
    if layout not in ("tiles", "rows"):
        raise ValueError(f"DQ_LAYOUT={layout!r}: choose 'tiles' or 'rows'")
    if layout == "tiles":
        shape = (batch, heads, padded_q // STRIP, COMPUTE_WARPGROUPS, STRIP, STRIP)

        def dq_share_ref(dq_ref, b, head, q0, wg):
            return dq_ref.at[b, head, q0 // STRIP, wg]

        def as_dq(total):  # (b, h, strip, half, row, col) -> (b, strip, row, h, half, col)
            return total.transpose(0, 2, 4, 1, 3, 5).reshape(q.shape)
    else:
        shape = q.shape

        def dq_share_ref(dq_ref, b, head, q0, wg):
            return dq_ref.at[b, pl.ds(q0, STRIP), head, pl.ds(wg * STRIP, STRIP)]

        def as_dq(total):
            return total

    def kernel(*refs):
        *walk, ids, slices, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, dk_ref, \
            dv_ref, scoped = refs
        buffers, own, loaded, consumed, ds_ready, ds_free = scoped
        k_smem2, k_columns, v_smem2, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem = \
            buffers
        lo, hi = walk[4], walk[5]
        b, kv_head = lax.axis_index("batch"), lax.axis_index("kv_heads")
        kj = walk[7][lax.axis_index("kv_seq")]
        wg = lax.axis_index("wg")
        slot_of = lambda step: lax.rem(step, jnp.int32(stages))  # noqa: E731

        def for_each_strip(body, carry):
            """body(step, q head, q block, j, strip, carry) over the group's
            heads, the column's visits and each visit's strips; step counts
            strips and runs on across heads."""
            def one_visit(step, head, qb, j, c):
                for strip in range(strips):
                    c = body(step * strips + strip, head, qb, j, strip, c)
                return c

            def one_head(h, state):
                head = kv_head * group + h
                return fold_visits(walk, kj, lambda step, qb, j, c: one_visit(step, head, qb, j,
                                                                              c), state)

            return lax.fori_loop(0, group, one_head, (jnp.int32(0), carry))

        @pl.when(wg < COMPUTE_WARPGROUPS)
        def _compute():
            plgpu.set_max_registers(two_pass.DKV_REGISTERS[0], action="increase")
            k_smem, v_smem, k_half = k_smem2.at[wg], v_smem2.at[wg], k_columns.at[wg]
            row0 = kj * two_pass.BLOCK + wg * rows
            span = (b, pl.ds(row0, rows), kv_head)
            columns = (b, pl.ds(kj * two_pass.BLOCK, two_pass.BLOCK), kv_head,
                       pl.ds(wg * STRIP, STRIP))
            two_pass.copy_and_wait(((k_ref.at[span], k_smem), (v_ref.at[span], v_smem),
                                    (k_ref.at[columns], k_half)), own, wg)
            q_loaded, do_loaded, lse_loaded, delta_loaded = loaded

            def mask_strip(first, j, col0, s_t):
                return masked(s_t, first, ids, slices, lo[kj, j], hi[kj, j], row0, col0,
                              transposed=True)

            def visit(step, head, qb, j, strip, carry):
                dk, dv = carry
                slot = slot_of(step)
                first = None if j is None else slice_bounds(ids, slices, lo[kj, j])
                q0 = qb * block_q + strip * STRIP
                plgpu.barrier_wait(q_loaded.at[slot])
                mask = None if j is None else functools.partial(mask_strip, first, j, q0)
                dk, dv, ds_t = two_pass.dkv_strip(
                    k_smem, v_smem, q_smem.at[slot], do_smem.at[slot], lse_smem.at[slot],
                    delta_smem.at[slot], dk, dv, mask,
                    (lse_loaded.at[slot], do_loaded.at[slot], delta_loaded.at[slot]), qk_scale)
                plgpu.barrier_arrive(consumed.at[slot])

                # The strip's dS^T from both warpgroups, then this one's dQ columns.
                wait_free(step, 1, ds_free)  # both read the last strip's dS^T
                ds_smem.at[pl.ds(wg * rows, rows)][...] = ds_t
                plgpu.commit_smem()
                plgpu.barrier_arrive(ds_ready)
                plgpu.barrier_wait(ds_ready)
                dq_share = two_pass.product(plgpu.transpose_ref(ds_smem, (1, 0)), k_half)
                plgpu.barrier_arrive(ds_free)
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last share has left
                dq_smem.at[wg][...] = dq_share
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(dq_smem.at[wg], dq_share_ref(dq_ref, b, head, q0, wg),
                                        reduction_op="add")
                return dk, dv

            zeros = plgpu.layout_cast(jnp.zeros((rows, head_dim), jnp.float32),
                                      plgpu.Layout.WGMMA)
            _, (dk, dv) = for_each_strip(visit, (zeros, zeros))
            # The last dQ shares are waited for too (the same thread issued them).
            two_pass.store_kv_gradients(dk * scale, dv, k_smem, v_smem, dk_ref.at[span],
                                        dv_ref.at[span])

        @pl.when(wg == COMPUTE_WARPGROUPS)
        def _memory():
            plgpu.set_max_registers(two_pass.DKV_REGISTERS[1], action="decrease")

            def load(step, head, qb, j, strip, carry):
                slot = slot_of(step)
                wait_free(step, stages, consumed.at[slot])
                two_pass.load_query_rows((q_ref, do_ref, lse_ref, delta_ref),
                                         (q_smem, do_smem, lse_smem, delta_smem), loaded, slot,
                                         (b, head), qb * block_q + strip * STRIP, STRIP)
                return carry

            for_each_strip(load, jnp.int32(0))

    def entry(*refs):
        pl.run_scoped(
            lambda *scoped: kernel(*refs, scoped),
            [two_pass.tiles(COMPUTE_WARPGROUPS, rows, head_dim, dtype),
             two_pass.tiles(COMPUTE_WARPGROUPS, two_pass.BLOCK, STRIP, dtype),
             two_pass.tiles(COMPUTE_WARPGROUPS, rows, head_dim, dtype),
             two_pass.tiles(stages, STRIP, head_dim, dtype),
             two_pass.tiles(stages, STRIP, head_dim, dtype),
             plgpu.SMEM((stages, STRIP), jnp.float32),
             plgpu.SMEM((stages, STRIP), jnp.float32),
             plgpu.SMEM((two_pass.BLOCK, STRIP), dtype, transforms=two_pass.TRANSFORMS),
             plgpu.SMEM((COMPUTE_WARPGROUPS, STRIP, STRIP), jnp.float32, transforms=DQ_TRANSFORMS)],
            (plgpu.Barrier(num_barriers=COMPUTE_WARPGROUPS),) * 3,
            (plgpu.Barrier(num_barriers=stages),) * 4,
            plgpu.Barrier(num_arrivals=COMPUTE_WARPGROUPS, num_barriers=stages),
            plgpu.Barrier(num_arrivals=COMPUTE_WARPGROUPS),
            plgpu.Barrier(num_arrivals=COMPUTE_WARPGROUPS),
            collective_axes="wg",
        )

    grid, names = ((kv_heads, geometry.num_k_blocks, batch), ("kv_heads", "kv_seq", "batch"))
    if not heads_together:
        grid, names = (grid[1], grid[0], batch), (names[1], names[0], "batch")
    # pl.kernel, not plgpu.kernel: the latter's vmap wrapper takes no Ref
    # operands, and dQ's float32 sum is one (the kernel adds into it).
    call = pl.kernel(
        entry,
        out_type=[jax.ShapeDtypeStruct(k.shape, dtype), jax.ShapeDtypeStruct(v.shape, dtype)],
        mesh=plgpu.Mesh(grid=grid, grid_names=names, num_threads=COMPUTE_WARPGROUPS + 1,
                        thread_name="wg", kernel_name="lcab_flex_dkv_dq_mosaic"),
        compiler_params=plgpu.CompilerParams(approx_math=True),
        name="lcab_flex_dkv_dq_mosaic",
    )
    dq_sum = jax.new_ref(jnp.zeros(shape, jnp.float32))
    dk, dv = call(*two_pass.walk_inputs(tables, "by_k"), q, k, v, dout, lse, delta, dq_sum)
    return (as_dq(jax.freeze(dq_sum)) * scale).astype(dtype), dk, dv
