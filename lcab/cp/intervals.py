"""Interval bookkeeping shared by sub-masks and dispatch areas.

Everything here works on token ranges and slices, never on an S x S grid:
the cost is the number of (slice, range) pairs whose boxes meet.
"""

from __future__ import annotations

import numpy as np

from lcab.masks import slices as slices_lib


def as_ranges(ranges, limit: int, label: str) -> tuple[np.ndarray, np.ndarray]:
    """Half-open (start, stop) pairs -> (starts, stops) int64 arrays, checked.

    Every range must lie in [0, limit) and no two may share a token (a CP
    rank holds each token once); empty ranges are kept, since their order
    still fixes the local offsets of the ranges after them.
    """
    pairs = np.asarray(list(ranges), dtype=np.int64).reshape(-1, 2)
    starts, stops = pairs[:, 0], pairs[:, 1]
    bad = (starts < 0) | (stops < starts) | (stops > limit)
    if np.any(bad):
        first = tuple(int(x) for x in pairs[bad][0])
        raise ValueError(f"{label} range {first} is reversed or outside [0, {limit})")
    nonempty = stops > starts
    s, e = starts[nonempty], stops[nonempty]
    order = np.argsort(s, kind="stable")
    if np.any(e[order][:-1] > s[order][1:]):
        raise ValueError(f"{label} ranges overlap: {pairs.tolist()}")
    return starts, stops


def ragged_pairs(first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (i, j) with first[i] <= j < last[i], as two flat arrays."""
    counts = np.maximum(last - first, 0)
    owner = np.repeat(np.arange(len(first)), counts)
    offsets = np.cumsum(counts) - counts
    item = np.arange(int(counts.sum())) - np.repeat(offsets, counts) + first[owner]
    return owner, item


def overlapping(lo, hi, starts, stops) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (i, j) where [lo[i], hi[i]) meets range [starts[j], stops[j]).

    The ranges are disjoint, in any order; sorted by start, disjoint
    nonempty ranges are sorted by stop too, so the ranges meeting an
    interval are contiguous in that order.
    """
    # Empty ranges meet nothing and could break the sortedness of stops.
    nonempty = np.flatnonzero(stops > starts)
    order = nonempty[np.argsort(starts[nonempty], kind="stable")]
    first = np.searchsorted(stops[order], lo, side="right")
    last = np.searchsorted(starts[order], hi, side="left")
    i, k = ragged_pairs(first, last)
    j = order[k]
    meets = np.maximum(lo[i], starts[j]) < np.minimum(hi[i], stops[j])
    return i[meets], j[meets]


def rectangle_areas(table, row_starts, row_stops, col_starts, col_stops) -> np.ndarray:
    """(R, C) exact visible pairs of every (row range, column range) rectangle."""
    table = np.asarray(table, dtype=np.int64).reshape(-1, 5)
    out = np.zeros((len(row_starts), len(col_starts)), dtype=np.int64)
    s, r = overlapping(table[:, 0], table[:, 1], row_starts, row_stops)
    k, c = overlapping(table[s, 2], table[s, 3], col_starts, col_stops)
    s, r = s[k], r[k]
    counts = slices_lib.visible_counts(
        table[s], row_starts[r], row_stops[r], col_starts[c], col_stops[c]
    )
    np.add.at(out, (r, c), counts)
    return out
