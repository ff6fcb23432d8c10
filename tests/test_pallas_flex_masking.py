"""How the Mosaic kernels mask a partial tile (mosaic_fwd_sm90.row_range,
in_range), computed with jnp on the host over whole small masks: each
slice's column range per row, and every element test, must rebuild the
mask's dense matrix exactly, by query rows (forward, dQ) and by key rows
(dK/dV). The kernels' own numbers are checked on a GPU."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jax_backends.pallas_flex import mosaic_fwd_sm90
from lcab.masks import MASK_NAMES, small_mask


def _dense(mask, test: str, transposed: bool, tile: int = 128) -> np.ndarray:
    """The mask rebuilt from its slices the way `masked` tests a tile, tile
    by tile of `tile` columns: each tile's own column iota and its first
    column col0, as the kernels see them."""
    table = np.asarray(mask.slice_table, dtype=np.int32)
    ids, flat = np.arange(len(table), dtype=np.int32), table.ravel()
    n_rows, n_cols = ((mask.seqlen_k, mask.seqlen_q) if transposed
                      else (mask.seqlen_q, mask.seqlen_k))
    r = jnp.arange(n_rows, dtype=jnp.int32)
    local = jnp.arange(tile, dtype=jnp.int32)[None, :]
    tiles = []
    for col0 in range(0, n_cols, tile):
        seen = jnp.zeros((n_rows, tile), bool)
        for t in range(len(table)):
            start, stop = mosaic_fwd_sm90.row_range(
                mosaic_fwd_sm90.slice_bounds(ids, flat, t), r, transposed)
            if test == "bounds":
                c = local + col0
                sees = (c >= start[:, None]) & (c < stop[:, None])
            elif test == "folded":
                sees = (local >= (start - col0)[:, None]) & (local < (stop - col0)[:, None])
            else:
                sees = mosaic_fwd_sm90.in_range(local, start - col0, stop - col0,
                                                lambda x: x[:, None])
            seen = seen | sees
        tiles.append(seen)
    return np.asarray(jnp.concatenate(tiles, axis=1))[:, :n_cols]


@pytest.mark.parametrize("test", mosaic_fwd_sm90.MASK_TESTS)
@pytest.mark.parametrize("name", MASK_NAMES)
def test_each_element_test_rebuilds_every_family_by_query_and_by_key_rows(name, test):
    mask = small_mask(name, 300)
    dense = mask.to_dense()
    assert (_dense(mask, test, transposed=False) == dense).all()
    assert (_dense(mask, test, transposed=True) == dense.T).all()


@given(start=st.integers(-300, 300), stop=st.integers(-300, 300),
       offset=st.integers(-1000, 1000))
def test_the_one_compare_test_is_the_two_compare_test(start, stop, offset):
    """Any row range, empty or reversed, against columns offset by a tile's
    first column: c - start read unsigned is below the width only inside."""
    c = jnp.arange(128, dtype=jnp.int32)[None, :] + offset
    start_v, stop_v = jnp.array([start], jnp.int32), jnp.array([stop], jnp.int32)
    found = mosaic_fwd_sm90.in_range(c, start_v, stop_v, lambda x: x[:, None])
    assert (np.asarray(found) == ((np.asarray(c) >= start) & (np.asarray(c) < stop))).all()


def _partial_tiles(plan):
    """(q block, k block, the tile's slice ids) of each partial tile of the
    plan's forward walk."""
    walk = plan.by_q
    for qb in range(plan.num_q_blocks):
        for j in range(walk.partials[qb]):
            ids = plan.slice_ids[walk.lo[qb, j]:walk.hi[qb, j]]
            yield qb, int(walk.block[qb, j]), ids


@pytest.mark.parametrize("blocks", [(128, 128), (64, 64), (128, 192)])
@pytest.mark.parametrize("name", MASK_NAMES)
def test_merged_ranges_rebuild_every_tile_exactly_where_the_plan_says_they_can(name, blocks):
    """v27's per-row hull (merge_range over a tile's slices, then one
    in_range test a element) against the dense mask, tile by tile: where
    Geometry.one_range_rows holds it rebuilds every partial tile exactly;
    where it does not, some row of some tile sees two runs (so the flag is
    no stricter than it must be)."""
    from jax_backends.pallas_flex.plan import make_plan

    mask = small_mask(name, 1000)
    plan = make_plan(mask, *blocks)
    dense = mask.to_dense()
    flat = np.asarray(plan.slices)
    block_q, block_k = blocks
    exact = True
    for qb, kb, ids in _partial_tiles(plan):
        r = jnp.arange(qb * block_q, (qb + 1) * block_q, dtype=jnp.int32)
        hull = mosaic_fwd_sm90.merge_range(None, mosaic_fwd_sm90.slice_bounds(ids, flat, 0), r)
        for t in range(1, len(ids)):
            hull = mosaic_fwd_sm90.merge_range(hull, mosaic_fwd_sm90.slice_bounds(ids, flat, t),
                                               r)
        col0 = kb * block_k
        local = jnp.arange(block_k, dtype=jnp.int32)[None, :]
        sees = np.asarray(mosaic_fwd_sm90.in_range(local, hull[0] - col0, hull[1] - col0,
                                                   lambda x: x[:, None]))
        want = np.zeros((block_q, block_k), bool)
        tile = dense[qb * block_q:(qb + 1) * block_q, col0:col0 + block_k]
        want[:tile.shape[0], :tile.shape[1]] = tile
        exact &= bool((sees == want).all())
    assert exact == plan.geometry.one_range_rows


def test_a_row_that_sees_two_runs_of_a_tile_keeps_the_loop():
    """Two slices leave a gap inside one tile's columns: the plan says so,
    and merging would have filled the gap."""
    from jax_backends.pallas_flex.plan import make_plan
    from lcab.masks import AttnMask, AttnSlice

    gap = AttnMask(256, 256, [AttnSlice(0, 256, 0, 10), AttnSlice(0, 256, 50, 60)])
    assert not make_plan(gap, 128, 128).geometry.one_range_rows
    # A gap (columns 120-136) split by a tile boundary: each tile meets one
    # slice, so each row sees one run of each tile.
    split = AttnMask(256, 256, [AttnSlice(0, 256, 0, 120), AttnSlice(0, 256, 136, 256)])
    assert make_plan(split, 128, 128).geometry.one_range_rows
    touching = AttnMask(256, 256, [AttnSlice(0, 256, 0, 100), AttnSlice(0, 256, 100, 256)])
    assert make_plan(touching, 128, 128).geometry.one_range_rows
