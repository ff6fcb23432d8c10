"""What jax.pallas_flex's Mosaic GPU kernels (Hopper) share: the plan walk.

The forward (mosaic_fwd_sm90) and both backward kernels (mosaic_bwd_sm90)
walk a FlexPlan row the same way: its full tiles as runs, then its partial
tiles (fold_visits), a memory warpgroup feeding each visited K/V (or Q/dO)
block by TMA into a ring of shared-memory slots (feed_kv), and the compute
warpgroups masking a partial tile's scores by the union of its slices
(masked). Also here: the launch order of a grid (launch_grid) and P @ V
accumulated in place (accumulate).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from lcab.masks.slices import BI_CAUSAL, CAUSAL, INV_CAUSAL

ROWS_PER_WARPGROUP = 64  # wgmma's M per warpgroup
COMPUTE_WARPGROUPS = 2
_FAR = 1 << 30  # a diagonal offset no tile reaches: "no edge on this side"
# How a partial tile tests an element against a slice's column range
# [start, stop) of its row (masked's `test`): "bounds", two compares and an
# and on the column (the tile's offset added to each element); "folded",
# the same on the tile's own column with the offset taken off the row's
# bounds instead (per row, not per element); "offset", one unsigned compare
# of the element's offset from the row's start against the row's width,
# both taken per row. The forward takes "offset" (3-5 % faster on sliding
# windows and documents); dQ "bounds" and dK/dV "folded", each kernel's
# measured best (mosaic_bwd_sm90; docs/pallas_flex.md, v12-v15).
MASK_TESTS = ("bounds", "folded", "offset")


def launch_grid(blocks: tuple[str, int], heads: tuple[str, int], batch: int,
                heads_together: bool) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """plgpu.kernel's (grid, grid_names) for one program per (block, head,
    batch), in the launch order asked for.

    Mosaic GPU starts a grid's programs with its *last* axis varying fastest
    (its lowering maps the grid reversed onto CUDA's x, y, z, so that the
    grid runs row-major), the opposite of the Triton lowering, whose first
    axis varies fastest. heads_together puts the heads last: every head of
    a block starts together, blocks in the plan's order (heaviest first).
    Otherwise the blocks go last: one head's blocks after another, so the
    programs running at once share a head's K/V (or Q/dO) in L2.
    """
    inner = (blocks, heads) if heads_together else (heads, blocks)
    axes = (("batch", batch), *inner)
    return tuple(size for _, size in axes), tuple(name for name, _ in axes)


def fold_visits(walk, row, body, state):
    """Fold body(step, block, j, carry) over plan row `row` of a walk's refs
    (Walk.arrays order): its full tiles (j None), then its partial tiles (j
    their index). state is (step, carry): step counts visits, so a ring
    slot follows from it; returns the final state."""
    run_start, run_stop, runs, blocks, _, _, partials, _ = walk

    def full_run(r, state):
        return lax.fori_loop(run_start[row, r], run_stop[row, r],
                             lambda kb, st: (st[0] + 1, body(st[0], kb, None, st[1])), state)

    def partial(j, state):
        return state[0] + 1, body(state[0], blocks[row, j], j, state[1])

    state = lax.fori_loop(0, runs[row], full_run, state)
    return lax.fori_loop(0, partials[row], partial, state)


def feed_kv(walk, row, at, block_k: int, stages: int, buffers):
    """The memory warpgroup of a kernel walking plan row `row`: for every
    visited kv block, and each (ref, ring, loaded, consumed) of `buffers`,
    wait until the ring slot is free again, then copy the block of ref at
    (batch, kv head) = `at` into it by TMA."""
    plgpu.set_max_registers(40, action="decrease")
    feed_row(walk, row, at, block_k, stages, buffers, jnp.int32(0))


def feed_row(walk, row, at, block_k: int, stages: int, buffers, step):
    """feed_kv's loads from ring step `step` on; returns the step after them."""
    batch, kv_head = at

    def load(step, kb, j, carry):
        slot = lax.rem(step, jnp.int32(stages))
        span = (batch, pl.ds(kb * block_k, block_k), kv_head)
        for ref, ring, loaded, consumed in buffers:
            wait_free(step, stages, consumed.at[slot])
            plgpu.copy_gmem_to_smem(ref.at[span], ring.at[slot], loaded.at[slot])
        return carry

    step, _ = fold_visits(walk, row, load, (step, jnp.int32(0)))
    return step


def wait_free(step, stages: int, consumed):
    """Before refilling a ring slot: wait until its last tile was used."""
    @pl.when(step >= stages)
    def _():
        plgpu.barrier_wait(consumed)


