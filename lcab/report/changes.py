"""What a figure flagged FLAG_CHANGED (†) predates: the kernel changes made
after its row was measured (lcab.registry.Change), listed once under a
page or the headline, so a reader knows which figures describe older code
and why.

Every registered change has one number, 1 for the oldest (`numbers`), the
same on every page and in the README: a figure carries the numbers of the
changes that can move it ("417†5,11"), and each change's line under the
table starts with its own ("†5 ..."), so a reader can tell which change
stands behind which cell."""

from __future__ import annotations

import pandas as pd

from lcab import registry
from lcab.report.legend import FLAG_CHANGED
from lcab.status import Status


def numbers() -> dict[registry.Change, int]:
    """Every registered change -> its number, 1 for the oldest (by time, then
    commit); a change two backends declare has one number."""
    every = {change for entry in registry.all_backends().values() for change in entry.changes}
    ordered = sorted(every, key=lambda change: (registry.parsed_time(change.when),
                                                change.commit))
    return {change: number for number, change in enumerate(ordered, 1)}


def mark(row) -> str:
    """FLAG_CHANGED and the numbers of the later changes to a row's kernel
    that can move its figure ("†5,11"); "" for none."""
    found = registry.changes_since(row)
    if not found:
        return ""
    numbered = numbers()
    return FLAG_CHANGED + ",".join(str(number) for number in sorted(numbered[change]
                                                                    for change in found))


def predated(rows: pd.DataFrame) -> dict[registry.Change, pd.DataFrame]:
    """Each change that some OK row predates -> those rows, oldest change first."""
    found: dict[registry.Change, list[int]] = {}
    for position, (_, row) in enumerate(rows.iterrows()):
        if row["status"] == Status.OK.value:  # a failed row shows no figure to mark
            for change in registry.changes_since(row):
                found.setdefault(change, []).append(position)
    numbered = numbers()
    return {change: rows.iloc[found[change]] for change in sorted(found, key=numbered.get)}


def markdown(rows: pd.DataFrame, *, count: bool = True) -> list[str]:
    """Lines naming each change the figures predate ([] for none): the
    backend, commit, date and what it moves; with `count` (a page) a list
    under a heading, saying how many figures of which backends carry the
    mark, without (the README's headline) one line per change."""
    lines = []
    numbered = numbers()
    for change, mine in predated(rows).items():
        text = described(change)
        flag = f"{FLAG_CHANGED}{numbered[change]}"
        if not count:
            lines.append(f"{flag} measured before {text}")
            continue
        names = sorted(pd.unique(mine["backend"]))
        backends = ", ".join(f"`{name}`" for name in names)
        through = ("; a CP strategy's through its inner kernel"
                   if set(names) - set(owners(change)) else "")
        lines.append(f"- {flag} {text} {len(mine)} {'/'.join(change.directions)} "
                     f"figures here predate it ({backends}{through}).")
    if lines and count:
        lines.insert(0, f"A figure marked {FLAG_CHANGED}5,11 was measured before changes 5 and "
                        "11 below, later changes to its kernel that can move it; a rerun "
                        "measures it again:")
    return lines


def owners(change: registry.Change) -> list[str]:
    """The backends that declare the change, sorted."""
    return sorted(name for name, entry in registry.all_backends().items()
                  if change in entry.changes)


def described(change: registry.Change) -> str:
    """"`jax.pallas_flex` changed at ac1d548 (2026-11-28): <what>."."""
    return (f"`{', '.join(owners(change))}` changed at {change.commit} ({change.when[:10]}): "
            f"{change.what}.")
