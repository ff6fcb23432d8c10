"""python -m lcab.report --results PATH[,PATH...] --out DIR: tables and figures.

    python -m lcab.report --results PATH --summary   # the short table, printed
    python -m lcab.report --pages                    # the result pages -> docs/results/
    python -m lcab.report --headline                 # the README's headline table, printed
    python -m lcab.report --results MINE --against OURS  # does a rerun reproduce OURS?

--pages writes lcab.report.pages' result pages (one markdown page per
sweep and card, figures, index.md, the tidy export results.csv and export.md) into
--out, by default docs/results/; --headline prints
lcab.report.headline.markdown(). Pages read the current runs of each
canonical sweep (the newest on each card, lcab.canonical.current; one page
each), the headline the most complete of them, unless --results names
folders (one page, or one headline sweep, per folder).

--against compares the --results rows with the rows they repeat (for
example a canonical run's folder under results/): per backend, the median of
your time over ours; the cases whose status differs; the cases outside the
runs' noise (lcab.report.reproduce). It prints this and, with --out, writes
reproduce.md and reproduce.csv there (one line per case) instead of the report.

--results takes result JSONL files or directories (searched for *.jsonl and
*.jsonl.gz);
repeat the flag or separate paths with commas (a value that names an
existing path is taken whole, commas and all). Reruns and merged files are
reduced to the newest row of each measurement; a damaged line is skipped
with a warning naming its file and line (lcab.results, "Reading"). --out is
checked before anything is read: a folder that cannot be created or written
into is a usage error naming the reason. --summary prints the short
summary table (the one `python -m lcab.experiments` prints at the end of a
run: TFLOP/s fwd / bwd per backend, per-GPU for CP; bus bandwidth for comm
rows). DIR receives:

  kernel_fwd.md, kernel_bwd.md    kernel TFLOP/s, one file per direction
  kernel_fwd.csv, kernel_bwd.csv  the same tables, one "setting" column first
  cross_framework.md, .csv        best JAX vs best PyTorch backend per cell
  cp.md, cp.csv                   per-GPU TFLOP/s of CP rows (only if any)
  cp_cross_framework.md, .csv     best JAX vs best PyTorch CP strategy per cell
  cp_vs_single.md, .csv           CP per-GPU TFLOP/s over its inner kernel's
                                  single-GPU TFLOP/s on the same workload
  module.md, module.csv           per-GPU TFLOP/s of jax.module rows (if any)
  comm.md, comm.csv               the comm suite: bus bandwidth per collective,
                                  rank count and size, alpha-beta fit (if any)
  memory.md, memory.csv           peak device memory of kernel rows in GiB
                                  (2^30 bytes), cells "fwd / bwd" per backend,
                                  (mask, seqlen); only OK rows, a cell without
                                  one is empty (if any OK kernel row has
                                  peak_mem_bytes; lcab.report.memory)
  sparsity.md, sparsity.csv       block-sparse masks (block_sparse,
                                  var_block_sparse): TFLOP/s per backend by
                                  (mask, seqlen, block_size, direction, keep)
                                  (if any such rows; lcab.report.sparsity)
  figures/kernel_<mask>.png       one per mask with kernel rows
  figures/cp_<mask>.png           one per mask with CP rows
  figures/memory_<mask>.png       peak GiB against seqlen (log2), one line per
                                  backend, fwd solid, bwd dashed
  figures/sparsity_<mask>.png     TFLOP/s against keep (0 to 1), one line per
                                  backend, a panel per (seqlen, block_size)
                                  and direction
  results.csv                     the tidy export: one row per measurement,
                                  one number per column (lcab.report.export;
                                  results.parquet beside it with pyarrow)
  export.md                       its columns
  README.md                       an index: devices, dates, legend, every
                                  table embedded and every figure shown

The kernel and cross-framework files are written when kernel rows exist, a
direction's file when that direction has rows. Results of several settings
(shapes, dtype, device) give one section per setting in each markdown file,
and figure names gain the setting: figures/kernel_<mask>__<setting>.png.

Kernel, cross-framework, CP, memory and summary tables key cells by (mask,
seqlen). Where a block-sparse family ran with several settings (keep,
block_size), e.g. a keep sweep at one seqlen, every row of that family shows
its setting in the mask column, "block_sparse(keep=0.2, block=128)"
(tables.label_mask_settings); rows of two settings never share a cell.
sparsity.md and its figure put the same rows against keep; the kernel and
memory figures leave them out (one point per setting).
"""

