"""jax.pallas_flex's one-pass Mosaic GPU backward (Hopper; v20 in
docs/pallas_flex.md, option backward_passes=1): dK, dV and dQ from one
kernel, so the dQ kernel and its recompute of S and dP go (5 tile
matmuls for the two-kernel backward's 7).

mosaic_bwd_sm90's dK/dV kernel walking 64-row strips: one program per
(kv block, kv head, batch); two compute warpgroups of 64 key rows hold K
and V; warp 0 of the memory warpgroup feeds strips of Q, dO, lse and
delta along the plan's kv-block column, for every query head of the group
in turn. Per strip each compute warpgroup forms its dS^T
(mosaic_bwd_sm90.dkv_strip), writes it to shared memory, and once both
halves are there computes its 64 columns of the strip's dQ share: dS K
over the block's 128 keys, K's column half taken from both warpgroups' K
tiles (K is held once). It stages the share in float32 in shared memory
and hands it to warp 1 of the memory warpgroup (named barriers, 160
threads), which reduce-adds it by TMA into a float32 dQ in global memory
and frees the slot once the copy has read it: a compute warpgroup waits
for its slot to be read, never for a reduce. v7, the first one-pass
kernel, issued the reduce-adds itself and ran at half the two-kernel
speed; v19 timed this hand-over inside the two-kernel dK/dV kernel.

Shared memory at head_dim 128 and two stages: K and V (32 KiB each), Q
and dO strips (32 KiB each), lse and delta, both warpgroups' dS^T (16
KiB) and their float32 staging slots (32 KiB): about 177 KiB of the
232,448 bytes a Hopper block may use. Needs what mosaic_bwd_sm90.problem
asks, and head_dim 128 (a 64-column half of dQ per compute warpgroup).
Like the other Mosaic kernels it has no CPU run; the tests lower it.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_backends.pallas_flex import mosaic_bwd_sm90 as two_pass
from jax_backends.pallas_flex.mosaic_fwd_sm90 import (
    COMPUTE_WARPGROUPS,
    ROWS_PER_WARPGROUP,
    fold_visits,
    launch_grid,
    masked,
    named_barrier_at,
    slice_bounds,
    wait_free,
)
from jax_backends.pallas_flex.plan import Geometry

_LOG2E = math.log2(math.e)
STRIP = ROWS_PER_WARPGROUP  # query rows a ring step: half a plan tile
HEAD_DIM = COMPUTE_WARPGROUPS * STRIP  # dQ's columns, a half per compute warpgroup
# dQ shares' float32 staging: 128-byte swizzled rows, so the wgmma-layout
# store avoids bank conflicts (v7's, correct on an H100).
DQ_TRANSFORMS = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
# Hardware named barriers (Mosaic GPU keeps 0-3): a compute warpgroup's
# share staged (4 + wg) and its staging slot free (6 + wg), each met by the
# warpgroup and the reducer warp; and both compute warpgroups done with K
# before their epilogue overwrites it with dK.
_STAGED, _FREE, _BOTH_DONE = 4, 6, 8
_SHARE_THREADS = 128 + 32


def problem(block_q: int, block_k: int, dtype, head_dim: int) -> str | None:
    """Why this backward cannot run these inputs; None if it can."""
    if head_dim != HEAD_DIM:
        return (f"the one-pass Mosaic backward takes head_dim {HEAD_DIM} (a 64-column half "
                f"of dQ per compute warpgroup), not {head_dim}")
    return two_pass.problem(block_q, block_k, dtype, head_dim)


def backward(q, k, v, dout, lse2, delta, geometry: Geometry, tables,
             heads_together: bool = False, stages: int = 2):
    """(dq, dk, dv) of padded inputs, as mosaic_bwd_sm90.backward."""
    batch, _, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    rows, dtype, block_q = ROWS_PER_WARPGROUP, q.dtype, geometry.block_q
    strips = block_q // STRIP
    scale = 1.0 / math.sqrt(head_dim)
    qk_scale = scale * _LOG2E
    lse = jnp.where(lse2 == -jnp.inf, 0.0, lse2)  # rows that see nothing meet only masks

    def kernel(*refs):
        *walk, ids, slices, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, dk_ref, \
            dv_ref, scoped = refs
        buffers, own, loaded, consumed, ds_ready, ds_free = scoped
        k_smem2, v_smem2, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem = buffers
        lo, hi = walk[4], walk[5]
        b, kv_head = lax.axis_index("batch"), lax.axis_index("kv_heads")
        kj = walk[7][lax.axis_index("kv_seq")]
        wg = lax.axis_index("wg")
        slot_of = lambda step: lax.rem(step, jnp.int32(stages))

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
            k_smem, v_smem = k_smem2.at[wg], v_smem2.at[wg]
            row0 = kj * two_pass.BLOCK + wg * rows
            span = (b, pl.ds(row0, rows), kv_head)
            two_pass.copy_and_wait(((k_ref.at[span], k_smem), (v_ref.at[span], v_smem)), own,
                                   wg)
            q_loaded, do_loaded, lse_loaded, delta_loaded = loaded

            def mask_strip(first, j, q0, s_t):
                return masked(s_t, first, ids, slices, lo[kj, j], hi[kj, j], row0, q0,
                              transposed=True, test=two_pass.DKV_MASK_TEST)

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

                # Both warpgroups' dS^T in shared memory (both have read the
                # last strip's), then this warpgroup's dQ columns.
                wait_free(step, 1, ds_free)
                ds_smem.at[pl.ds(wg * rows, rows)][...] = ds_t
                plgpu.commit_smem()
                plgpu.barrier_arrive(ds_ready)
                plgpu.barrier_wait(ds_ready)
                share = dq_share(ds_smem, k_smem2, wg)
                plgpu.barrier_arrive(ds_free)
                # The reducer warp has read our last share: stage this one, hand it over.
                named_barrier_at("sync", jnp.int32(_FREE) + wg, _SHARE_THREADS)
                dq_smem.at[wg][...] = share
                plgpu.commit_smem()
                named_barrier_at("arrive", jnp.int32(_STAGED) + wg, _SHARE_THREADS)
                return dk, dv

            zeros = plgpu.layout_cast(jnp.zeros((rows, head_dim), jnp.float32),
                                      plgpu.Layout.WGMMA)
            _, (dk, dv) = for_each_strip(visit, (zeros, zeros))
            # The epilogue writes dK over K, which the other warpgroup's dQ reads.
            named_barrier_at("sync", jnp.int32(_BOTH_DONE), COMPUTE_WARPGROUPS * 128)
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

            def reduce(step, head, qb, j, strip, carry):  # the shares, in the compute order
                rows_at = pl.ds(qb * block_q + strip * STRIP, STRIP)
                for w in range(COMPUTE_WARPGROUPS):
                    named_barrier_at("sync", jnp.int32(_STAGED + w), _SHARE_THREADS)
                    plgpu.copy_smem_to_gmem(dq_smem.at[w],
                                            dq_ref.at[b, rows_at, head, pl.ds(w * STRIP, STRIP)],
                                            reduction_op="add")
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    named_barrier_at("arrive", jnp.int32(_FREE + w), _SHARE_THREADS)
                return carry

            @plgpu.warp_map
            def _(warp):  # warp 0 feeds, warp 1 sums the dQ shares
                @pl.when(warp == 0)
                def _():
                    for_each_strip(load, jnp.int32(0))

                @pl.when(warp == 1)
                def _():
                    for w in range(COMPUTE_WARPGROUPS):  # every staging slot starts free
                        named_barrier_at("arrive", jnp.int32(_FREE + w), _SHARE_THREADS)
                    for_each_strip(reduce, jnp.int32(0))
                    plgpu.wait_smem_to_gmem(0)

    def entry(*refs):
        buffers, barriers = two_pass.dkv_scratch(stages, STRIP, head_dim, dtype)
        # Then both warpgroups' dS^T and their dQ staging; ds_ready, ds_free.
        pl.run_scoped(
            lambda *scoped: kernel(*refs, scoped),
            [*buffers,
             plgpu.SMEM((two_pass.BLOCK, STRIP), dtype, transforms=two_pass.TRANSFORMS),
             plgpu.SMEM((COMPUTE_WARPGROUPS, STRIP, STRIP), jnp.float32,
                        transforms=DQ_TRANSFORMS)],
            *barriers,
            plgpu.Barrier(num_arrivals=COMPUTE_WARPGROUPS),
            plgpu.Barrier(num_arrivals=COMPUTE_WARPGROUPS),
            collective_axes="wg",
        )

    grid, names = launch_grid(("kv_seq", geometry.num_k_blocks), ("kv_heads", kv_heads), batch,
                              heads_together)
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
    dq_sum = jax.new_ref(jnp.zeros(q.shape, jnp.float32))
    dk, dv = call(*two_pass.walk_inputs(tables, "by_k"), q, k, v, dout, lse, delta, dq_sum)
    return (jax.freeze(dq_sum) * scale).astype(dtype), dk, dv


def dq_share(ds_smem, k_smem2, half):
    """A compute warpgroup's columns of a strip's dQ share, float32: dS (the
    strip's 64 query rows by the block's 128 keys, from dS^T in shared
    memory) times K's column half `half` (each warpgroup's 64 keys in turn)."""
    def run(acc_ref):
        for w in range(COMPUTE_WARPGROUPS):
            keys = ds_smem.at[pl.ds(w * ROWS_PER_WARPGROUP, ROWS_PER_WARPGROUP)]
            plgpu.wgmma(acc_ref, plgpu.transpose_ref(keys, (1, 0)),
                        k_smem2.at[w, :, pl.ds(half * STRIP, STRIP)])
        return acc_ref[...]

    return pl.run_scoped(run, plgpu.ACC((STRIP, STRIP), jnp.float32))
