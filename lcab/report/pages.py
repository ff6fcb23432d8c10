"""The result pages: one markdown page per sweep and card, an index and the tidy export.

    python -m lcab.report --pages            # current canonical runs -> docs/results/

Each page (docs/results/<sweep>-<card>.md, e.g. cp-h200.md; a --results
folder's page is named by the folder) names the folder, commits, devices and
dates its rows came from, then per setting (shape, dtype, device):

- Kernels: per mask a table (rows: sequence length; cells fwd / bwd per
  backend), every status code marked with its reason listed under the
  table (lcab.report.why), and a figure of TFLOP/s against length with
  p20-p80 error bars; a block-sparse sweep's family gets one table and
  figure against keep instead;
- Across frameworks: the best backend of each framework per cell and
  their ratio;
- Context parallel: per mask a table (sequence length, cp size) with
  reasons, and a figure of per-GPU TFLOP/s against cp size with the
  single-GPU inner kernel as a reference line; then each strategy over
  its single-GPU kernel, and the best strategy of each framework;
- Peak memory of the kernels, where measured;
- the legend (lcab.report.legend).

index.md links the pages, results.csv (the tidy export, lcab.report.export;
results.parquet beside it when pyarrow is installed) and export.md, which
documents its columns. Rows run on a CPU show median ms, as the captions say.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
from collections.abc import Sequence

import pandas as pd

from lcab import canonical, results
from lcab.report import (
    balance,
    changes,
    export,
    legend,
    line_figures,
    measure,
    memory,
    sources,
    styles,
    tables,
    why,
)
from lcab.report.tables import to_markdown
from lcab.status import Status

DEFAULT_OUT = canonical.ROOT / "docs" / "results"
EXPORT_STEM = "results"


def slug(text: str) -> str:
    """A file-name-safe form of a mask name or setting label."""
    return re.sub(r"[^A-Za-z0-9]+", "_", str(text)).strip("_").lower()


def page_name(sweep: str) -> str:
    """The page's file stem: the sweep's name where it is safe in a file name."""
    return sweep if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", sweep) else slug(sweep)


class Page:
    """One page's markdown and figures, drawn into `out`."""

    def __init__(self, sweep: str, source: sources.Source, frame: pd.DataFrame,
                 out: pathlib.Path):
        self.sweep, self.source, self.frame, self.out = sweep, source, frame, out
        self.figure_dir = out / "figures" / page_name(sweep)
        self.figures: list[pathlib.Path] = []
        self.parts: list[str] = []
        self.groups = [(label, _lined(group)) for label, group in tables.setting_groups(frame)]
        # One look per line across the whole page, so a backend is drawn alike in every figure.
        self.looks = styles.styles(line for _, group in self.groups
                                   for line in tables.line_order(group))

    # ------------------------------------------------------------ output

    def add(self, *lines: str) -> None:
        self.parts += [*lines, ""]

    def figure(self, fig, stem: str, alt: str) -> None:
        path = line_figures.save(fig, self.figure_dir / f"{stem}.png")
        self.figures.append(path)
        self.add(f"![{alt}]({path.relative_to(self.out).as_posix()})")

    def noted(self, rows: pd.DataFrame, index: list[str]) -> None:
        """A table with reasons under it (why.noted_table)."""
        table, notes = why.noted_table(rows, index)
        if table.empty or not len(table.columns):
            self.add("_(no backend measured anything here)_")
            return
        self.add(to_markdown(table))
        if notes.numbers:
            self.add(notes.markdown())

    # ------------------------------------------------------------ sections

    def header(self) -> None:
        source = self.source
        self.add(f"# {self.sweep}")
        if what := sources.described_sweep(source):
            self.add(what)
        self.add(
            f"- Rows: [{source.folder}]({_link(source.folder, self.out)}), {source.rows} "
            "measurements (the newest row of each); each is a row of "
            f"[{EXPORT_STEM}.csv]({EXPORT_STEM}.csv) with `sweep == \"{page_name(self.sweep)}\"`, "
            "whose "
            "`source` column names the committed file it was read from",
            f"- Commit: {source.commit}",
            f"- Device: {source.device}",
            f"- Date (UTC): {source.date}",
            *([f"- **Unfinished**: {source.progress}; the missing parts' cells are empty "
               f"(their RUN.md lists the parts)"] if source.progress else []),
            f"- Numbers: {measure.caption(self.frame['device'])}; cells are fwd / bwd; codes "
            "and marks: [legend](#legend)",
        )

    def left_out(self) -> None:
        """The backends the tables leave out (every row UNAVAILABLE where it
        ran), each with its reasons: absent is not the same as slow."""
        unavailable = self.frame.groupby("backend")["status"].apply(
            lambda statuses: statuses.eq(Status.UNAVAILABLE.value).all())
        names = sorted(unavailable[unavailable].index)
        if not names:
            return
        items = []
        for name in names:
            reasons = pd.unique(self.frame.loc[self.frame["backend"] == name, "reason"]
                                .map(why.clean_reason))
            items.append(f"- `{name}`: {'; '.join(r for r in reasons if r) or 'no reason given'}")
        self.add("Unavailable where these rows ran, so absent from the tables below:", "", *items)

    def kernels(self, group: pd.DataFrame, label: str, setting: int | None) -> None:
        kernel = group[group["suite"] == "kernel"]
        if kernel.empty:
            return
        unit = measure.of_rows(kernel).name
        self.add(f"### Kernels: {unit}, fwd / bwd")
        for mask in tables.mask_order(kernel["family"]):
            family = kernel[kernel["family"] == mask]
            swept = _swept(family)
            stem = _stem("kernel", mask, setting)
            if swept:
                family = _with_swept_columns(family, swept)
                x = "keep" if "keep" in swept else swept[0]
                self.add(f"#### {mask} (swept: {', '.join(swept)})")
                self.noted(family, ["seqlen", *swept])
                if family["status"].eq("OK").any():
                    self.figure(line_figures.scaling_figure(
                        family, f"{mask}: {unit} against {x}", label, self.looks, x=x,
                        panel_by=["seqlen", *(s for s in swept if s != x)]), stem, mask)
            else:
                self.add(f"#### {mask}")
                self.noted(family, ["seqlen"])
                if family["status"].eq("OK").any():
                    self.figure(line_figures.scaling_figure(
                        family, f"{mask}: {unit} against sequence length", label, self.looks),
                        stem, mask)

    def cross_framework(self, group: pd.DataFrame) -> None:
        for suite, title in (("kernel", "Best of each framework, kernels"),
                             ("cp", "Best of each framework, context parallel")):
            rows = group[(group["suite"] == suite) & (group["status"] == "OK")]
            if rows["framework"].nunique() < 2:
                continue  # one framework: nothing to compare
            table = tables.cross_framework_table(group, suite=suite)
            first, second = tables.FRAMEWORK_ORDER
            self.add(f"### {title}", "", f"{first}/{second}: ratio of TFLOP/s of the two "
                     f"best (above 1: {first} is faster).", "", to_markdown(table))

    def context_parallel(self, group: pd.DataFrame, label: str, setting: int | None) -> None:
        cp = group[group["suite"] == "cp"]
        if cp.empty:
            return
        shown = measure.of_rows(cp)
        kernel = group[group["suite"] == "kernel"]
        per_gpu = f"per-GPU {shown.name}" if shown.higher_is_better else shown.name
        self.add(f"### Context parallel: {per_gpu}, fwd / bwd")
        for mask in tables.mask_order(cp["mask"]):
            rows = cp[cp["mask"] == mask]
            self.add(f"#### {mask}")
            self.noted(rows, ["seqlen", "cp_size"])
            if rows["status"].eq("OK").any():
                self.figure(line_figures.cp_figure(
                    rows, kernel, f"{mask}, context parallel: {per_gpu} against cp size "
                    "(black: the kernel alone on one GPU)", label, self.looks),
                    _stem("cp", mask, setting), f"{mask}, context parallel")
        against = tables.cp_vs_single_table(group)
        if len(against):
            self.add("### Context parallel against one GPU", "",
                     "Each strategy's per-GPU TFLOP/s over the TFLOP/s of the kernel it runs "
                     "inside, alone on one GPU, on the same workload: cp / single = ratio. A "
                     f"figure marked {legend.FLAG_CHANGED} predates the numbered changes to its "
                     "kernel (listed at the top of the page), so its ratio may set two versions "
                     "of the kernel side by side.",
                     "", to_markdown(against))
        spread = balance.balance_table(group)
        if len(spread):
            self.add("### Work balance of the dispatches", "",
                     "The most loaded rank over the mean, for each dispatch the strategies "
                     "above deal tokens by (Ulysses splits heads instead, USP deals over its "
                     "ring only): area in visible pairs, tiles in the 128 x 128 tiles its "
                     "queries touch, which a block-sparse kernel's time follows. Before any "
                     "communication, a strategy's ratio to one GPU falls about as far under 1 "
                     "as tiles stands over it. Recomputed from each row's mask and dispatch "
                     "(balanced/8: dispatch_chunks=8).", "", to_markdown(spread))

    def module(self, group: pd.DataFrame) -> None:
        rows = group[group["suite"] == "module"]
        if not rows.empty:
            self.add("### Attention module (projections + attention), fwd / bwd")
            self.noted(rows, ["mask", "seqlen", "cp_size"])

    def peak_memory(self, group: pd.DataFrame) -> None:
        table = memory.memory_table(group[group["suite"] == "kernel"])
        if len(table):
            self.add(f"### Peak device memory: {memory.UNIT}, fwd / bwd", "",
                     "torch: max_memory_allocated; JAX: XLA's memory analysis of the compiled "
                     "program. Compare within a framework first.", "", to_markdown(table))

    def markdown(self) -> str:
        self.header()
        self.left_out()
        if lines := changes.markdown(self.frame):
            self.add(*lines)
        groups = self.groups
        for number, (label, group) in enumerate(groups, 1):
            setting = number if len(groups) > 1 else None  # figure names tell settings apart
            self.add(f"## {label}")
            self.kernels(group, label, setting)
            self.cross_framework(group)
            self.context_parallel(group, label, setting)
            self.module(group)
            self.peak_memory(group)
        if not groups:
            self.add("_(no result rows)_")
        self.add("## Legend", "", legend.markdown())
        return "\n".join(self.parts)


