"""Figures of result rows (PNG) for `python -m lcab.report --out`: kernel
bar charts, peak memory against seqlen, CP scaling and block-sparse speed
against keep. Each takes one setting's rows, a mask and a path.

Kernel figures follow the MagiAttention benchmark figures: one picture per
mask, grouped bars per sequence length, one bar per backend, the TFLOP/s
(median ms on a CPU) printed above each bar, and a failed row shown as its
status code (E for out of memory, X for unsupported, ...) on a stub bar at
the same place, so a missing number is never mistaken for a slow one. A
backend with no number anywhere in the figure is left out of it (its codes
are in the tables). Colours, markers and hatches come from
lcab.report.styles, so any two backends look different.

The CP and keep figures are the result pages' line figures
(lcab.report.line_figures): p20-p80 error bars, the single-GPU kernel as a
reference line in CP panels; a failed row's code is in the tables only.
draw_cp and draw_sparsity return those Figures unsaved.

Only the figure modules import matplotlib, and they use
`matplotlib.figure.Figure` with the Agg canvas directly, not pyplot: no
global backend switch and no figure registry that keeps every figure alive.
"""

from __future__ import annotations

import pathlib

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from lcab.report import legend, line_figures, measure, memory, sparsity, styles, tables
from lcab.report.line_figures import PANEL_TITLES, log2_axis, save
from lcab.status import Status
from lcab.workloads import format_seqlen

# Above this many bars in a panel the values are printed vertically so
# neighbouring labels do not run into each other.
UPRIGHT_LABELS_ABOVE = 16
STUB_FRACTION = 0.012  # a failed row's stub bar, as a fraction of the panel's height
DIRECTION_STYLES = {"fwd": "-", "bwd": "--"}  # memory lines: fwd solid, bwd dashed


def _rows_of_mask(rows: pd.DataFrame, suite: str, mask: str) -> pd.DataFrame:
    mine = rows[rows["mask"] == mask]
    if mine.empty:
        present = sorted(map(str, pd.unique(rows["mask"])))
        raise ValueError(f"no {suite} rows for mask={mask!r}; masks with {suite} rows: {present}")
    return mine


def _footnote(fig: Figure, rows: pd.DataFrame) -> None:
    # A figure-level x label, so constrained layout keeps it clear of the axes.
    if (rows["status"] != Status.OK.value).any():
        fig.supxlabel(legend.one_line(), fontsize=7, color="0.3")


# ---------------------------------------------------------------- kernel bars


def _kernel_panel(ax, rows, backends, seqlens, looks, upright: bool) -> None:
    """Grouped bars: one group per seqlen, one bar per backend."""
    shown = measure.of_rows(rows)
    ok_values = rows.loc[rows["status"] == Status.OK.value, shown.column]
    top = float(ok_values.max()) if not ok_values.empty else 1.0
    width = 0.8 / len(backends)
    cells = {(r.backend, r.seqlen): r for r in rows.itertuples(index=False)}
    for b, backend in enumerate(backends):
        for s, seqlen in enumerate(seqlens):
            row = cells.get((backend, seqlen))
            if row is None:
                continue  # never measured: no bar, no letter
            x = s - 0.4 + width * (b + 0.5)
            value = getattr(row, shown.column)
            label = tables.format_cell(row.status, value)
            failed = row.status != Status.OK.value
            height = top * STUB_FRACTION if failed else float(value)
            ax.bar(x, height, width * 0.92, color=looks[backend].color,
                   hatch=looks[backend].hatch, edgecolor="white", linewidth=0)
            ax.text(x, height + top * 0.01, label, ha="center", va="bottom",
                    rotation=90 if upright and not failed else 0,  # codes are short
                    fontsize=9 if failed else 7,
                    fontweight="bold" if failed else "normal",
                    color="firebrick" if failed else "black")
    ax.set_xticks(range(len(seqlens)), [format_seqlen(s) for s in seqlens])
    ax.set_xlim(-0.5, len(seqlens) - 0.5)
    ax.set_ylim(0, top * (1.22 if upright else 1.12))
    ax.set_xlabel("sequence length")
    ax.set_ylabel(shown.name)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def kernel_figure(frame: pd.DataFrame, mask: str, path: str | pathlib.Path) -> pathlib.Path:
    """A PNG of one mask's kernel TFLOP/s (median ms on a CPU): fwd and bwd
    panels of grouped bars."""
    rows = _rows_of_mask(tables.suite_rows(frame, "kernel"), "kernel", mask)
    label = tables.single_setting(rows, "kernel_figure")
    # A backend that measured nothing here would only add stubs and a legend entry.
    measured = set(rows.loc[rows["status"] == Status.OK.value, "backend"])
    looks = styles.styles(tables.backend_order(rows))  # as in every figure of these rows
    backends = [b for b in tables.backend_order(rows) if b in measured] or list(looks)
    seqlens = sorted(int(s) for s in pd.unique(rows["seqlen"]))
    directions = [d for d in tables.DIRECTIONS if (rows["direction"] == d).any()]
    upright = len(backends) * len(seqlens) > UPRIGHT_LABELS_ABOVE

    width = min(26.0, max(9.0, 3.0 + len(seqlens) * (0.45 * len(backends) + 0.5)))
    fig = Figure(figsize=(width, 3.4 * len(directions) + 1.2), layout="constrained")
    axes = fig.subplots(len(directions), 1, squeeze=False)[:, 0]
    for ax, direction in zip(axes, directions):
        _kernel_panel(ax, rows[rows["direction"] == direction], backends, seqlens, looks, upright)
        ax.set_title(PANEL_TITLES.get(direction, direction), fontsize=10)
    # Legend from the styles, not the bars: a backend may have no bar in a panel.
    handles = [Patch(facecolor=looks[b].color, hatch=looks[b].hatch, edgecolor="white", label=b)
               for b in backends]
    # Beside the panels, centred: at the top it would collide with the title.
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False)
    fig.suptitle(f"{mask}: {label}", fontsize=11)
    _footnote(fig, rows)
    return save(fig, path)


