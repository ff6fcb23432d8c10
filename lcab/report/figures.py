"""Figures of result rows (PNG): kernel bar charts, CP line charts, peak
memory against seqlen and block-sparse TFLOP/s against keep.

Kernel figures follow the MagiAttention benchmark figures: one picture per
mask, grouped bars per sequence length, one bar per backend, the TFLOP/s
(median ms on a CPU) printed above each bar, and a failed row shown as its
status code (E for out of memory, X for unsupported, ...) on a stub bar at
the same place, so a missing number is never mistaken for a slow one. A
backend with no number anywhere in the figure is left out of it (its codes
are in the tables). Colours, markers and hatches come from
lcab.report.styles, so any two backends look different.

Only this module imports matplotlib, and it uses `matplotlib.figure.Figure`
with the Agg canvas directly, not pyplot: no global backend switch and no
figure registry that keeps every figure alive.
"""

from __future__ import annotations

import pathlib

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from lcab.report import legend, measure, memory, sparsity, styles, tables
from lcab.status import Status
from lcab.workloads import format_seqlen

DPI = 120
PANEL_TITLES = {"fwd": "forward", "bwd": "backward"}
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


def _save(fig: Figure, path: str | pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


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
    """A PNG of one mask's kernel TFLOP/s: fwd and bwd panels of grouped bars."""
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
    return _save(fig, path)


# ---------------------------------------------------------------- line helpers


def _ok_top(rows: pd.DataFrame) -> float:
    """The highest OK TFLOP/s of the rows (1 without any), to scale a panel."""
    ok_values = rows.loc[rows["status"] == Status.OK.value, "tflops"]
    return float(ok_values.max()) if not ok_values.empty else 1.0


def _tflops_curve(ax, mine, x: str, k: int, top: float, look: styles.Style, dash: str,
                  name: str) -> None:
    """One curve of TFLOP/s against column x; a failed point is its code near the x axis."""
    mine = mine.sort_values(x)
    ok = mine[mine["status"] == Status.OK.value]
    color = look.color
    ax.plot(ok[x], ok["tflops"], dash, marker=look.marker, color=color, label=name)
    for r in mine[mine["status"] != Status.OK.value].itertuples(index=False):
        # Each curve's codes at its own height (k), so failures at one x stay readable.
        ax.text(getattr(r, x), top * (0.03 + 0.06 * (k % 12)),
                tables.format_cell(r.status, r.tflops), ha="center", va="bottom",
                fontsize=9, fontweight="bold", color=color)


def _log2_axis(ax, values, labels) -> None:
    """A log2 x axis with a tick at each value, room at both ends."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(values, labels)
    ax.minorticks_off()
    ax.set_xlim(values[0] / 1.25, values[-1] * 1.25)


def _panel_legend(fig: Figure, axes) -> None:
    """Every panel's curves, once each: a curve may fail everywhere in one panel."""
    legend = {}
    for ax in axes:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend(list(legend.values()), list(legend), loc="outside right center",
               fontsize=8, frameon=False)


# ---------------------------------------------------------------- CP lines


def _cp_panel(ax, rows, lines, looks, dashes) -> None:
    """Per-GPU TFLOP/s against cp_size; a failed point is its code on the x axis."""
    top = _ok_top(rows)
    curves = [(line, seqlen) for line in lines for seqlen in dashes]
    for k, (line, seqlen) in enumerate(curves):
        mine = rows[(rows["line"] == line) & (rows["seqlen"] == seqlen)]
        if mine.empty:
            continue
        name = line if len(dashes) == 1 else f"{line} @ {format_seqlen(seqlen)}"
        _tflops_curve(ax, mine, "cp_size", k, top, looks[line], dashes[seqlen], name)
    sizes = sorted(int(s) for s in pd.unique(rows["cp_size"]))
    _log2_axis(ax, sizes, [str(s) for s in sizes])
    ax.set_ylim(0, top * 1.15)
    ax.set_xlabel("cp_size (GPUs)")
    ax.set_ylabel("TFLOP/s per GPU")
    ax.grid(alpha=0.3)


def cp_figure(frame: pd.DataFrame, mask: str, path: str | pathlib.Path) -> pathlib.Path:
    """A PNG of one mask's CP rows: per-GPU TFLOP/s against cp_size, fwd and bwd panels."""
    rows = _rows_of_mask(tables.suite_rows(frame, "cp"), "cp", mask)
    label = tables.single_setting(rows, "cp_figure")
    rows = tables.with_line(rows)
    lines = tables.line_order(rows)
    looks = styles.styles(lines)
    # One dash pattern per sequence length, when a mask was run at several.
    seqlens = sorted(int(s) for s in pd.unique(rows["seqlen"]))
    dashes = dict(zip(seqlens, ["-", "--", ":", "-."] * len(seqlens)))
    directions = [d for d in tables.DIRECTIONS if (rows["direction"] == d).any()]

    fig = Figure(figsize=(5.5 * len(directions) + 2.5, 5.0), layout="constrained")
    axes = fig.subplots(1, len(directions), squeeze=False)[0]
    for ax, direction in zip(axes, directions):
        _cp_panel(ax, rows[rows["direction"] == direction], lines, looks, dashes)
        ax.set_title(PANEL_TITLES.get(direction, direction), fontsize=10)
    _panel_legend(fig, axes)
    seqlen_text = ", ".join(format_seqlen(s) for s in seqlens)
    fig.suptitle(f"{mask} at {seqlen_text}, context parallel: {label}", fontsize=11)
    _footnote(fig, rows)
    return _save(fig, path)


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
    _log2_axis(ax, seqlens, [format_seqlen(s) for s in seqlens])
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
    return _save(fig, path)


# ---------------------------------------------------------------- sparsity


def sparsity_figure(frame: pd.DataFrame, mask: str, path: str | pathlib.Path) -> pathlib.Path:
    """A PNG of one block-sparse mask's TFLOP/s against keep (0 to 1): one
    line per backend, one row of panels per (seqlen, block_size), one column
    per direction (sparsity.sparsity_rows)."""
    rows = _rows_of_mask(sparsity.sparsity_rows(frame), "block-sparse kernel", mask)
    label = tables.single_setting(rows, "sparsity_figure")
    lines = tables.line_order(rows)
    looks = styles.styles(lines)
    panels = sorted(set(zip(rows["seqlen"].astype(int), rows["block_size"])))
    directions = [d for d in tables.DIRECTIONS if (rows["direction"] == d).any()]

    fig = Figure(figsize=(4.8 * len(directions) + 2.5, 3.4 * len(panels) + 0.8),
                 layout="constrained")
    axes = fig.subplots(len(panels), len(directions), squeeze=False)
    for (seqlen, block), panel_axes in zip(panels, axes):
        for ax, direction in zip(panel_axes, directions):
            mine = rows[(rows["seqlen"] == seqlen) & (rows["block_size"] == block)
                        & (rows["direction"] == direction)]
            top = _ok_top(mine)
            for k, line in enumerate(lines):
                curve = mine[mine["line"] == line]
                if not curve.empty:
                    _tflops_curve(ax, curve, "keep", k, top, looks[line], "-", line)
            ax.set_xlim(0, 1.02)  # keep is in (0, 1]; the margin shows a point at 1
            ax.set_ylim(0, top * 1.15)
            ax.set_xlabel("keep (kept fraction of kv blocks)")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            ax.set_title(f"{format_seqlen(seqlen)}, block {block}: "
                         f"{PANEL_TITLES.get(direction, direction)}", fontsize=10)
    _panel_legend(fig, axes.ravel())
    fig.suptitle(f"{mask}, TFLOP/s against keep: {label}", fontsize=11)
    _footnote(fig, rows)
    return _save(fig, path)
