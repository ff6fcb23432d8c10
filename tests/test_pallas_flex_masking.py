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


def _one_sided_kinds(mask, transposed: bool, rows: int = 64, width: int = 128):
    """Every (slice, tile) pair of a small mask: tile_cut's answer, checked
    against the slice's exact part of the tile, each row as row_range has
    it; the answers counted by kind."""
    table = np.asarray(mask.slice_table, dtype=np.int32)
    ids, flat = np.arange(len(table), dtype=np.int32), table.ravel()
    n_rows, n_cols = ((mask.seqlen_k, mask.seqlen_q) if transposed
                      else (mask.seqlen_q, mask.seqlen_k))
    local = np.arange(width)[None, :]
    kinds = []
    for t in range(len(table)):
        bounds = mosaic_fwd_sm90.slice_bounds(ids, flat, t)
        for row0 in range(0, n_rows, rows):
            r = jnp.arange(row0, row0 + rows, dtype=jnp.int32)
            start, stop = (np.asarray(x)[:, None] for x in
                           mosaic_fwd_sm90.row_range(bounds, r, transposed))
            for col0 in range(0, n_cols, width):
                exact = (local + col0 >= start) & (local + col0 < stop)
                kind = int(mosaic_fwd_sm90.tile_cut(bounds, row0, rows, col0, width, transposed))
                sees, since, until = (np.asarray(x)[:, None] for x in mosaic_fwd_sm90.cut_rows(
                    bounds, r, col0, width, transposed))
                tested = {mosaic_fwd_sm90.RIGHT: local < until,
                          mosaic_fwd_sm90.LEFT: local >= since,
                          mosaic_fwd_sm90.WHOLE_ROWS: np.broadcast_to(sees, exact.shape),
                          mosaic_fwd_sm90.TWO_SIDED: exact}[kind]
                assert (tested == exact).all(), (t, row0, col0, kind)
                kinds.append(kind)
    return kinds


@pytest.mark.parametrize("name", MASK_NAMES)
def test_a_tile_cut_on_one_side_is_tested_exactly_by_that_side_alone(name):
    """The forward's "one_sided" test (v16): wherever tile_cut says a slice
    cuts a tile on one side only (or each row sees all of it or none),
    that side's one compare (or the row's select) rebuilds the slice's
    part of the tile exactly, by query rows and by key rows."""
    mask = small_mask(name, 300)
    for transposed in (False, True):
        _one_sided_kinds(mask, transposed)


def test_diagonals_and_window_edges_are_cut_on_one_side():
    """What the test is for: a causal diagonal cuts its tiles on the right,
    a sliding window's far edge on the left (as query rows see them)."""
    kinds = set(_one_sided_kinds(small_mask("causal", 300), False))
    assert mosaic_fwd_sm90.RIGHT in kinds and mosaic_fwd_sm90.LEFT not in kinds
    window = set(_one_sided_kinds(small_mask("sliding_window_causal", 600), False))
    assert {mosaic_fwd_sm90.RIGHT, mosaic_fwd_sm90.LEFT} <= window
