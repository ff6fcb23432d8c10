"""How the Mosaic kernels mask a partial tile (mosaic_walk.row_range,
in_range), computed with jnp on the host over whole small masks: each
slice's column range per row, and every element test, must rebuild the
mask's dense matrix exactly, by query rows (forward, dQ) and by key rows
(dK/dV). The kernels' own numbers are checked on a GPU."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jax_backends.pallas_flex import mosaic_walk
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
            start, stop = mosaic_walk.row_range(
                mosaic_walk.slice_bounds(ids, flat, t), r, transposed)
            if test == "bounds":
                c = local + col0
                sees = (c >= start[:, None]) & (c < stop[:, None])
            elif test == "folded":
                sees = (local >= (start - col0)[:, None]) & (local < (stop - col0)[:, None])
            else:
                sees = mosaic_walk.in_range(local, start - col0, stop - col0,
                                            lambda x: x[:, None])
            seen = seen | sees
        tiles.append(seen)
    return np.asarray(jnp.concatenate(tiles, axis=1))[:, :n_cols]


@pytest.mark.parametrize("test", mosaic_walk.MASK_TESTS)
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
    found = mosaic_walk.in_range(c, start_v, stop_v, lambda x: x[:, None])
    assert (np.asarray(found) == ((np.asarray(c) >= start) & (np.asarray(c) < stop))).all()
