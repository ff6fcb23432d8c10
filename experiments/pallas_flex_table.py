"""The README's jax.pallas_flex tables (issue #6) from committed rows:

    python3 experiments/pallas_flex_table.py ROWS_DIR [ROWS_DIR ...]

Two markdown tables, TFLOP/s forward / backward: the seed blog's six masks
at 16k-64k (its documents: magi_pack from chatqa2) and the paper's fourteen
masks at 32k (its documents: longca from prolong64k), each only where the
rows are those workloads (document masks drawn otherwise, and block-sparse
masks of LCAB's earlier generators, are left out; docs/masks.md), pallas_flex
beside FA3, cuDNN, tokamax (Mosaic with its
heuristic config, and its cuDNN path) and torch.flex, then pallas_flex's
ratios: to FA3 (to cuDNN, marked, where FA3's figure failed the
reference), to its own full-mask figure at the same length, and to
torch.flex. Cells use the results table's codes (X, MM, -, ...) and
flags (~ samples spread over 10 %, ? no full-size check); a cell with no
row at all is left empty, and a backend with no rows gets no column.

A cell may have several rows across the folders (a backend retried in a
later call after an UNAVAILABLE one): an OK row wins over any other, a
verdict (X, MM, E) over UNAVAILABLE or ERROR; of two OK rows of one
measurement taken at different times (a canonical run measured again)
the newer stands, as in every table; any other two OK rows for one cell
are an error, so no figure is silently chosen over another.
"""

from __future__ import annotations

import sys

import pandas as pd

from lcab import results
from lcab.masks import earlier
from lcab.report.tables import format_row

BACKENDS = {
    "jax.pallas_flex": "pallas_flex",
    "jax.fa3": "FA3",
    "jax.cudnn": "cuDNN",
    "jax.tokamax_mosaic_heuristic": "tokamax Mosaic",
    "jax.tokamax_cudnn": "tokamax cuDNN",
    "torch.flex": "torch.flex",
}
SEED_MASKS = ("full", "causal", "full_document", "causal_document",
              "sliding_window_causal", "varlen_block_causal")
PAPER_MASKS = ("full", "causal", "sliding_window", "sliding_window_causal",
               "longca_global_window", "full_document", "causal_document",
               "block_causal_document", "share_question", "causal_blockwise",
               "prefix_lm_document", "prefix_lm_causal", "block_sparse", "var_block_sparse")
SEED_DOCUMENTS = ("magi_pack", "chatqa2_long_sft")
PAPER_DOCUMENTS = ("longca", "prolong64k")
DIRECTIONS = ("fwd", "bwd")
# The setting; other rows in the folders (correctness checks at 2k,
# float16, head_dim 64) are not table cells.
SETTING = {"heads_q": 64, "heads_kv": 8, "head_dim": 128, "dtype": "bfloat16"}


def _rank(row) -> int:
    """OK over any verdict (X, MM, E), and a verdict over a status of the
    machine rather than the kernel (UNAVAILABLE, ERROR: the ones --resume
    retries): a backend that could not even be imported in one call says
    nothing about the cell another call measured."""
    if row["status"] == "OK":
        return 2
    return 0 if row["status"] in results.RETRIED_ON_RESUME else 1


def documents(row) -> tuple[str, str] | None:
    """(sampler, histogram) of a row's drawn documents; None for a mask
    that draws none (rows written before samplers were named: uncapped)."""
    params = results.json_field(row["mask_params"])
    if "distribution" not in params:
        return None
    return params.get("sampler", "uncapped"), params["distribution"]


def run_documents(row) -> tuple[str, str | None]:
    """A mask without documents: how its run drew documents for the masks
    that have them (a histogram or a sampler), which tells the seed's run
    from the paper's where both timed the same workload."""
    flags = results.json_field(row["flags"])
    return "run", flags.get("doc_distribution") or flags.get("doc_sampler")


def current_form(row) -> bool:
    """False for block-sparse rows of LCAB's earlier generators."""
    return not earlier.is_earlier_form(results.json_field(row["mask_params"]))


def cells(frame: pd.DataFrame) -> dict[tuple, pd.Series]:
    """(backend, mask, seqlen, documents, direction) -> its one row, among
    the rows in SETTING."""
    frame = frame[frame["backend"].isin(BACKENDS)
                  & (frame[list(SETTING)] == pd.Series(SETTING)).all(axis=1)].copy()
    frame = frame[frame.apply(current_form, axis=1)] if len(frame) else frame
    chosen: dict[tuple, pd.Series] = {}
    for _, row in frame.iterrows():
        key = (row["backend"], row["mask"], int(row["seqlen"]),
               documents(row) or run_documents(row), row["direction"])
        held = chosen.get(key)
        if held is not None and held["status"] == "OK" and row["status"] == "OK":
            chosen[key] = _remeasured(key, held, row)
        elif held is None or _rank(row) >= _rank(held):
            chosen[key] = row
    return chosen