def _link(folder: str, out: pathlib.Path) -> str:
    """A link from a page in `out` to a results folder (shown relative to the
    repository root, or absolute)."""
    return pathlib.Path(os.path.relpath(canonical.ROOT / folder, out)).as_posix()


def _stem(kind: str, mask: str, setting: int | None) -> str:
    """kernel_causal, or kernel_causal__setting2 where a page has several settings."""
    return f"{kind}_{slug(mask)}" + (f"__setting{setting}" if setting else "")


def _lined(group: pd.DataFrame) -> pd.DataFrame:
    """One setting's newest rows as the tables name them: "family" the mask
    family, "mask" labelled with its swept setting where the family ran with
    several (tables.label_mask_settings), "line" the backend or CP line with
    the options that tell its runs apart (tables.with_line)."""
    rows = tables.latest(group).assign(family=lambda rows: rows["mask"])
    return tables.with_line(tables.label_mask_settings(rows))


def _swept(family: pd.DataFrame) -> list[str]:
    """The mask parameters a family's rows sweep (tables.label_mask_settings
    labelled them), the x axis's last: keep where it is swept."""
    if not family["mask"].map(tables.swept_label).any():
        return []
    params = family["mask_params"].map(tables.swept_params)
    present = set().union(*params)
    names = [name for name in tables.SWEPT_MASK_PARAMS if name in present]
    return sorted(names, key=lambda name: name == "keep")