from __future__ import annotations

import contextlib
import os
import pathlib

import pandas as pd
from absl import app, flags

from lcab import results
from lcab.report import (
    export,
    figures,
    headline,
    legend,
    memory,
    pages,
    readme,
    reproduce,
    sources,
    sparsity,
    tables,
)
from lcab.report.pages import slug
from lcab.report.summary import summary_text

_RESULTS = flags.DEFINE_multi_string(
    "results", None,
    "Result JSONL files or directories; repeat the flag or separate paths with commas "
    "(a value that is an existing path is taken whole).",
)
_OUT = flags.DEFINE_string(
    "out", None, "Directory to write the tables, figures and README.md into (with --pages: "
    f"the pages, default {pages.DEFAULT_OUT})."
)
_SUMMARY = flags.DEFINE_bool(
    "summary", False, "Print the short summary table of the rows (with or without --out)."
)
_PAGES = flags.DEFINE_bool(
    "pages", False, "Write the result pages, one per sweep and card, with the tidy export "
    "and an index, into --out (default docs/results/), from the current canonical runs or "
    "the --results folders.",
)
_HEADLINE = flags.DEFINE_bool(
    "headline", False, "Print the README's headline table (lcab.report.headline) of the "
    "most complete current canonical run of each sweep or of the --results folders.",
)


_AGAINST = flags.DEFINE_multi_string(
    "against", None,
    "Rows to compare the --results rows with (files or directories, as --results): does "
    "your rerun reproduce them? Prints the comparison; with --out, also writes "
    "reproduce.md and reproduce.csv there.",
)
_UPDATE_README = flags.DEFINE_string(
    "update_readme", None, "Rewrite the generated blocks (headline table, legend) of this "
    "README from the current canonical rows.",
)


@flags.multi_flags_validator(["results", "out", "summary", "pages", "headline", "update_readme",
                              "against"])
def _something_to_do(values) -> bool:
    if values["update_readme"] is not None:
        return True
    if values["against"] is not None:
        if values["results"] is None:
            raise flags.ValidationError("--against needs --results (your rows, to compare "
                                        "with the --against rows)")
        return True
    if values["pages"] or values["headline"]:
        if values["summary"] and values["results"] is None:
            raise flags.ValidationError("--summary needs --results")
        return True  # the canonical folders by default
    if values["results"] is None:
        raise flags.ValidationError(
            "--results must have a value (or give --pages or --headline, which read the "
            "current canonical runs)")
    if values["out"] is None and not values["summary"]:
        raise flags.ValidationError(
            "--out must have a value (or give --summary to print the short table)")
    return True


def split_paths(values: list[str] | None) -> list[str]:
    """The paths of --results values: a value that exists as a path is one
    path (a file or folder may have a comma in its name); any other is
    split on commas."""
    return [part for value in values or () for part in _paths_of(value)]


def _paths_of(value: str) -> list[str]:
    if pathlib.Path(value).exists():
        return [value]
    return [part.strip() for part in value.split(",") if part.strip()]


@flags.validator("against")
@flags.validator("results")
def _results_exist(values) -> bool:
    if values is None:
        return True  # mark_flags_as_required reports it
    paths = split_paths(values)
    if not paths:
        raise flags.ValidationError("no path given; give result JSONL files or directories")
    missing = [path for path in paths if not pathlib.Path(path).exists()]
    if missing:
        raise flags.ValidationError(f"no such file or directory: {', '.join(missing)}")
    return True


