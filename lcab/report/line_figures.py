"""Line figures of the result pages: speed against length, and CP scaling.

- scaling_figure: one mask's kernels, TFLOP/s (median ms on a CPU) against
  sequence length (or, for a block-sparse sweep, against keep), a panel per
  direction, each point with its p20-p80 range as an error bar.
- cp_figure: one mask's CP strategies, per-GPU TFLOP/s against cp size, a
  panel per (sequence length, direction), each with the single-GPU kernel a
  strategy runs inside as a horizontal reference line.

Only lines with at least one number are drawn (a backend that measured
nothing here is left out of the figure and its legend; the page's tables
give its codes and reasons); rows without any number give a figure that
says so. Every line's colour, marker and dash come from lcab.report.styles;
the legend sits under the panels, clear of the titles. Functions return the
Figure (Agg canvas, no pyplot); save() writes it. lcab.report.figures draws
the same CP and keep figures for `python -m lcab.report --out`, and takes
save (so DPI), PANEL_TITLES and log2_axis from here.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from lcab import results
from lcab.report import measure, styles, tables
from lcab.status import Status
from lcab.workloads import format_seqlen

DPI = 120
PANEL_TITLES = {"fwd": "forward", "bwd": "backward"}
REFERENCE_DASHES = (":", "--", "-.")  # one-GPU reference lines, in black


def save(fig: Figure, path: str | pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def legend_labels(fig: Figure) -> list[str]:
    """The labels of a figure's legends (what a reader can tell apart)."""
    return [text.get_text() for legend in fig.legends for text in legend.get_texts()]


def measured_lines(rows: pd.DataFrame) -> list[str]:
    """Lines (rows' "line" column) with at least one OK row, in table order."""
    ok = set(rows.loc[rows["status"] == Status.OK.value, "line"])
    return [line for line in tables.line_order(rows) if line in ok]


def log2_axis(ax, values: Sequence[int], labels: Sequence[str]) -> None:
    """A log2 x axis with a tick at each value, room at both ends."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(values, labels)
    ax.minorticks_off()
    ax.set_xlim(values[0] / 1.3, values[-1] * 1.3)


def _curve(ax, rows: pd.DataFrame, x: str, shown: measure.Measure, look: styles.Style,
           label: str) -> None:
    """The OK points of one line against column x, p20-p80 error bars."""
    ok = rows[rows["status"] == Status.OK.value].sort_values(x)
    if ok.empty:
        return
    values = ok[shown.column].astype(float).to_numpy()
    bounds = [shown.bounds(row) for _, row in ok.iterrows()]
    # A row without its percentiles gets no bar rather than a NaN one.
    below = np.nan_to_num([max(value - low, 0.0) for value, (low, _) in zip(values, bounds)])
    above = np.nan_to_num([max(high - value, 0.0) for value, (_, high) in zip(values, bounds)])
    ax.errorbar(ok[x].astype(float), values, yerr=[below, above], capsize=3, markersize=5,
                linewidth=1.4, label=label, **look.line_kwargs())


def _title(fig: Figure, title: str, setting: str) -> None:
    """What the figure shows, and under it the setting, smaller: one long
    line would run past a narrow figure's edges."""
    fig.suptitle(f"{title}\n{setting}", fontsize=10)


def _fit_y(ax, shown: measure.Measure) -> None:
    """Room above the highest point, error bar or reference line."""
    if shown.higher_is_better:
        # Lines, error bar caps (their ends) and reference lines alike.
        heights = [np.max(np.asarray(line.get_ydata(), dtype=float)) for line in ax.get_lines()
                   if len(line.get_ydata())]
        top = max([h for h in heights if np.isfinite(h)] + [1e-9])
        ax.set_ylim(0, top * 1.12)


def _bottom_legend(fig: Figure, handles: Mapping[str, object]) -> None:
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncol=min(4, len(handles)), fontsize=8, frameon=False)


def _collect_handles(axes) -> dict[str, object]:
    handles: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    return handles


def _look(looks: Mapping[str, styles.Style], line: str, lines: list[str]) -> styles.Style:
    """The page's look of a line; a line it has none for takes one past them."""
    return looks[line] if line in looks else styles.style(len(looks) + lines.index(line))


def _directions(rows: pd.DataFrame) -> list[str]:
    return [d for d in tables.DIRECTIONS if (rows["direction"] == d).any()]


def _nothing_measured(title: str, setting: str) -> Figure:
    """A figure for rows without a single number: it says so rather than
    drawing empty axes (the tables give each row's code)."""
    fig = Figure(figsize=(8.0, 2.6), layout="constrained")
    fig.text(0.5, 0.45, "nothing measured: every row failed (the table gives each code)",
             ha="center", va="center", fontsize=11, color="firebrick")
    _title(fig, title, setting)
    return fig


