"""sub_mask: the exact mask of a sub-grid picked by global row/column ranges.

A context-parallel rank holds some token ranges; the attention it computes
against another rank's keys is the mask restricted to those rows and
columns, in local coordinates. Clipping a slice to a rectangle keeps its
visible set, but a causal edge clipped by the rectangle's column bounds is
no longer one diagonal: per row, the left edge is max(diagonal, column
start) and the right edge min(diagonal, column end). Each edge changes
form at most once, so splitting the rows there gives at most three pieces,
each again a full / causal / inv_causal / bi_causal slice.
"""

from __future__ import annotations

import numpy as np

from lcab.cp import intervals
from lcab.masks.mask import AttnMask
from lcab.masks.slices import BI_CAUSAL, CAUSAL, FULL, INV_CAUSAL


def sub_mask(mask: AttnMask, row_ranges, col_ranges) -> AttnMask:
    """The mask of rows `row_ranges` x columns `col_ranges`, concatenated.

    Ranges are half-open global (start, stop) pairs; local row i is the
    i-th global row listed (likewise columns). Ranges of one list must not
    overlap. Exact, and costs the number of (slice, row range, column
    range) boxes that meet, never S x S.
    """
    row_starts, row_stops = intervals.as_ranges(row_ranges, mask.seqlen_q, "row")
    col_starts, col_stops = intervals.as_ranges(col_ranges, mask.seqlen_k, "column")
    rows_total = int((row_stops - row_starts).sum())
    cols_total = int((col_stops - col_starts).sum())
    if rows_total == 0 or cols_total == 0:
        raise ValueError(
            f"a sub-mask needs at least one row and one column, got {rows_total} "
            f"rows from {list(row_ranges)} and {cols_total} columns from {list(col_ranges)}"
        )
    # Local offset of each range: where its first token lands.
    row_offsets = np.cumsum(row_stops - row_starts) - (row_stops - row_starts)
    col_offsets = np.cumsum(col_stops - col_starts) - (col_stops - col_starts)

    table = mask.slice_table
    s, r = intervals.overlapping(table[:, 0], table[:, 1], row_starts, row_stops)
    k, c = intervals.overlapping(table[s, 2], table[s, 3], col_starts, col_stops)
    s, r = s[k], r[k]
    pieces = _clip(table[s], row_starts[r], row_stops[r], col_starts[c], col_stops[c])
    owner, (q0, q1, k0, k1, kind) = pieces
    local = np.stack(
        [
            q0 - row_starts[r][owner] + row_offsets[r][owner],
            q1 - row_starts[r][owner] + row_offsets[r][owner],
            k0 - col_starts[c][owner] + col_offsets[c][owner],
            k1 - col_starts[c][owner] + col_offsets[c][owner],
            kind,
        ],
        axis=1,
    )
    return AttnMask(
        rows_total,
        cols_total,
        local,
        name=f"{mask.name}:sub",
        params={"parent": mask.fingerprint()},
        _trusted=True,  # disjoint by construction; tests check it exactly
    )


def _clip(table, row_lo, row_hi, col_lo, col_hi):
    """Clip slices to rectangles (all global); -> (owner index, piece columns).

    Per row the visible columns are [L, H] with
      L = max(r + t_lo, col start) if the slice starts at the row, else col start
      H = min(r + t_hi, col end - 1) if it ends at the diagonal, else col end - 1.
    """
    q0, q1, k0, k1, kind = (table[:, i] for i in range(5))
    r0 = np.maximum(q0, row_lo)
    r1 = np.minimum(q1, row_hi)
    c_start = np.maximum(k0, col_lo)
    c_stop = np.minimum(k1, col_hi)
    diagonal_lo = (kind == INV_CAUSAL) | (kind == BI_CAUSAL)
    diagonal_hi = (kind == CAUSAL) | (kind == BI_CAUSAL)
    t_lo = k0 - q0
    t_hi = k1 - q1
    # L follows the diagonal from row lo_switch on; H up to row hi_switch - 1.
    lo_switch = np.where(diagonal_lo, c_start - t_lo, r1)
    hi_switch = np.where(diagonal_hi, c_stop - t_hi, r0)
    cut_a = np.clip(np.minimum(lo_switch, hi_switch), r0, r1)
    cut_b = np.clip(np.maximum(lo_switch, hi_switch), r0, r1)

    owners, parts = [], []
    for a, b in ((r0, cut_a), (cut_a, cut_b), (cut_b, r1)):
        lo_diag = diagonal_lo & (a >= lo_switch)
        hi_diag = diagonal_hi & (a < hi_switch)
        # Causal piece: rows before the diagonal reaches col start see nothing.
        a = np.where(~lo_diag & hi_diag, np.maximum(a, c_start - t_hi), a)
        # Inverse piece: rows after the diagonal passes col end see nothing.
        b = np.where(lo_diag & ~hi_diag, np.minimum(b, c_stop - t_lo), b)
        left = np.where(lo_diag, a + t_lo, c_start)
        right = np.where(hi_diag, b + t_hi, c_stop)
        piece_kind = np.select(
            [lo_diag & hi_diag, lo_diag, hi_diag], [BI_CAUSAL, INV_CAUSAL, CAUSAL], FULL
        )
        keep = (b > a) & (right > left) & ~(lo_diag & hi_diag & (t_hi < t_lo))
        index = np.flatnonzero(keep)
        owners.append(index)
        parts.append(np.stack([a, b, left, right, piece_kind], axis=1)[index])
    owner = np.concatenate(owners)
    pieces = np.concatenate(parts).reshape(-1, 5)
    return owner, tuple(pieces[:, i] for i in range(5))