def _a_file(path: pathlib.Path) -> bool:
    """Whether something other than a directory is at `path`."""
    try:
        return path.exists() and not path.is_dir()
    except OSError:  # not even looked at: writing_problem says why
        return False


@flags.validator("out")
def _out_is_a_directory(value) -> bool:
    if value is not None and _a_file(pathlib.Path(value)):
        raise flags.ValidationError(f"{value} exists and is not a directory")
    return True


@flags.validator("out")
def _out_is_writable(value) -> bool:
    """Found before the report is drawn, not halfway through writing it."""
    if value is None or _a_file(pathlib.Path(value)):
        return True  # nothing to check, or _out_is_a_directory says what is wrong
    problem = writing_problem(pathlib.Path(value))
    if problem:
        raise flags.ValidationError(f"cannot write the report there: {problem}")
    return True


def writing_problem(folder: pathlib.Path) -> str | None:
    """Why files cannot be written into `folder` (None: they can), found by
    creating it and a probe file in it; what the probe created is removed
    again, so a command line refused for another reason leaves nothing."""
    missing: list[pathlib.Path] = []
    probe = folder / f".lcab_report_probe_{os.getpid()}"
    try:
        missing = [path for path in (folder, *folder.parents) if not path.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as exc:
        return str(exc)  # one line: "[Errno N] reason: 'path'"
    finally:
        for path in missing:  # innermost first; each one empty again
            with contextlib.suppress(OSError):
                path.rmdir()
    return None


# ---------------------------------------------------------------- writing


def _cp_vs_single_or_empty(group: pd.DataFrame) -> pd.DataFrame:
    if not (group["suite"] == "cp").any():
        return pd.DataFrame()
    return tables.cp_vs_single_table(group)


def _per_setting(frame, make_table) -> list[tuple[str, pd.DataFrame]]:
    """(setting label, table) for each setting group that gives a non-empty table."""
    made = [(label, make_table(group)) for label, group in tables.setting_groups(frame)]
    return [(label, table) for label, table in made if len(table)]


def _markdown(title: str, sections, level: int = 1, with_legend: bool = True) -> str:
    """A title, then one heading and table per setting."""
    parts = [f"{'#' * level} {title}", ""]
    for label, table in sections:
        parts += [f"{'#' * (level + 1)} {label}", "", tables.to_markdown(table), ""]
    if with_legend:
        parts += [f"Legend: {legend.one_line()}", ""]
    return "\n".join(parts)


def _csv(sections) -> str:
    """All sections in one CSV, a leading "setting" column telling them apart."""
    frames = [table.reset_index().assign(setting=label) for label, table in sections]
    joined = pd.concat(frames, ignore_index=True)
    return joined[["setting", *(c for c in joined.columns if c != "setting")]].to_csv(index=False)


class ReportWriter:
    """Writes files under one directory and remembers what it wrote, for the index."""

    def __init__(self, out: pathlib.Path):
        self.out = out
        self.written: list[pathlib.Path] = []
        self.index_sections: list[str] = []

    def text(self, name: str, content: str) -> pathlib.Path:
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        self.written.append(path)
        return path

    def table(self, stem: str, title: str, sections) -> None:
        """stem.md and stem.csv, and the same tables embedded in the index."""
        if not sections:
            return
        self.text(f"{stem}.md", _markdown(title, sections))
        self.text(f"{stem}.csv", _csv(sections))
        body = _markdown(title, sections, level=2, with_legend=False)
        links = f"Files: [{stem}.md]({stem}.md), [{stem}.csv]({stem}.csv)"
        self.index_sections.append(f"{body}\n{links}\n")

    def figure(self, draw, frame, mask: str, stem: str) -> pathlib.Path:
        path = draw(frame, mask, self.out / "figures" / f"{stem}.png")
        self.written.append(path)
        return path


def _figure_stem(kind: str, mask: str, label: str, several_settings: bool) -> str:
    return f"{kind}_{slug(mask)}__{slug(label)}" if several_settings else f"{kind}_{slug(mask)}"


# Each kind of figure: its draw function and the rows whose masks get one.
FIGURE_KINDS = (
    ("kernel", figures.kernel_figure, lambda group: tables.suite_rows(group, "kernel")),
    ("cp", figures.cp_figure, lambda group: tables.suite_rows(group, "cp")),
    ("memory", figures.memory_figure, memory.memory_rows),
    ("sparsity", figures.sparsity_figure, sparsity.sparsity_rows),
)


def write_figures(writer: ReportWriter, frame: pd.DataFrame) -> list[pathlib.Path]:
    """Per setting, one figure of each kind (FIGURE_KINDS) per mask with its rows."""
    groups = list(tables.setting_groups(frame))
    drawn = []
    for kind, draw, rows_of in FIGURE_KINDS:
        for label, group in groups:
            # The whole group is drawn from: each figure selects its own rows,
            # naming backends and masks as its table does.
            for mask in tables.mask_order(rows_of(group)["mask"]):
                if kind in ("kernel", "memory") and tables.swept_label(mask):
                    continue  # one point per setting: the sparsity figure draws these
                stem = _figure_stem(kind, mask, label, len(groups) > 1)
                drawn.append(writer.figure(draw, group, mask, stem))
    return drawn


def _index(frame: pd.DataFrame, paths: list[str], writer: ReportWriter, figure_paths) -> str:
    """README.md: what the results are, every table, every figure."""
    parts = [
        "# LCAB report",
        "",
        f"- Results: {len(frame)} rows (newest of each measurement) from {', '.join(paths)}",
        f"- Devices: {', '.join(tables.devices(frame)) or 'unknown'}",
        f"- Dates (UTC): {tables.date_range(frame)}",
        f"- Legend: {legend.one_line()}",
        "",
        *writer.index_sections,
    ]
    if figure_paths:
        parts += ["## Figures", ""]
        for path in figure_paths:
            relative = path.relative_to(writer.out).as_posix()
            parts += [f"[{path.name}]({relative})", "", f"![{path.stem}]({relative})", ""]
    return "\n".join(parts)


def write_report(paths: list[str], out: pathlib.Path) -> list[pathlib.Path]:
    """Every table, figure and the README.md index; returns the written paths."""
    frame = tables.latest(sources.load(paths))  # each row with its file, for the export
    comm = tables.comm_table(results.read_rows(paths))
    if frame.empty and comm.empty:
        raise app.UsageError(f"--results {', '.join(paths)}: no result rows found")
    writer = ReportWriter(out)
    kernel = frame[frame["suite"] == "kernel"]
    for direction in tables.DIRECTIONS:
        if (kernel["direction"] == direction).any():
            writer.table(
                f"kernel_{direction}", f"Kernels, {direction}: TFLOP/s",
                _per_setting(kernel, lambda group, d=direction: tables.kernel_table(group, d)),
            )
    if not kernel.empty:
        writer.table("kernel", "Kernels, fwd / bwd: TFLOP/s",
                     _per_setting(kernel, tables.paired_kernel_table))
    writer.table("cross_framework", "Best JAX vs best PyTorch backend: TFLOP/s",
                 _per_setting(kernel, tables.cross_framework_table))
    cp = frame[frame["suite"] == "cp"]
    writer.table("cp", "Context parallel: per-GPU TFLOP/s", _per_setting(cp, tables.cp_table))
    writer.table("cp_cross_framework", "Context parallel, best JAX vs best PyTorch: per-GPU "
                 "TFLOP/s", _per_setting(cp, lambda group: tables.cross_framework_table(
                     group, suite="cp")))
    # The single-GPU rows of the same settings sit beside their CP rows.
    writer.table("cp_vs_single", "Context parallel over the single-GPU inner kernel "
                 "(per-GPU TFLOP/s / single-GPU TFLOP/s, same workload and device)",
                 _per_setting(frame[frame["suite"].isin(["cp", "kernel"])],
                              _cp_vs_single_or_empty))
    for framework in tables.FRAMEWORK_ORDER:
        writer.table(f"cp_beside_single_{framework}",
                     f"Context parallel ({framework}) beside the single-GPU kernels it runs "
                     "inside, fwd / bwd: per-GPU TFLOP/s",
                     _per_setting(frame[frame["suite"].isin(["cp", "kernel"])],
                                  lambda group, f=framework: tables.cp_beside_single_table(
                                      group, f)))
    module = frame[frame["suite"] == "module"]
    writer.table("module", "Attention module (projections + attention, jax.module): per-GPU "
                 "TFLOP/s", _per_setting(module, lambda group: tables.cp_table(group, "module")))
    writer.table("memory", f"Kernels, peak device memory, fwd / bwd: {memory.UNIT} (torch: "
                 "max_memory_allocated; JAX: XLA's memory analysis of the compiled program)",
                 _per_setting(kernel, memory.memory_table))
    writer.table("sparsity", "Block-sparse masks: TFLOP/s against keep (the kept fraction "
                 "of kv blocks per q block)", _per_setting(kernel, sparsity.sparsity_table))
    if not comm.empty:
        writer.table("comm", "Collectives alone: bus bandwidth (GB/s) by bytes per rank; "
                     "alpha-beta fit", [("every collective", comm)])
    figure_paths = write_figures(writer, frame)
    writer.written += export.write(export.tidy(frame), out, "results")
    writer.text("export.md", export.columns_markdown("results.csv"))
    writer.text("README.md", _index(frame, paths, writer, figure_paths))
    return writer.written


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    paths = split_paths(_RESULTS.value)
    folders = paths or None  # --pages and --headline: the canonical folders by default
    with results.skipped_rows_told_once():
        if _UPDATE_README.value is not None:
            _update_readme(pathlib.Path(_UPDATE_README.value))
        if _SUMMARY.value:
            print(summary_text(paths))
        if _HEADLINE.value:
            print(headline.markdown(folders))
        if _AGAINST.value is not None:
            _compare(paths, split_paths(_AGAINST.value))
            return
        if _PAGES.value:
            out = pathlib.Path(_OUT.value) if _OUT.value is not None else pages.DEFAULT_OUT
            for path in pages.write_pages(folders, out):
                print(path)
        elif _OUT.value is not None:
            for path in write_report(paths, pathlib.Path(_OUT.value)):
                print(path)


def _compare(mine: list[str], ours: list[str]) -> None:
    """--against: the comparison printed, and with --out written as
    reproduce.md and reproduce.csv."""
    mine_rows, our_rows = results.read_rows(mine), results.read_rows(ours)
    found = reproduce.cases(mine_rows, our_rows)
    text = reproduce.markdown(mine_rows, our_rows, found)
    print(text)
    if _OUT.value is not None:
        writer = ReportWriter(pathlib.Path(_OUT.value))
        heading = (f"# Your rows against ours\n\nYours: {', '.join(mine)}. "
                   f"Ours: {', '.join(ours)}.\n\n")
        writer.text("reproduce.md", heading + text + "\n")
        frame = reproduce.per_case_frame(found)
        writer.text("reproduce.csv", frame.to_csv(index=False))
        for path in writer.written:
            print(path)


def _update_readme(path: pathlib.Path) -> None:
    try:
        text = path.read_text()
        path.write_text(readme.refreshed(text))
    except (OSError, ValueError) as error:
        raise app.UsageError(f"--update_readme={path}: {error}") from None
    print(path)


def console_main() -> None:
    """The `lcab-report` console script."""
    app.run(main)


if __name__ == "__main__":
    console_main()