def visit_count(walk, row):
    """How many tiles plan row `row` visits."""
    run_start, run_stop, runs, _, _, _, partials, _ = walk
    full = lax.fori_loop(0, runs[row], lambda r, n: n + run_stop[row, r] - run_start[row, r],
                         jnp.int32(0))
    return full + partials[row]


def slice_bounds(ids, slices, t):
    """Slice ids[t] as q0, q1, k0, k1 and its diagonal limits: row r of
    q0 <= r < q1 sees columns k0 <= c < k1 with lower <= c - r <= upper
    (a causal edge, bottom-right: upper = k1 - q1; an inverse one,
    top-left: lower = k0 - q0; no edge: _FAR)."""
    base = ids[t] * 5
    q0, q1, k0, k1, kind = (slices[base + i] for i in range(5))
    upper = jnp.where((kind == CAUSAL) | (kind == BI_CAUSAL), k1 - q1, _FAR)
    lower = jnp.where((kind == INV_CAUSAL) | (kind == BI_CAUSAL), k0 - q0, -_FAR)
    return q0, q1, k0, k1, lower, upper


def masked(s, first, ids, slices, lo, hi, row0, col0, transposed: bool = False,
           test: str = "bounds"):
    """Scores of a partial tile where the union of slices ids[lo:hi] sees
    them, -inf elsewhere; `first` is slice_bounds of ids[lo], loaded
    before the tile's matmul so its latency hides under it. Each slice
    gives every row one column range [start, stop), computed on the rows
    (a thread holds few); `test` (MASK_TESTS) is how an element is tested
    against it. transposed: the tile's rows are keys and its columns
    queries (dK/dV)."""
    rows = plgpu.broadcasted_iota(jnp.int32, s.shape[:1], 0, layout=plgpu.Layout.WGMMA.reduce(1))
    r = rows + row0
    columns = plgpu.broadcasted_iota(jnp.int32, s.shape, 1, layout=plgpu.Layout.WGMMA)
    c = columns + col0 if test == "bounds" else columns

    def per_row(x):  # a row vector over the tile
        return lax.broadcast_in_dim(x, s.shape, [0])

    def add(bounds, scores):
        start, stop = row_range(bounds, r, transposed)
        if test == "bounds":  # per element: an add, two compares, an and, a select
            sees = (c >= per_row(start)) & (c < per_row(stop))
        elif test == "folded":  # per element: two compares, an and, a select
            sees = (c >= per_row(start - col0)) & (c < per_row(stop - col0))
        else:  # per element: a subtract, one compare, a select
            sees = in_range(c, start - col0, stop - col0, per_row)
        return jnp.where(sees, s, scores)

    scores = add(first, -jnp.inf)
    return lax.fori_loop(lo + 1, hi, lambda t, m: add(slice_bounds(ids, slices, t), m), scores)


def row_range(bounds, r, transposed: bool = False):
    """The columns [start, stop) that row r (a vector of rows) of a tile sees
    of one slice (slice_bounds); stop == start where it sees none of them."""
    q0, q1, k0, k1, lower, upper = bounds
    if transposed:  # key row r sees queries r - upper <= c <= r - lower
        row_lo, row_hi, col_lo, col_hi, first_col, last_col = k0, k1, q0, q1, -upper, -lower
    else:  # query row r sees keys r + lower <= c <= r + upper
        row_lo, row_hi, col_lo, col_hi, first_col, last_col = q0, q1, k0, k1, lower, upper
    start = jnp.maximum(r + first_col, col_lo)
    stop = jnp.where((r >= row_lo) & (r < row_hi), jnp.minimum(r + last_col + 1, col_hi), start)
    return start, stop


def in_range(c, start, stop, per_row=lambda x: x):
    """start <= c < stop with one compare per element: c - start, read as
    unsigned, is below the width stop - start (0 where stop <= start) only
    inside the range (a negative offset reads as a huge one). start and
    stop are per row; per_row broadcasts a row vector over the tile."""
    width = jnp.maximum(stop - start, 0).astype(jnp.uint32)
    offset = (c - per_row(start)).astype(jnp.uint32)
    return offset < per_row(width)


def accumulate(acc, p16, v_smem, wait_next=lambda: None):
    """acc + P @ V, accumulated in place by wgmma, running wait_next (e.g.
    for the next K tile) meanwhile."""
    def in_place(acc_ref):
        plgpu.wgmma(acc_ref, p16, v_smem)
        wait_next()

    return pl.run_state(in_place)(plgpu.ACC.init(acc))
