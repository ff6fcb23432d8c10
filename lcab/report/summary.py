"""The short summary of result rows: what `python -m lcab.experiments`
prints at the end of a run, and `python -m lcab.report --summary` prints for
any rows (so scripts print tables through one entry point).

Attention rows give the compact "fwd / bwd" TFLOP/s tables
(tables.short_table; median ms where the rows ran on a CPU, as each table's
title says), comm rows the bus-bandwidth table (tables.comm_table).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from lcab import results
from lcab.report import tables


def summary_text(paths: Sequence[str | pathlib.Path], run_id: str | None = None) -> str:
    """The summary of the rows in `paths` (files or directories); with
    `run_id`, of that run's rows only."""
    if not paths:
        return "no results were written"
    frame = results.load(paths)
    comm = [row for row in results.read_rows(paths) if row.get("suite") == results.COMM_SUITE]
    if run_id is not None:
        frame = frame[frame["run_id"] == run_id]
        comm = [row for row in comm if row.get("run_id") == run_id]
    parts = []
    if not frame.empty or not comm:
        parts.append(tables.short_table(frame))
    if comm:
        parts.append(tables.to_markdown(tables.comm_table(comm)))
    return "\n\n".join(parts)
