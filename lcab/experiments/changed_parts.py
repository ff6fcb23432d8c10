"""Which parts of a canonical run hold figures measured before a later change
to their kernel (lcab.registry.Change: the tables' †), and whose rows they
are: what `--measure_again=changed` measures again, and what `--list` says
of a run's parts."""

from __future__ import annotations

import pathlib
from collections import Counter
from collections.abc import Iterable, Mapping

from lcab import canonical, registry, results
from lcab.experiments import canonical_parts as defined

CHANGED = "changed"  # the name that stands for these parts in --parts and --measure_again


def predating(part_folder: pathlib.Path) -> Counter:
    """Backend -> how many of the part's standing rows (the newest of each
    measurement in its rows files, not those set aside as .before-) were
    measured before a later change to it (a CP row: to its inner kernel)."""
    paths = [path for path in sorted(part_folder.glob("*.jsonl")) if ".before-" not in path.name]
    rows = results.newest_rows(results.read_rows(paths)) if paths else []
    return Counter(row["backend"] for row in rows if registry.changes_since(row))


def changed(folder: pathlib.Path, parts: Iterable[defined.Part],
            state: Mapping) -> dict[str, list[str]]:
    """Part name -> the backends to measure again in it, in the sweep's
    order: the parts with rows that predate a change (their backends), and
    the parts a call already set to be measured again and not yet done (the
    backends it chose then, so that call's work resumes instead of starting
    over, or starts over where rows it measured since predate a change:
    canonical.measure_again)."""
    chosen = {}
    for part in parts:
        record = state.get("parts", {}).get(part.name, {})
        if record.get("measured_again_at") and record.get("status") != canonical.DONE:
            chosen[part.name] = list(record.get("measured_again_backends", []))
            continue
        backends = predating(folder / part.folder)
        if backends:
            chosen[part.name] = sorted(backends)
    return chosen


def describe(part_folder: pathlib.Path) -> str | None:
    """One line for --list: the rows of this part that predate a change."""
    counts = predating(part_folder)
    if not counts:
        return None
    return "rows measured before a later change: " + ", ".join(
        f"{backend} {count}" for backend, count in sorted(counts.items()))
