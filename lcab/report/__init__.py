"""Reports: comparison tables (markdown, CSV) and figures from result rows.

`python -m lcab.report --results PATH --out DIR` writes them all. The table
functions need only pandas; the figure functions import matplotlib, so they
are loaded on first use and `import lcab.report` stays cheap for the
benchmark CLI, which calls `short_table` at the end of a run.
"""

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
    "kernel_figure",
    "kernel_table",
    "latest",
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
