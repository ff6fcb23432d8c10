"""Peak device memory of kernel rows: the memory table's data.

Memory is reported in GiB (2**30 bytes), from each row's `peak_mem_bytes`:
for fwd the forward call's peak, for bwd the forward+backward call's (the
runner times the backward as the two together). Only OK rows with a known
peak count (CPU rows have none); a failed or unmeasured case is an empty
cell, never a status code, since a failed run's memory says nothing.
The frameworks measure it differently: torch's is
torch.cuda.max_memory_allocated over the case, JAX's is XLA's memory
analysis of the compiled program (arguments + outputs + temporaries; JAX
has no per-case peak counter), so compare within a framework first.
`figures.memory_figure` draws the same rows.
"""

from __future__ import annotations

import pandas as pd

from lcab.report import tables
from lcab.status import Status

GIB = 1 << 30
UNIT = "GiB (2^30 bytes)"


def format_gib(nbytes) -> str:
    """Bytes as GiB: two decimals, two significant digits below 0.1 GiB
    (small CPU-sized workloads would otherwise all read 0.00)."""
    gib = float(nbytes) / GIB
    return f"{gib:.2f}" if gib >= 0.1 else f"{gib:.2g}"


def memory_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The newest OK kernel rows that know their peak memory, with "line"
    (the backend, options appended as in the kernel tables) and "gib"."""
    # Lines are named over every kernel row, so columns match kernel.md's.
    rows = tables.with_line(tables.suite_rows(frame, "kernel"))
    peak = pd.to_numeric(rows["peak_mem_bytes"], errors="coerce")
    keep = (rows["status"] == Status.OK.value) & peak.notna()
    return rows[keep].assign(gib=peak[keep] / GIB)


def _cell(row: pd.Series) -> str:
    return format_gib(row["peak_mem_bytes"])


def memory_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Peak GiB per backend: index (mask, seqlen), cells "fwd / bwd".

    Empty (no rows, no columns) when no OK kernel row knows its peak memory.
    Expects one setting group (tables.setting_groups).
    """
    rows = memory_rows(frame)
    if rows.empty:
        return pd.DataFrame()
    tables.single_setting(rows, "memory_table")
    index = tables.sorted_index(rows, tables.KERNEL_INDEX)
    columns = tables.line_order(rows)
    return tables.joined_directions(
        tables.cell_table(rows[rows["direction"] == direction], tables.KERNEL_INDEX, "line",
                          columns, index, formatter=_cell)
        for direction in tables.DIRECTIONS
    )
