"""AttnMask: a named, exact attention mask made of non-overlapping slices."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lcab.masks import schedule as schedule_lib
from lcab.masks import slices as slices_lib
from lcab.masks.slices import AttnSlice

# Largest matrix to_dense() builds: 2**26 booleans (64 MiB, i.e. 8k x 8k).
DENSE_LIMIT = 1 << 26
# window() inspects row intervals only for masks of a few slices (a band
# decomposes into at most three); anything bigger is not window-shaped.
_WINDOW_MAX_SLICES = 8


@dataclasses.dataclass(frozen=True)
class Documents:
    """Packed documents: block-diagonal, `causal` or full inside each."""

    lens: tuple[int, ...]
    causal: bool

    def cu_seqlens(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lens)]).astype(np.int32)


class AttnMask:
    """An exact (seqlen_q x seqlen_k) mask as a union of disjoint slices.

    `slices` may be AttnSlice values or an (N, 5) int table in the column
    order of `lcab.masks.slices`. Slices are validated (in bounds, never
    overlapping) and kept in canonical (q_start, k_start) order, so two
    masks with the same visible pairs from the same slices compare equal.
    """

    __slots__ = ("seqlen_q", "seqlen_k", "name", "params", "_table", "_slices")

    def __init__(
        self,
        seqlen_q: int,
        seqlen_k: int,
        slices: Sequence[AttnSlice] | np.ndarray,
        name: str = "custom",
        params: Mapping[str, Any] | None = None,
        *,
        _trusted: bool = False,
    ):
        for label, value in (("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)):
            if int(value) != value or value <= 0:
                raise ValueError(f"{label}={value!r} must be a positive integer")
        table = slices_lib.slices_to_table(slices)
        order = np.lexsort(tuple(table[:, i] for i in (4, 3, 1, 2, 0)))
        table = table[order]
        table.setflags(write=False)
        object.__setattr__(self, "seqlen_q", int(seqlen_q))
        object.__setattr__(self, "seqlen_k", int(seqlen_k))
        object.__setattr__(self, "name", str(name))
        object.__setattr__(self, "params", dict(params or {}))
        object.__setattr__(self, "_table", table)
        object.__setattr__(self, "_slices", None)
        if not _trusted:
            _validate(table, self.seqlen_q, self.seqlen_k)

    def __setattr__(self, key, value):
        raise dataclasses.FrozenInstanceError(f"AttnMask is immutable ({key=})")

    def __reduce__(self):
        # Slots plus a frozen __setattr__ need an explicit recipe to pickle
        # (child processes of --isolate receive masks this way).
        return (
            _rebuild,
            (self.seqlen_q, self.seqlen_k, np.array(self._table), self.name, self.params),
        )

    # ----- identity -----------------------------------------------------
    @property
    def slice_table(self) -> np.ndarray:
        """Read-only (N, 5) int64 table: q_start, q_end, k_start, k_end, kind."""
        return self._table

    @property
    def slices(self) -> tuple[AttnSlice, ...]:
        if self._slices is None:
            object.__setattr__(self, "_slices", slices_lib.table_to_slices(self._table))
        return self._slices

    def fingerprint(self) -> str:
        """A short digest of the exact visible set; stable across processes."""
        digest = hashlib.sha256()
        digest.update(np.array([self.seqlen_q, self.seqlen_k], dtype="<i8").tobytes())
        digest.update(self._table.astype("<i8").tobytes())
        return digest.hexdigest()[:12]

    def __eq__(self, other):
        if not isinstance(other, AttnMask):
            return NotImplemented
        return (
            (self.seqlen_q, self.seqlen_k) == (other.seqlen_q, other.seqlen_k)
            and np.array_equal(self._table, other._table)
        )

    def __hash__(self):
        return hash(self.fingerprint())

    def __repr__(self):
        return (
            f"AttnMask({self.name!r}, {self.seqlen_q}x{self.seqlen_k}, "
            f"{len(self._table)} slices, density={self.density():.4f})"
        )

    # ----- sizes --------------------------------------------------------
    def area(self) -> int:
        """Exact number of visible (q, k) pairs."""
        return int(slices_lib.table_areas(self._table).sum())

    def density(self) -> float:
        return self.area() / (self.seqlen_q * self.seqlen_k)

    def to_dense(self, max_elements: int = DENSE_LIMIT) -> np.ndarray:
        """The (seqlen_q, seqlen_k) boolean matrix; small sizes only."""
        elements = self.seqlen_q * self.seqlen_k
        if elements > max_elements:
            raise ValueError(
                f"to_dense() would build a {self.seqlen_q} x {self.seqlen_k} matrix "
                f"({elements} elements > {max_elements=}); use slice_table, "
                "block_schedule() or the documents/window views instead"
            )
        dense = np.zeros((self.seqlen_q, self.seqlen_k), dtype=bool)
        for q0, q1, k0, k1, kind in self._table:
            dense[q0:q1, k0:k1] |= slices_lib.dense_slice(q1 - q0, k1 - k0, kind)
        return dense

    # ----- derived views for kernels --------------------------------------
    def documents(self) -> Documents | None:
        """Packed-document layout, when the mask is exactly one.

        Document-shaped means square, covered by diagonal slices
        [s, e) x [s, e) back to back, all full or all causal. Other masks
        (share_question, block-causal documents, ...) return None.
        """
        table = self._table
        if self.seqlen_q != self.seqlen_k or len(table) == 0:
            return None
        q0, q1, k0, k1, kind = (table[:, i] for i in range(5))
        if not (np.array_equal(q0, k0) and np.array_equal(q1, k1)):
            return None
        if q0[0] != 0 or q1[-1] != self.seqlen_q or not np.array_equal(q0[1:], q1[:-1]):
            return None
        if np.all(kind == slices_lib.FULL):
            causal = False
        elif np.all(kind == slices_lib.CAUSAL):
            causal = True
        else:
            return None
        return Documents(lens=tuple(int(x) for x in q1 - q0), causal=causal)

    def doc_lens(self) -> list[int] | None:
        documents = self.documents()
        return None if documents is None else list(documents.lens)

    def cu_seqlens(self) -> np.ndarray | None:
        documents = self.documents()
        return None if documents is None else documents.cu_seqlens()

    def window(self) -> tuple[int, int] | None:
        """(left, right) when query i sees exactly keys i-left..i+right.

        FlashAttention's convention: -1 means unbounded on that side, so the
        full mask is (-1, -1), causal is (-1, 0), sliding_window_causal with
        window w is (w, 0). None when the mask is no such band.
        """
        s = self.seqlen_q
        if s != self.seqlen_k or not 0 < len(self._table) <= _WINDOW_MAX_SLICES:
            return None
        rows = np.arange(s)
        lo, hi, inside = slices_lib.row_bounds(self._table, rows)
        count = np.where(inside, hi - lo + 1, 0).sum(axis=0)
        lo = np.where(inside, lo, s).min(axis=0)
        hi = np.where(inside, hi, -1).max(axis=0)
        if np.any(count == 0) or np.any(count != hi - lo + 1):
            return None
        left = int(np.max(rows - lo))
        right = int(np.max(hi - rows))
        if left < 0 or right < 0:
            return None
        if not (
            np.array_equal(lo, np.maximum(rows - left, 0))
            and np.array_equal(hi, np.minimum(rows + right, s - 1))
        ):
            return None
        # The tightest window; a side that reaches the sequence's edge from
        # every row is unbounded (-1). A 1-token sequence stays (0, 0).
        unbounded = lambda w: -1 if w == s - 1 and s > 1 else w  # noqa: E731
        return unbounded(left), unbounded(right)

    def block_schedule(self, block_q: int, block_k: int) -> schedule_lib.BlockSchedule:
        """Full and partial kv blocks per q block, without any S x S object."""
        return schedule_lib.build_block_schedule(
            self._table, self.seqlen_q, self.seqlen_k, block_q, block_k
        )


def _rebuild(seqlen_q, seqlen_k, table, name, params) -> AttnMask:
    return AttnMask(seqlen_q, seqlen_k, table, name=name, params=params, _trusted=True)


# ----- validation --------------------------------------------------------
def _validate(table: np.ndarray, seqlen_q: int, seqlen_k: int) -> None:
    q0, q1, k0, k1, kind = (table[:, i] for i in range(5))
    bad_kind = (kind < 0) | (kind >= len(slices_lib.KINDS))
    if np.any(bad_kind):
        raise ValueError(f"slice kind codes {sorted(set(kind[bad_kind]))} are unknown")
    bad = (q0 < 0) | (q1 > seqlen_q) | (q0 > q1) | (k0 < 0) | (k1 > seqlen_k) | (k0 > k1)
    if np.any(bad):
        first = slices_lib.table_to_slices(table[bad][:1])[0]
        raise ValueError(
            f"{first} lies outside the {seqlen_q} x {seqlen_k} grid or is reversed"
        )
    pair = _first_overlapping_pair(table)
    if pair is not None:
        a, b = slices_lib.table_to_slices(table[list(pair)])
        raise ValueError(f"slices overlap: {a} and {b}")


def _linear_edges(table):
    """Edges as s*r + t in the absolute row r (slopes s are 0 or 1)."""
    q0, q1, k0, k1, kind = (table[:, i] for i in range(5))
    starts_at_row = ((kind == slices_lib.INV_CAUSAL) | (kind == slices_lib.BI_CAUSAL))
    ends_at_diagonal = (kind == slices_lib.CAUSAL) | (kind == slices_lib.BI_CAUSAL)
    s_lo = starts_at_row.astype(np.int64)
    t_lo = k0 - q0 * s_lo
    s_hi = ends_at_diagonal.astype(np.int64)
    t_hi = np.where(ends_at_diagonal, k1 - q1, k1 - 1)
    return s_lo, t_lo, s_hi, t_hi


def _first_overlapping_pair(table: np.ndarray):
    """Indices of two slices sharing a visible pair, or None. Exact.

    Two slices overlap on row r when every left edge (each slice's diagonal
    edge and its column start) is <= every right edge. Each such inequality
    is linear in r, so the rows where all hold form an interval we intersect
    with the rows both slices cover.
    """
    n = len(table)
    if n < 2:
        return None
    by_row = np.argsort(table[:, 0], kind="stable")
    q0_sorted = table[by_row, 0]
    ends = np.searchsorted(q0_sorted, table[by_row, 1], side="left")
    starts = np.arange(n) + 1
    lengths = np.maximum(ends - starts, 0)
    first = np.repeat(np.arange(n), lengths)
    second = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    second = second + starts[first]
    a, b = by_row[first], by_row[second]
    ta, tb = table[a], table[b]
    boxes_meet = (ta[:, 2] < tb[:, 3]) & (tb[:, 2] < ta[:, 3])
    a, b, ta, tb = a[boxes_meet], b[boxes_meet], ta[boxes_meet], tb[boxes_meet]
    if len(a) == 0:
        return None

    row_lo = np.maximum(ta[:, 0], tb[:, 0])
    row_hi = np.minimum(ta[:, 1], tb[:, 1]) - 1
    lefts, rights = [], []
    for t in (ta, tb):
        s_lo, t_lo, s_hi, t_hi = _linear_edges(t)
        zero = np.zeros_like(s_lo)
        lefts += [(s_lo, t_lo), (zero, t[:, 2])]
        rights += [(s_hi, t_hi), (zero, t[:, 3] - 1)]
    for s_left, t_left in lefts:
        for s_right, t_right in rights:
            # s_left*r + t_left <= s_right*r + t_right  <=>  slope*r <= offset
            slope = s_left - s_right
            offset = t_right - t_left
            never = (slope == 0) & (offset < 0)
            row_lo = np.where(slope == -1, np.maximum(row_lo, -offset), row_lo)
            row_hi = np.where(slope == 1, np.minimum(row_hi, offset), row_hi)
            row_hi = np.where(never, row_lo - 1, row_hi)
    clash = np.flatnonzero(row_lo <= row_hi)
    if len(clash) == 0:
        return None
    return int(a[clash[0]]), int(b[clash[0]])