def scaling_figure(rows: pd.DataFrame, title: str, setting: str,
                   looks: Mapping[str, styles.Style], x: str = "seqlen",
                   panel_by: Sequence[str] = ()) -> Figure:
    """Kernel lines of one mask against column x (seqlen, or keep for a
    sparsity sweep): a row of panels per value of `panel_by` (e.g. seqlen
    and block_size for a keep sweep), a column per direction.

    rows: one setting's newest kernel rows of one mask, with "line"
    (tables.with_line); looks: the page's styles of every line.
    """
    shown = measure.of_rows(rows)
    lines = measured_lines(rows)
    if not lines:
        return _nothing_measured(title, setting)
    rows = rows[rows["line"].isin(lines)]
    panels = (sorted(set(rows[list(panel_by)].itertuples(index=False, name=None)))
              if panel_by else [()])
    directions = _directions(rows)
    fig = Figure(figsize=(5.2 * len(directions) + 1.0, 3.6 * len(panels) + 1.4),
                 layout="constrained")
    axes = fig.subplots(len(panels), len(directions), squeeze=False)
    for panel, panel_axes in zip(panels, axes):
        mine = rows
        for column, value in zip(panel_by, panel):
            mine = mine[mine[column] == value]
        for ax, direction in zip(panel_axes, directions):
            for line in lines:
                _curve(ax, mine[(mine["line"] == line) & (mine["direction"] == direction)], x,
                       shown, _look(looks, line, lines), line)
            _axes_for(ax, x, rows, shown)
            _fit_y(ax, shown)
            where = ", ".join(_panel_text(c, v) for c, v in zip(panel_by, panel))
            name = PANEL_TITLES.get(direction, direction)
            ax.set_title(f"{where}: {name}" if where else name, fontsize=10)
    _bottom_legend(fig, _collect_handles(axes.ravel()))
    _title(fig, title, setting)
    return fig


def _panel_text(column: str, value) -> str:
    if column == "seqlen":
        return format_seqlen(int(value))
    return f"{tables.SWEPT_MASK_PARAMS.get(column, column)} {value:g}"


def _axes_for(ax, x: str, rows: pd.DataFrame, shown: measure.Measure) -> None:
    if x in ("seqlen", "cp_size"):
        values = sorted(int(v) for v in pd.unique(rows[x]))
        log2_axis(ax, values, [format_seqlen(v) if x == "seqlen" else str(v) for v in values])
        ax.set_xlabel("sequence length" if x == "seqlen" else "cp size (GPUs)")
    else:
        ax.set_xlim(0, 1.02)  # keep is in (0, 1]
        ax.set_xlabel(f"{x} (kept fraction of kv blocks)" if x == "keep" else x)
    if not shown.higher_is_better:
        ax.set_yscale("log")  # CPU times span orders of magnitude across lengths
    ax.set_ylabel(shown.name if x != "cp_size" or not shown.higher_is_better
                  else f"{shown.name} per GPU")
    ax.grid(alpha=0.3)


# ---------------------------------------------------------------- CP


def single_gpu_references(cp_rows: pd.DataFrame, kernel_rows: pd.DataFrame) -> pd.DataFrame:
    """The single-GPU rows a CP panel is compared with: OK rows of the inner
    kernels the CP rows name (tables.inner_kernel), run with their default
    options (what a strategy runs inside unless told otherwise), on the CP
    rows' workloads; with "line" = "1 GPU <kernel>"."""
    inners = {name for _, row in cp_rows.iterrows() if (name := tables.inner_kernel(row))}
    mine = kernel_rows[kernel_rows["backend"].isin(inners)
                       & kernel_rows["workload_key"].isin(set(cp_rows["workload_key"]))
                       & kernel_rows["options"].map(results.default_options)
                       & (kernel_rows["status"] == Status.OK.value)]
    return mine.assign(line=["1 GPU " + backend for backend in mine["backend"]])


def cp_figure(cp_rows: pd.DataFrame, kernel_rows: pd.DataFrame, title: str, setting: str,
              looks: Mapping[str, styles.Style]) -> Figure:
    """CP lines of one mask: per-GPU TFLOP/s (median ms on a CPU) against cp
    size, a row of panels per sequence length, a column per direction, the
    single-GPU inner kernels (single_gpu_references) as horizontal lines.

    cp_rows: one setting's newest CP rows of one mask with "line";
    kernel_rows: the same setting's newest kernel rows.
    """
    shown = measure.of_rows(cp_rows)
    lines = measured_lines(cp_rows)
    if not lines:
        return _nothing_measured(title, setting)
    cp_rows = cp_rows[cp_rows["line"].isin(lines)]
    references = single_gpu_references(cp_rows, kernel_rows)
    reference_dashes = {line: REFERENCE_DASHES[i % len(REFERENCE_DASHES)]
                        for i, line in enumerate(sorted(set(references["line"])))}
    seqlens = sorted(int(s) for s in pd.unique(cp_rows["seqlen"]))
    directions = _directions(cp_rows)
    fig = Figure(figsize=(5.2 * len(directions) + 1.0, 3.4 * len(seqlens) + 1.6),
                 layout="constrained")
    axes = fig.subplots(len(seqlens), len(directions), squeeze=False)
    for seqlen, panel_axes in zip(seqlens, axes):
        for ax, direction in zip(panel_axes, directions):
            mine = cp_rows[(cp_rows["seqlen"] == seqlen) & (cp_rows["direction"] == direction)]
            for line in lines:
                _curve(ax, mine[mine["line"] == line], "cp_size", shown, _look(looks, line, lines),
                       line)
            here = references[(references["workload_key"].isin(set(mine["workload_key"])))
                              & (references["direction"] == direction)]
            for line, rows in here.groupby("line", sort=True):
                ax.axhline(float(rows[shown.column].iloc[-1]), color="black", linewidth=1.1,
                           linestyle=reference_dashes[line], label=line)
            _axes_for(ax, "cp_size", cp_rows, shown)
            _fit_y(ax, shown)
            ax.set_title(f"{format_seqlen(seqlen)}: {PANEL_TITLES.get(direction, direction)}",
                         fontsize=10)
    handles = _collect_handles(axes.ravel())
    # References last, after the strategies, in a fixed order.
    ordered = {k: v for k, v in handles.items() if k not in reference_dashes}
    ordered |= {k: Line2D([], [], color="black", linestyle=dash, label=k)
                for k, dash in reference_dashes.items() if k in handles}
    _bottom_legend(fig, ordered)
    _title(fig, title, setting)
    return fig
