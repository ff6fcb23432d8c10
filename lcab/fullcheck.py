"""The full-size check: a backend's answer at the very workload it is timed on.

The small float64 probe (lcab.validation) says a backend is right on a
stand-in; this check says it is right where it is timed. Once per case,
outside the timed region, the backend runs forward (and backward) on the
timed workload itself: the same length, mask, heads, dtype and, for a CP
strategy, its dispatch, on global inputs. Its output and dQ, dK, dV are
compared with a float32 attention that shares no code with any kernel
(each framework's package has one, `reference.py`: a plain softmax over
chunks of query rows, the mask applied from its slices chunk by chunk).

The check has two tiers, plus a rule over everything:

- the selection: the first and the last batch row, and two whole GQA
  groups (the query heads of the first and of the last K/V head), at every
  query row, so the checked dK and dV are complete sums;
- the sampled rows: every batch row and every query head, at three chunks
  of query rows (the first, one in the middle and the last), out and dQ
  only. A row's output and dQ depend on that row and all keys alone, so a
  few rows are recomputed cheaply; dK and dV need every row and are left to
  the selection;
- any non-finite value anywhere in the backend's out, dQ, dK or dV makes
  that tensor's error infinite.

So a fault that depends on the head, the group or the batch index shows in
out and dQ whatever the index; one in dK or dV shows in the first and last
group and batch row, and as a NaN or inf anywhere. Queries and keys have the
probe's larger spread (PROBE_SPREAD) so attention is peaked and a wrong key
moves an output by O(1).

A CP strategy's reference is the single-device result of the same global
inputs: its function takes and returns global arrays in token order.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lcab.masks.slices import Q0, Q1
from lcab.spans import spans_text
from lcab.validation import PROBE_SPREAD, TOLERANCE
from lcab.workloads import Workload

TENSORS = ("out", "dq", "dk", "dv")
# Scores of one reference chunk: at most this many float32 elements
# (chunk rows x seqlen_k x checked heads x checked batch rows), 512 MiB.
CHUNK_ELEMENTS = 2**27
MIN_CHUNK_ROWS = 16


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which batch rows and heads the reference recomputes."""

    batch_rows: tuple[int, ...]
    kv_heads: tuple[int, ...]
    q_heads: tuple[int, ...]

    def describe(self, workload: Workload) -> str:
        """E.g. "batch 0 of 1; kv 0,7 of 8; q 0-7,56-63 of 64"."""
        return (f"batch {spans_text(self.batch_rows)} of {workload.batch}; "
                f"kv {spans_text(self.kv_heads)} of {workload.heads_kv}; "
                f"q {spans_text(self.q_heads)} of {workload.heads_q}")

    def is_whole(self, workload: Workload) -> bool:
        """Whether it holds every batch row and head (batch <= 2, heads_kv <= 2)."""
        return (len(self.batch_rows), len(self.kv_heads)) == (workload.batch, workload.heads_kv)


def selection(workload: Workload) -> Selection:
    """The first and last batch row; the first and last GQA group, whole."""
    group = workload.gqa_ratio
    kv_heads = tuple(sorted({0, workload.heads_kv - 1}))
    q_heads = tuple(h for kv in kv_heads for h in range(kv * group, (kv + 1) * group))
    return Selection(tuple(sorted({0, workload.batch - 1})), kv_heads, q_heads)


@dataclasses.dataclass(frozen=True, eq=False)
class CheckPlan:
    """Everything a runtime needs to run the check of one workload.

    `chunk_slices` is (n_chunks, n_max, 5): for chunk c (query rows
    [c * chunk_rows, (c + 1) * chunk_rows)) the mask's slices that meet
    those rows, in lcab.masks.slices' column order, padded with empty
    slices (all zeros). The mask's rows past seqlen_q (the last chunk's
    padding) meet no slice, so they see nothing.

    The sampled tier cuts the query rows into chunks of `sample_rows` (at
    most chunk_rows: one chunk's scores hold every head and batch row) and
    recomputes the chunks `sampled_chunks` (first, middle, last), whose
    slices are `sampled_slices`, laid out as chunk_slices; none where the
    selection is whole (it has every row of every head).
    """

    workload: Workload
    selection: Selection
    chunk_rows: int
    chunk_slices: np.ndarray
    sample_rows: int
    sampled_chunks: tuple[int, ...]
    sampled_slices: np.ndarray
    seed: int
    spread: float = PROBE_SPREAD

    @property
    def key(self) -> tuple:
        """Same key, same inputs and same reference (both tiers)."""
        return (self.workload.key(), self.seed, self.spread, self.selection, self.chunk_rows,
                self.sample_rows, self.sampled_chunks)

    @property
    def padded_q(self) -> int:
        return self.chunk_slices.shape[0] * self.chunk_rows

    @property
    def sampled_rows(self) -> np.ndarray:
        """The sampled query rows, ascending (the last chunk stops at seqlen_q)."""
        chunks = np.asarray(self.sampled_chunks, dtype=np.int64)
        rows = (chunks[:, None] * self.sample_rows + np.arange(self.sample_rows)).ravel()
        return rows[rows < self.workload.seqlen_q]

    def describe(self) -> str:
        """The row's check_heads text: what each tier covered, e.g.
        "batch 0 of 1; kv 0,7 of 8; q 0-7,56-63 of 64; every batch row and
        head at query rows 0-63, 16384-16447, 32704-32767"."""
        chosen = self.selection.describe(self.workload)
        if not self.sampled_chunks:
            return chosen
        rows = spans_text(self.sampled_rows, ", ")
        return f"{chosen}; every batch row and head at query rows {rows}"


