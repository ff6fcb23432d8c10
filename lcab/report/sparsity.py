"""TFLOP/s (median ms on a CPU) against sparsity for the block-sparse mask
families: the data.

Block-sparse rows (block_sparse, var_block_sparse; any kernel row whose
mask_params carry both `keep` and `block_size`) keep a fraction `keep` of
the kv blocks of each q block. A sweep may run several keep values and block
sizes at one seqlen; here they line up against keep, one group per
(mask, seqlen, block_size, direction). `figures.sparsity_figure` draws the
same rows. Cells and figure show what lcab.report.measure picks for the
rows' device. The kernel tables show these rows too, their mask labelled with
its setting where a family ran with several (tables.label_mask_settings).
"""

from __future__ import annotations

import pandas as pd

from lcab.report import tables

# Rows are grouped by the first four, keep ascending inside a group.
SPARSITY_INDEX = ("mask", "seqlen", "block_size", "direction", "keep")


def sparsity_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The newest block-sparse kernel rows, with numeric "keep" and
    "block_size" columns and a "line" column (backend, options appended)."""
    # Not tables.suite_rows: that labels the mask with keep, which is an axis here.
    rows = tables.latest(frame[frame["suite"] == "kernel"])
    params = rows["mask_params"].map(tables.swept_params)
    sparse = params.map(lambda p: set(tables.SWEPT_MASK_PARAMS) <= p.keys()).astype(bool)
    rows, params = rows[sparse], params[sparse]
    rows = rows.assign(keep=params.map(lambda p: float(p["keep"])),
                       block_size=params.map(lambda p: int(p["block_size"])))
    return tables.with_line(rows)


def sparsity_table(frame: pd.DataFrame) -> pd.DataFrame:
    """TFLOP/s, median ms on a CPU (or status codes) per backend: index
    SPARSITY_INDEX, one column per backend line. Empty when there are no
    block-sparse rows. Expects one setting group (tables.setting_groups)."""
    rows = sparsity_rows(frame)
    if rows.empty:
        return pd.DataFrame()
    tables.single_setting(rows, "sparsity_table")
    return tables.cell_table(rows, SPARSITY_INDEX, "line", tables.line_order(rows),
                             tables.sorted_index(rows, SPARSITY_INDEX))
