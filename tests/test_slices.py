"""Closed-form slice arithmetic against brute-force dense counts."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from lcab.masks import AttnSlice, KINDS
from lcab.masks import slices as slices_lib


@given(
    a=st.integers(-20, 20),
    span=st.integers(0, 30),
    e=st.integers(-40, 40),
    width=st.integers(0, 25),
)
def test_sum_clamped_ramp_matches_loop(a, span, e, width):
    b = a + span
    expected = sum(min(max(r + e, 0), width) for r in range(a, b))
    assert slices_lib._sum_clamped_ramp(np.int64(a), np.int64(b), np.int64(e), np.int64(width)) == expected


def test_dense_slice_matches_definition():
    m, n = 5, 8
    for kind, rule in [
        ("full", lambda r, c: True),
        ("causal", lambda r, c: c <= r + (n - m)),
        ("inv_causal", lambda r, c: c >= r),
        ("bi_causal", lambda r, c: r <= c <= r + (n - m)),
    ]:
        dense = slices_lib.dense_slice(m, n, slices_lib.KIND_CODE[kind])
        expected = np.array([[rule(r, c) for c in range(n)] for r in range(m)])
        np.testing.assert_array_equal(dense, expected, err_msg=kind)


slice_shapes = st.tuples(
    st.integers(0, 12), st.integers(0, 12), st.integers(0, 12), st.integers(0, 12),
    st.sampled_from(KINDS),
)


@given(shape=slice_shapes, rect=st.tuples(*[st.integers(-3, 30)] * 4))
def test_visible_counts_in_any_rectangle(shape, rect):
    q0, m, k0, n, kind = shape
    sl = AttnSlice(q0, q0 + m, k0, k0 + n, kind)
    grid = np.zeros((30, 30), dtype=bool)
    grid[q0 : q0 + m, k0 : k0 + n] = slices_lib.dense_slice(m, n, slices_lib.KIND_CODE[kind])
    r_lo, r_hi, c_lo, c_hi = rect
    expected = grid[max(r_lo, 0) : max(r_hi, 0), max(c_lo, 0) : max(c_hi, 0)].sum()
    table = slices_lib.slices_to_table([sl])
    got = slices_lib.visible_counts(table, r_lo, r_hi, c_lo, c_hi)
    assert int(got[0]) == expected
    assert sl.area() == grid.sum()


@given(shape=slice_shapes)
def test_row_bounds_match_dense(shape):
    q0, m, k0, n, kind = shape
    table = slices_lib.slices_to_table([AttnSlice(q0, q0 + m, k0, k0 + n, kind)])
    grid = np.zeros((30, 30), dtype=bool)
    grid[q0 : q0 + m, k0 : k0 + n] = slices_lib.dense_slice(m, n, slices_lib.KIND_CODE[kind])
    rows = np.arange(30)
    lo, hi, inside = slices_lib.row_bounds(table, rows)
    for r in rows:
        cols = np.flatnonzero(grid[r])
        assert inside[0, r] == (len(cols) > 0)
        if len(cols):
            assert (lo[0, r], hi[0, r]) == (cols[0], cols[-1])
            assert len(cols) == cols[-1] - cols[0] + 1  # one interval per slice row


def test_bad_slices_raise():
    import pytest

    with pytest.raises(ValueError, match="kind"):
        AttnSlice(0, 1, 0, 1, "diagonal")
    with pytest.raises(ValueError, match="reversed"):
        AttnSlice(4, 2, 0, 1)
    with pytest.raises(ValueError, match="negative"):
        AttnSlice(-1, 2, 0, 1)