def chunk_rows(workload: Workload, checked_heads: int, checked_rows: int) -> int:
    """Query rows per reference chunk: a power of two whose scores fit CHUNK_ELEMENTS."""
    per_row = max(1, workload.seqlen_k * checked_heads * checked_rows)
    rows = max(MIN_CHUNK_ROWS, CHUNK_ELEMENTS // per_row)
    rows = 1 << (rows.bit_length() - 1)
    return min(rows, 1 << max(0, (workload.seqlen_q - 1).bit_length()))


def sampled_chunks(seqlen_q: int, rows: int) -> tuple[int, ...]:
    """The first, a middle and the last chunk of `rows` query rows: faults
    at the start, in the bulk and at the end of the sequence all show."""
    n_chunks = -(-seqlen_q // rows)
    return tuple(sorted({0, n_chunks // 2, n_chunks - 1}))


def slices_by_chunk(table: np.ndarray, seqlen_q: int, rows: int, chunks=None) -> np.ndarray:
    """(n_chunks, n_max, 5) int32: each chunk's slices, zero-padded; only
    the chunk indices `chunks`, in their order, when given."""
    if chunks is None:
        chunks = range(-(-seqlen_q // rows))
    starts = np.asarray(chunks, dtype=np.int64) * rows
    meets = (table[None, :, Q0] < starts[:, None] + rows) & (table[None, :, Q1] > starts[:, None])
    meets &= table[None, :, Q1] > table[None, :, Q0]
    n_max = max(1, int(meets.sum(axis=1).max(initial=0)))
    out = np.zeros((len(starts), n_max, 5), dtype=np.int32)
    for chunk in range(len(starts)):
        found = table[meets[chunk]]
        out[chunk, : len(found)] = found
    return out


def plan(workload: Workload, seed: int = 0) -> CheckPlan:
    """The check of `workload`: the selection's chunks and the sampled rows."""
    chosen = selection(workload)
    table, seqlen_q = workload.mask.slice_table, workload.seqlen_q
    rows = chunk_rows(workload, len(chosen.q_heads), len(chosen.batch_rows))
    sample_rows = chunk_rows(workload, workload.heads_q, workload.batch)
    sampled = () if chosen.is_whole(workload) else sampled_chunks(seqlen_q, sample_rows)
    return CheckPlan(workload, chosen, rows, slices_by_chunk(table, seqlen_q, rows),
                     sample_rows=sample_rows, sampled_chunks=sampled,
                     sampled_slices=slices_by_chunk(table, seqlen_q, sample_rows, sampled),
                     seed=seed)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """Normalised max errors (max |got - want| / max |want|) per tensor."""

    errors: dict[str, float]
    tolerance: float
    heads: str
    length: int
    seconds: float

    def error(self, direction: str) -> float:
        names = ("out",) if direction == "fwd" else TENSORS
        return max(self.errors[name] for name in names if name in self.errors)

    def ok(self, direction: str) -> bool:
        return self.error(direction) <= self.tolerance

    def columns(self, direction: str) -> dict:
        """The row's check columns (lcab.results.COLUMNS)."""
        names = ("out",) if direction == "fwd" else TENSORS
        error = self.error(direction)
        return dict(
            check_err=error if np.isfinite(error) else None,
            check_errors={n: _finite_or_text(self.errors[n]) for n in names
                          if n in self.errors},
            check_heads=self.heads, check_len=self.length, check_s=self.seconds,
        )

    def mismatch(self, direction: str) -> str:
        worst = {n: f"{self.errors[n]:.3g}" for n in TENSORS if n in self.errors}
        return (f"full-size check: normalised max error {self.error(direction):.3g} > "
                f"{self.tolerance:g} at {self.length} tokens ({self.heads}); per tensor {worst}")


def result(check: CheckPlan, errors: dict[str, float], seconds: float) -> CheckResult:
    w = check.workload
    return CheckResult(dict(errors), TOLERANCE[w.dtype], check.describe(), w.seqlen_q, seconds)


def _finite_or_text(value: float):
    return float(value) if np.isfinite(value) else str(value)
