"""Attention slices: the exact, compact unit every LCAB mask is built from.

A slice covers rows [q_start, q_end) and columns [k_start, k_end) of the
(seqlen_q x seqlen_k) grid. Inside a slice of m rows and n columns, row r
(0-based) sees column c when:

- full:       always
- causal:     c <= r + (n - m)          (bottom-right aligned)
- inv_causal: c >= r                    (top-left aligned)
- bi_causal:  r <= c <= r + (n - m)     (a band n - m + 1 wide)

Every per-slice count in this module is closed-form integer arithmetic,
vectorised over many slices at once, so nothing ever costs O(S^2).
"""

from __future__ import annotations

import dataclasses

import numpy as np

KINDS = ("full", "causal", "inv_causal", "bi_causal")
KIND_CODE = {name: code for code, name in enumerate(KINDS)}
FULL, CAUSAL, INV_CAUSAL, BI_CAUSAL = range(4)

# Column order of a slice table: an (N, 5) int64 array, one slice a row.
Q0, Q1, K0, K1, KIND = range(5)


@dataclasses.dataclass(frozen=True, order=True)
class AttnSlice:
    q_start: int
    q_end: int
    k_start: int
    k_end: int
    kind: str = "full"

    def __post_init__(self):
        if self.kind not in KIND_CODE:
            raise ValueError(f"slice kind={self.kind!r} is not one of {KINDS}")
        for field in ("q_start", "q_end", "k_start", "k_end"):
            if int(getattr(self, field)) != getattr(self, field):
                raise ValueError(f"{field}={getattr(self, field)!r} is not an integer")
        if not (0 <= self.q_start <= self.q_end and 0 <= self.k_start <= self.k_end):
            raise ValueError(
                f"slice rows [{self.q_start}, {self.q_end}) or columns "
                f"[{self.k_start}, {self.k_end}) are negative or reversed"
            )

    def area(self) -> int:
        return int(table_areas(slices_to_table([self]))[0])


def slices_to_table(slices) -> np.ndarray:
    """AttnSlices (or an (N, 5) int array) -> an (N, 5) int64 slice table."""
    if isinstance(slices, np.ndarray):
        table = np.asarray(slices, dtype=np.int64)
        if table.ndim != 2 or table.shape[1] != 5:
            raise ValueError(f"a slice table has shape (N, 5), got {table.shape}")
        return table.reshape(-1, 5)
    rows = [
        (s.q_start, s.q_end, s.k_start, s.k_end, KIND_CODE[s.kind]) for s in slices
    ]
    return np.array(rows, dtype=np.int64).reshape(-1, 5)


def table_to_slices(table: np.ndarray) -> tuple[AttnSlice, ...]:
    return tuple(
        AttnSlice(int(q0), int(q1), int(k0), int(k1), KINDS[int(kind)])
        for q0, q1, k0, k1, kind in table
    )


def _sum_clamped_ramp(a, b, e, width):
    """sum over r in [a, b) of clamp(r + e, 0, width), element-wise, exact.

    All arguments are int64 arrays (or scalars) of one broadcast shape;
    width >= 0.
    """
    t0 = a + e
    t1 = b + e
    # Values t in [max(t0, 0), min(t1, width)) contribute t itself ...
    lo = np.maximum(t0, 0)
    hi = np.minimum(t1, width)
    count = np.maximum(hi - lo, 0)
    ramp = np.where(count > 0, (lo + hi - 1) * count // 2, 0)
    # ... and values t >= width contribute width each.
    flat = np.maximum(t1 - np.maximum(t0, width), 0) * width
    return ramp + flat


def visible_counts(table, row_lo, row_hi, col_lo, col_hi):
    """Visible (q, k) pairs of each slice inside a rectangle, exactly.

    The rectangle is rows [row_lo, row_hi) x columns [col_lo, col_hi) in
    absolute coordinates; all arguments broadcast against the table's rows.
    """
    q0, q1, k0, k1, kind = (table[:, i] for i in range(5))
    m = q1 - q0
    n = k1 - k0
    # Slice-relative rows [a, b) and columns [c0, c_last] of the rectangle.
    a = np.clip(row_lo - q0, 0, m)
    b = np.clip(row_hi - q0, 0, m)
    b = np.maximum(a, b)
    c0 = np.clip(col_lo - k0, 0, n)
    c_last = np.clip(col_hi - k0, 0, n) - 1
    width = np.maximum(c_last - c0 + 1, 0)
    rows = b - a
    d = n - m

    # |[0, x] & [c0, c_last]| = clamp(x - c0 + 1, 0, width); summing it over
    # rows with x = r + d (causal's right edge) or x = r - 1 (just left of an
    # inverse-causal row's start) gives every kind by differences.
    upto_right_edge = _sum_clamped_ramp(a, b, d - c0 + 1, width)
    before_row = _sum_clamped_ramp(a, b, -c0, width)
    return np.select(
        [kind == FULL, kind == CAUSAL, kind == INV_CAUSAL, kind == BI_CAUSAL],
        [
            rows * width,
            upto_right_edge,
            rows * width - before_row,
            np.where(d >= 0, upto_right_edge - before_row, 0),
        ],
    )


def table_areas(table: np.ndarray) -> np.ndarray:
    """Exact area of every slice of a table."""
    return visible_counts(table, table[:, Q0], table[:, Q1], table[:, K0], table[:, K1])


def row_edges(q0, q1, k0, k1, kind, rows):
    """Unclamped absolute [lo, hi] column edges of slices at given rows.

    All arguments broadcast; a row sees nothing in the slice when it lies
    outside [q0, q1) or when, after clamping to [k0, k1), lo > hi.
    """
    r = rows - q0
    d = (k1 - k0) - (q1 - q0)
    starts_at_row = (kind == INV_CAUSAL) | (kind == BI_CAUSAL)
    ends_at_diagonal = (kind == CAUSAL) | (kind == BI_CAUSAL)
    lo = k0 + np.where(starts_at_row, r, 0)
    hi = np.where(ends_at_diagonal, k0 + r + d, k1 - 1)
    return lo, hi


def row_bounds(table: np.ndarray, rows: np.ndarray):
    """Per (slice, absolute row) visible column interval [lo, hi], absolute.

    Returns (lo, hi, inside) arrays of shape (N, len(rows)); a row outside the
    slice, or one that sees nothing in it, has inside=False.
    """
    q0, q1, k0, k1, kind = (table[:, i : i + 1] for i in range(5))
    rows = rows[None, :]
    lo, hi = row_edges(q0, q1, k0, k1, kind, rows)
    lo = np.maximum(lo, k0)
    hi = np.minimum(hi, k1 - 1)
    inside = (rows >= q0) & (rows < q1) & (lo <= hi)
    return lo, hi, inside


def dense_slice(m: int, n: int, kind: int) -> np.ndarray:
    """The (m, n) boolean pattern of one slice."""
    r = np.arange(m)[:, None]
    c = np.arange(n)[None, :]
    if kind == FULL:
        return np.ones((m, n), dtype=bool)
    if kind == CAUSAL:
        return c <= r + (n - m)
    if kind == INV_CAUSAL:
        return c >= r
    return (c >= r) & (c <= r + (n - m))
