"""Which folders a page or the headline reads, and where each row came from.

By default those are the current runs of each canonical sweep: the newest
on each card (lcab.canonical.current), one page each. Every row keeps the
file it was read from (column "source", relative to the repository), and
each folder is
described by its commits, devices and dates, so a published number can be
traced to the committed line it came from.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Iterable, Mapping

import pandas as pd

from lcab import canonical, results
from lcab.report import tables

Folders = Mapping[str, pathlib.Path] | Iterable[str | pathlib.Path] | None


@dataclasses.dataclass(frozen=True)
class Source:
    """Where one sweep's rows came from, for a caption line."""
    sweep: str
    folder: str  # relative to the repository where it lies inside it
    commit: str  # every git_commit of its rows, ", "-joined
    device: str  # every device of its rows, ", "-joined
    date: str  # tables.date_range of its rows (UTC)
    rows: int  # measurements (the newest row of each)
    # "2 of 35 parts done" while the canonical run is unfinished, else "".
    progress: str = ""

    def caption(self) -> str:
        unfinished = f", {self.progress}" if self.progress else ""
        return (f"{self.sweep}: {self.folder}, commit {self.commit}, {self.device}, "
                f"{self.date} ({self.rows} rows{unfinished})")


def described_sweep(source: Source) -> str:
    """What the canonical sweep behind a source is, in a few words ("" for
    another folder)."""
    return canonical.SWEEPS.get(sweep_name(source.folder), "")


def shown_path(path: str | pathlib.Path) -> str:
    """A path relative to the repository root where it lies inside it."""
    path = pathlib.Path(path).resolve()
    try:
        return path.relative_to(canonical.ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def sweep_name(path: str | pathlib.Path) -> str:
    """A canonical folder's sweep (2026-11-28-h100-blog: "blog"); any other
    folder's (or file's) own name."""
    path = pathlib.Path(path)
    parsed = canonical.parse_folder(path.name)
    return parsed[2] if parsed else (path.name if path.is_dir() else path.stem)


def current_folders() -> dict[str, pathlib.Path]:
    """page name -> folder: each canonical sweep's current run on each card,
    named by sweep and card ("cp-h100", "cp-h200": a page keeps its name
    when another card's run comes), the most complete run first."""
    return {f"{sweep}-{canonical.card_of(canonical.parse_folder(folder.name)[1])}": folder
            for sweep in canonical.SWEEPS for folder in canonical.current(sweep)}


def headline_folders() -> dict[str, pathlib.Path]:
    """sweep -> the most complete of its current runs (the README shows one
    run of each sweep; the pages show them all); between runs equally
    complete, the one with fewer rows measured before a later change to
    their kernel (fewer marked cells), then the newer."""
    chosen = {}
    for sweep in canonical.SWEEPS:
        runs = canonical.current(sweep)
        if runs:
            most = canonical.parts_done(runs[0])  # current() puts the most complete first
            complete = [run for run in runs if canonical.parts_done(run) == most]
            chosen[sweep] = min(complete, key=predating_rows)  # min keeps the first of a tie
    return chosen


def predating_rows(folder: pathlib.Path) -> int:
    """How many of a run's standing rows (its parts', not its reruns')
    predate a later change to their kernel: the cells a table marks."""
    from lcab.experiments.changed_parts import predating

    return sum(predating(part).total() for part in sorted(folder.iterdir())
               if part.is_dir() and part.name != canonical.RERUNS)


def named_folders(folders: Folders = None) -> dict[str, pathlib.Path]:
    """page name -> folder: current_folders() by default; a mapping as
    given; paths named by sweep_name."""
    if folders is None:
        return current_folders()
    if isinstance(folders, Mapping):
        return {str(name): pathlib.Path(path) for name, path in folders.items()}
    named: dict[str, pathlib.Path] = {}
    for path in map(pathlib.Path, folders):
        name = sweep_name(path)
        if name in named:
            raise ValueError(f"{named[name]} and {path} would both be the page {name!r}; "
                             "pass a mapping of name -> folder")
        named[name] = path
    return named


def result_files(paths: Iterable[str | pathlib.Path]) -> list[pathlib.Path]:
    """The JSONL files under the paths, in the order lcab.results reads them;
    a folder's rerun parts (lcab.canonical.RERUNS) are left out."""
    return results.row_files(paths, passed_over=canonical.is_rerun)


def load(paths: Iterable[str | pathlib.Path]) -> pd.DataFrame:
    """lcab.results.load of the paths, every row with its "source" file.

    The files are loaded together (a failed rerun without a device still
    replaces the row it repeats, results.with_known_context); load keeps
    the rows in file order, which places each one's file.
    """
    files = result_files(paths)
    with results.skipped_rows_told_once():
        frame = results.load(files) if files else results.load([])
        counts = [sum(row.get("suite") != results.COMM_SUITE for row in results.read_rows([f]))
                  for f in files]
    sources = [shown_path(f) for f, count in zip(files, counts) for _ in range(count)]
    if len(sources) != len(frame):
        raise RuntimeError(f"read {len(frame)} rows but placed {len(sources)} in their files")
    return frame.assign(source=pd.Series(sources, index=frame.index, dtype=object))


def describe(sweep: str, folder: str | pathlib.Path, frame: pd.DataFrame) -> Source:
    """The Source of one sweep's newest rows (frame: tables.latest of them)."""
    def joined(column: str, shown=str) -> str:
        values = sorted({shown(v) for v in frame[column].dropna()})
        return ", ".join(values) or "unknown"

    return Source(sweep, shown_path(folder), joined("git_commit", results.short_commit),
                  joined("device"), tables.date_range(frame), len(frame),
                  progress_text(folder))


def progress_text(folder: str | pathlib.Path) -> str:
    """"N of M parts done" for an unfinished canonical run (its RUN.md says
    which), else ""."""
    from lcab.experiments.canonical_parts import progress

    counts = progress(pathlib.Path(folder))
    if counts is None or counts[0] == counts[1]:
        return ""
    return f"{counts[0]} of {counts[1]} parts done"


def load_sweeps(folders: Folders = None) -> dict[str, tuple[Source, pd.DataFrame]]:
    """sweep -> (its Source, the newest row of each of its measurements)."""
    loaded = {}
    for sweep, folder in named_folders(folders).items():
        frame = tables.latest(load([folder]))
        loaded[sweep] = (describe(sweep, folder, frame), frame)
    return loaded