# ---------------------------------------------------------------- CP lines


def draw_cp(frame: pd.DataFrame, mask: str) -> Figure:
    """One mask's CP rows as line_figures.cp_figure draws them: per-GPU
    TFLOP/s (median ms on a CPU) against cp size, the single-GPU inner
    kernels of the same rows as reference lines."""
    rows = tables.with_line(_rows_of_mask(tables.suite_rows(frame, "cp"), "cp", mask))
    label = tables.single_setting(rows, "cp_figure")
    shown = measure.of_rows(rows)
    unit = f"per-GPU {shown.name}" if shown.higher_is_better else shown.name
    title = (f"{mask}, context parallel: {unit} against cp size "
             "(black: the kernel alone on one GPU)")
    return line_figures.cp_figure(rows, tables.suite_rows(frame, "kernel"), title, label,
                                  styles.styles(tables.line_order(rows)))


def cp_figure(frame: pd.DataFrame, mask: str, path: str | pathlib.Path) -> pathlib.Path:
    """A PNG of one mask's CP rows (draw_cp)."""
    return save(draw_cp(frame, mask), path)


# ---------------------------------------------------------------- peak memory


def memory_figure(frame: pd.DataFrame, mask: str, path: str | pathlib.Path) -> pathlib.Path:
    """A PNG of one mask's peak memory (GiB) against seqlen: one colour per
    backend, fwd solid and bwd dashed (memory.memory_rows: OK rows only)."""
    rows = _rows_of_mask(memory.memory_rows(frame), "memory", mask)
    label = tables.single_setting(rows, "memory_figure")
    lines = tables.line_order(rows)
    looks = styles.styles(lines)
    fig = Figure(figsize=(10.0, 5.0), layout="constrained")
    ax = fig.subplots()
    for line in lines:
        for direction, style in DIRECTION_STYLES.items():
            mine = rows[(rows["line"] == line) & (rows["direction"] == direction)]
            mine = mine.sort_values("seqlen")
            ax.plot(mine["seqlen"], mine["gib"], style, marker=looks[line].marker,
                    color=looks[line].color)
    seqlens = sorted(int(s) for s in pd.unique(rows["seqlen"]))
    log2_axis(ax, seqlens, [format_seqlen(s) for s in seqlens])
    ax.set_ylim(0, float(rows["gib"].max()) * 1.1)
    ax.set_xlabel("sequence length")
    ax.set_ylabel(f"peak memory, {memory.UNIT}")
    ax.grid(alpha=0.3)
    # Colours name the backends, styles the directions: two keys, one legend.
    handles = [Line2D([], [], color=looks[line].color, marker=looks[line].marker, label=line)
               for line in lines]
    handles += [Line2D([], [], color="0.3", linestyle=style, label=PANEL_TITLES[direction])
                for direction, style in DIRECTION_STYLES.items()]
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False)
    fig.suptitle(f"{mask}, peak memory: {label}", fontsize=11)
    return save(fig, path)


# ---------------------------------------------------------------- sparsity


def draw_sparsity(frame: pd.DataFrame, mask: str) -> Figure:
    """One block-sparse mask's rows (sparsity.sparsity_rows) as
    line_figures.scaling_figure draws a keep sweep: TFLOP/s (median ms on a
    CPU) against keep, one line per backend, a row of panels per (seqlen,
    block_size), a column per direction."""
    rows = _rows_of_mask(sparsity.sparsity_rows(frame), "block-sparse kernel", mask)
    label = tables.single_setting(rows, "sparsity_figure")
    unit = measure.of_rows(rows).name
    return line_figures.scaling_figure(rows, f"{mask}: {unit} against keep", label,
                                       styles.styles(tables.line_order(rows)), x="keep",
                                       panel_by=["seqlen", "block_size"])


def sparsity_figure(frame: pd.DataFrame, mask: str, path: str | pathlib.Path) -> pathlib.Path:
    """A PNG of one block-sparse mask's rows against keep (draw_sparsity)."""
    return save(draw_sparsity(frame, mask), path)
