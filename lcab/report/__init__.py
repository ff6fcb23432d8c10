"""Reports: comparison tables (markdown, CSV) and figures from result rows.

`python -m lcab.report --results PATH --out DIR` writes them all;
`--pages` writes the result pages (lcab.report.pages) and `--headline`
prints the README's headline table (lcab.report.headline). The modules,
one job each:

  tables      the comparison tables (display strings: "612 / 430", "X")
  legend      the one legend of the cells' codes and marks
  measure     TFLOP/s on a GPU, median ms on a CPU
  why         tables whose codes point to their reasons listed under them
  export      the tidy CSV (and Parquet): one number per column
  sources     which folders are read; each row's file, each folder's commits
  headline    the best kernel and CP strategy per framework, for the README
  pages       one markdown page per sweep, the index and the export
  figures, line_figures, styles   the figures (matplotlib) and their looks
  memory, sparsity, summary       the memory and keep tables, the short summary
  reproduce   a rerun's rows against the rows they repeat (--against)

The table functions need only pandas; the figure functions import
matplotlib, so they are loaded on first use and `import lcab.report` stays
cheap for the benchmark CLI, which calls `short_table` at the end of a run.
"""

from lcab.report import headline, legend
from lcab.report.tables import (
    backend_order,
    comm_table,
    cp_table,
    cp_vs_single_table,
    cross_framework_table,
    date_range,
    devices,
    kernel_table,
    latest,
    paired_kernel_table,
    setting_groups,
    short_table,
    to_markdown,
)

_FIGURES = ("kernel_figure", "cp_figure")

__all__ = [
    "backend_order",
    "comm_table",
    "cp_figure",
    "cp_table",
    "cp_vs_single_table",
    "cross_framework_table",
    "date_range",
    "devices",
    "headline",
    "kernel_figure",
    "kernel_table",
    "latest",
    "legend",
    "paired_kernel_table",
    "setting_groups",
    "short_table",
    "to_markdown",
]


def __getattr__(name):
    if name in _FIGURES:
        from lcab.report import figures

        return getattr(figures, name)
    raise AttributeError(f"module 'lcab.report' has no attribute {name!r}")
