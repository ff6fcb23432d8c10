"""How the Mosaic kernels mask a partial tile (mosaic_fwd_sm90.row_range,
in_range), computed with jnp on the host over whole small masks: each
slice's column range per row, and every element test, must rebuild the
mask's dense matrix exactly, by query rows (forward, dQ) and by key rows
(dK/dV). The kernels' own numbers are checked on a GPU."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
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


def _partial_tiles(plan, walk):
    """(row block, column block, the tile's slice ids) of each partial tile
    of one of the plan's walks (by_q: rows are q blocks; by_k: k blocks)."""
    for row in range(len(walk.partials)):
        for j in range(walk.partials[row]):
            yield row, int(walk.block[row, j]), plan.slice_ids[walk.lo[row, j]:walk.hi[row, j]]


def _hull_is_exact(plan, mask, blocks, transposed: bool) -> bool:
    """Whether v27's per-row hull (merge_range over each partial tile's
    slices, then one in_range test an element) rebuilds every partial tile
    of the plan's walk by query rows (by key rows where transposed)."""
    dense = mask.to_dense().T if transposed else mask.to_dense()
    flat = np.asarray(plan.slices)
    row_size, col_size = blocks[::-1] if transposed else blocks
    exact = True
    for rb, cb, ids in _partial_tiles(plan, plan.by_k if transposed else plan.by_q):
        r = jnp.arange(rb * row_size, (rb + 1) * row_size, dtype=jnp.int32)
        hull = None
        for t in range(len(ids)):
            hull = mosaic_fwd_sm90.merge_range(hull, mosaic_fwd_sm90.slice_bounds(ids, flat, t),
                                               r, transposed)
        col0 = cb * col_size
        local = jnp.arange(col_size, dtype=jnp.int32)[None, :]
        sees = np.asarray(mosaic_fwd_sm90.in_range(local, hull[0] - col0, hull[1] - col0,
                                                   lambda x: x[:, None]))
        want = np.zeros((row_size, col_size), bool)
        tile = dense[rb * row_size:(rb + 1) * row_size, col0:col0 + col_size]
        want[:tile.shape[0], :tile.shape[1]] = tile
        exact &= bool((sees == want).all())
    return exact


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("blocks", [(128, 128), (64, 64), (128, 192)])
@pytest.mark.parametrize("name", MASK_NAMES)
def test_merged_ranges_rebuild_every_tile_exactly_where_the_plan_says_they_can(name, blocks,
                                                                             transposed):
    """v27's per-row hull against the dense mask, tile by tile, by query
    rows (forward, dQ) and by key rows (dK/dV): where
    Geometry.one_range_rows (one_range_cols) holds it rebuilds every
    partial tile exactly; where it does not, some row of some tile sees
    two runs (so the flag is no stricter than it must be)."""
    from jax_backends.pallas_flex.plan import make_plan

    mask = small_mask(name, 1000)
    plan = make_plan(mask, *blocks)
    flag = plan.geometry.one_range_cols if transposed else plan.geometry.one_range_rows
    assert _hull_is_exact(plan, mask, blocks, transposed) == flag


@st.composite
def slice_grids(draw):
    """Slices of every kind in the boxes of a random grid over a mask of at
    most 64 x 64 tokens (some boxes empty), so tiles of 16 meet gaps,
    touching slices and edges of every kind."""
    from lcab.masks import AttnMask, AttnSlice
    from lcab.masks import slices as slices_lib

    seqlen_q, seqlen_k = draw(st.integers(1, 64)), draw(st.integers(1, 64))
    row_cuts = sorted({0, seqlen_q, *draw(st.lists(st.integers(0, seqlen_q), max_size=4))})
    col_cuts = sorted({0, seqlen_k, *draw(st.lists(st.integers(0, seqlen_k), max_size=4))})
    kinds = (None, *slices_lib.KINDS)
    chosen = [AttnSlice(q0, q1, k0, k1, kind)
              for q0, q1 in zip(row_cuts, row_cuts[1:])
              for k0, k1 in zip(col_cuts, col_cuts[1:])
              if (kind := draw(st.sampled_from(kinds))) is not None]
    return AttnMask(seqlen_q, seqlen_k, chosen)


@settings(max_examples=120, deadline=None)
@given(mask=slice_grids(), block_q=st.sampled_from([8, 16]), block_k=st.sampled_from([8, 16, 24]))
def test_the_merged_ranges_flag_is_exactly_where_the_hull_is_exact(mask, block_q, block_k):
    """On random slice grids the host's flags (one_range_rows for query
    rows, one_range_cols for key rows) hold exactly where the hull
    rebuilds every partial tile."""
    from jax_backends.pallas_flex.plan import make_plan

    plan = make_plan(mask, block_q, block_k)
    for transposed in (False, True):
        flag = plan.geometry.one_range_cols if transposed else plan.geometry.one_range_rows
        assert _hull_is_exact(plan, mask, (block_q, block_k), transposed) == flag


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