def _with_swept_columns(rows: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """The swept mask parameters as columns (None where a row has none)."""
    params = rows["mask_params"].map(tables.swept_params)
    return rows.assign(**{name: params.map(lambda p, n=name: p.get(n)) for name in names})


# ---------------------------------------------------------------- the folder


def index_markdown(described: list[sources.Source], out: pathlib.Path,
                   export_files: list[pathlib.Path],
                   others: Sequence[pathlib.Path] = ()) -> str:
    parts = [
        "# LCAB results",
        "",
        ("Generated by `python -m lcab.report --pages` from the current runs of each "
         "canonical sweep (`lcab.canonical`: `results/<date>-<device>-<sweep>/`): the newest "
         "run on each card, one page each; numbers from two cards never share a table. "
         "Every number "
         "on a page is a committed row: the page names its folder, commits, devices and "
         "dates, and the tidy export names each row's file."),
        "",
    ]
    if described:
        parts += ["| Sweep | What | Rows | Commit | Device | Date (UTC) | Measurements |",
                  "|:------|:-----|:-----|:-------|:-------|:-----------|-------------:|"]
        for source in described:
            parts.append(f"| [{source.sweep}]({source.sweep}.md) | "
                         f"{sources.described_sweep(source)} | "
                         f"[{source.folder}]({_link(source.folder, out)}) | "
                         f"{source.commit} | {source.device} | {source.date} | {source.rows}"
                         + (f" ({source.progress})" if source.progress else "") + " |")
    else:
        parts.append("No canonical sweep has committed rows yet.")
    if others:
        # Runs no page shows (superseded by a newer run on the same card):
        # named, so no committed run is hidden.
        parts += ["", "Other committed runs, not on the pages: " + "; ".join(
            f"[{sources.shown_path(folder)}]({_link(sources.shown_path(folder), out)})"
            f" ({canonical.parse_folder(folder.name)[1]}"
            + (f", {progress}" if (progress := sources.progress_text(folder)) else "") + ")"
            for folder in others) + "."]
    files = ", ".join(f"[{path.name}]({path.name})" for path in export_files)
    parts += ["", f"Every row as numbers: {files}; its columns: [export.md](export.md).", "",
              "## Legend", "", legend.markdown(), ""]
    return "\n".join(parts)


def write_pages(folders: sources.Folders = None, out: str | pathlib.Path = DEFAULT_OUT
                ) -> list[pathlib.Path]:
    """Every page, its figures, the tidy export and index.md; the written paths."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written, described, tidy = [], [], []
    named = sources.named_folders(folders)
    for sweep, (source, frame) in sources.load_sweeps(named).items():
        page = Page(sweep, source, frame, out)
        shutil.rmtree(page.figure_dir, ignore_errors=True)  # figures of masks no longer run
        path = out / f"{page_name(sweep)}.md"
        path.write_text(page.markdown())
        written += [path, *page.figures]
        described.append(dataclasses.replace(source, sweep=path.stem))
        tidy.append(export.tidy(frame, sweep=path.stem))
    rows = pd.concat(tidy, ignore_index=True) if tidy else export.tidy(results.load([]))
    export_files = export.write(rows, out, EXPORT_STEM)
    written += export_files
    (out / "export.md").write_text(export.columns_markdown(f"{EXPORT_STEM}.csv"))
    others = [] if folders is not None else [
        folder for sweep in canonical.SWEEPS for folder in canonical.folders(sweep)
        if folder not in named.values()]
    for name in _stale_pages(out, {path.stem for path in written if path.suffix == ".md"}):
        (out / f"{name}.md").unlink(missing_ok=True)  # a run no longer current, say
        shutil.rmtree(out / "figures" / name, ignore_errors=True)
    (out / "index.md").write_text(index_markdown(described, out, export_files, others))
    return [*written, out / "export.md", out / "index.md"]


def _stale_pages(out: pathlib.Path, written: set[str]) -> list[str]:
    """The pages the index there listed that this call did not write."""
    try:
        listed = set(re.findall(r"^\| \[[^]]+\]\(([A-Za-z0-9._-]+)\.md\) \|",
                                (out / "index.md").read_text(), flags=re.MULTILINE))
    except OSError:
        return []
    return sorted(listed - written)
