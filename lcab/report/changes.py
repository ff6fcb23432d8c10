"""What a figure flagged FLAG_CHANGED (†) predates: the kernel changes made
after its row was measured (lcab.registry.Change), listed once under a
page or the headline, so a reader knows which figures describe older code
and why."""

from __future__ import annotations

import pandas as pd

from lcab import registry
from lcab.report.legend import FLAG_CHANGED
from lcab.status import Status


def predated(rows: pd.DataFrame) -> dict[registry.Change, pd.DataFrame]:
    """Each change that some OK row predates -> those rows, oldest change first."""
    found: dict[registry.Change, list[int]] = {}
    for position, (_, row) in enumerate(rows.iterrows()):
        if row["status"] == Status.OK.value:  # a failed row shows no figure to mark
            for change in registry.changes_since(row):
                found.setdefault(change, []).append(position)
    return {change: rows.iloc[found[change]] for change in sorted(found, key=lambda c: c.when)}


def markdown(rows: pd.DataFrame, *, count: bool = True) -> list[str]:
    """Lines naming each change the figures predate ([] for none): the
    backend, commit, date and what it moves; with `count` (a page) a list
    under a heading, saying how many figures of which backends carry the
    mark, without (the README's headline) one line per change."""
    lines = []
    for change, mine in predated(rows).items():
        text = described(change)
        if not count:
            lines.append(f"{FLAG_CHANGED} measured before {text}")
            continue
        names = sorted(pd.unique(mine["backend"]))
        backends = ", ".join(f"`{name}`" for name in names)
        through = ("; a CP strategy's through its inner kernel"
                   if set(names) - set(owners(change)) else "")
        lines.append(f"- {FLAG_CHANGED} {text} {len(mine)} {'/'.join(change.directions)} "
                     f"figures here predate it ({backends}{through}).")
    if lines and count:
        lines.insert(0, f"Figures marked {FLAG_CHANGED} were measured before a later change "
                        "to their kernel, which a rerun measures:")
    return lines


def owners(change: registry.Change) -> list[str]:
    """The backends that declare the change, sorted."""
    return sorted(name for name, entry in registry.all_backends().items()
                  if change in entry.changes)


def described(change: registry.Change) -> str:
    """"`jax.pallas_flex` changed at ac1d548 (2026-11-28): <what>."."""
    return (f"`{', '.join(owners(change))}` changed at {change.commit} ({change.when[:10]}): "
            f"{change.what}.")