def _remeasured(key, held: pd.Series, row: pd.Series) -> pd.Series:
    """Of two OK rows for one cell, the newer where both are one
    measurement (results.MEASUREMENT_KEY) taken at different times: a
    canonical run's --measure_again keeps the rows it set aside, and the
    newest row of a measurement is the one that stands in every table.
    Anything else (other options, the same rows read twice) is an error."""
    same = all(held[column] == row[column] for column in results.MEASUREMENT_KEY)
    times = [results.parsed_time(r["timestamp"]) for r in (held, row)]
    if not same or None in times or times[0] == times[1]:
        raise ValueError(f"two OK rows for one cell {key}: runs {held['run_id']} "
                         f"and {row['run_id']}")
    return row if times[1] > times[0] else held


class Table:
    def __init__(self, frame: pd.DataFrame, documents: tuple[str, str]):
        self.cells = cells(frame)
        self.documents = documents

    def row(self, backend, mask, seqlen, direction):
        """The cell's row with this table's documents, else one of a mask
        that draws no documents (full, causal, windows: the same workload
        in every run)."""
        found = self.cells.get((backend, mask, seqlen, self.documents, direction))
        if found is not None:
            return found
        others = [(key[3][1], row) for key, row in self.cells.items()
                  if key[:3] == (backend, mask, seqlen) and key[4] == direction
                  and key[3][0] == "run"]
        if len(others) > 1:  # timed in several runs: this table's run's
            others = [pair for pair in others if pair[0] in self.documents]
        others = [row for _, row in others]
        if len(others) > 1:
            raise ValueError(f"{backend} {mask} {seqlen} {direction}: rows from several runs")
        return others[0] if others else None

    def tflops(self, backend, mask, seqlen, direction) -> float | None:
        row = self.row(backend, mask, seqlen, direction)
        return row["tflops"] if row is not None and row["status"] == "OK" else None

    def shown(self, backend, mask, seqlen) -> str:
        rows = [self.row(backend, mask, seqlen, d) for d in DIRECTIONS]
        if all(row is None for row in rows):
            return ""
        return " / ".join("" if row is None else format_row(row, mark_changes=False)
                           for row in rows)

    def ratio(self, mask, seqlen, backend, of_mask=None, fallback=None) -> str:
        """pallas_flex over `backend`, fwd / bwd; where `backend`'s figure
        failed the reference, over `fallback`'s, named; empty where there
        is nothing to divide by."""
        parts = []
        for direction in DIRECTIONS:
            own = self.tflops("jax.pallas_flex", mask, seqlen, direction)
            theirs = self.tflops(backend, of_mask or mask, seqlen, direction)
            if own is not None and theirs is not None:
                parts.append(f"{own / theirs:.2f}")
                continue
            row = self.row(backend, of_mask or mask, seqlen, direction)
            failed = row is not None and row["status"] == "MISMATCH"
            spare = self.tflops(fallback, mask, seqlen, direction) if fallback else None
            parts.append(f"({own / spare:.2f} of {BACKENDS[fallback]})"
                         if own is not None and failed and spare is not None else "")
        return "" if not any(parts) else " / ".join(parts)

    def markdown(self, masks, seqlens) -> str:
        # Backends with no row at all (not run, e.g. tokamax) get no column.
        present = [b for b in BACKENDS if any(key[0] == b for key in self.cells)]
        head = ["mask", "length", *(BACKENDS[b] for b in present), "flex / FA3",
                "flex / own full", "flex / torch.flex"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for mask in masks:
            for seqlen in seqlens:
                if self.row("jax.pallas_flex", mask, seqlen, "fwd") is None:
                    continue
                line = [mask, f"{seqlen // 1024}k"]
                line += [self.shown(backend, mask, seqlen) for backend in present]
                line += [self.ratio(mask, seqlen, "jax.fa3", fallback="jax.cudnn"),
                         self.ratio(mask, seqlen, "jax.pallas_flex", of_mask="full"),
                         self.ratio(mask, seqlen, "torch.flex")]
                lines.append("| " + " | ".join(line) + " |")
        return "\n".join(lines)


def tables(paths) -> tuple[str, str]:
    frame = results.load(paths)
    seed = Table(frame, SEED_DOCUMENTS).markdown(SEED_MASKS, (16384, 32768, 65536))
    paper = Table(frame, PAPER_DOCUMENTS).markdown(PAPER_MASKS, (32768,))
    return seed, paper


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    seed, paper = tables(argv[1:])
    print(seed, paper, sep="\n\n")


if __name__ == "__main__":
    main(sys.argv)
