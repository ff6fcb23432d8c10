"""Tables whose failed cells say why: a numbered reason list under the table.

A cell that shows a status code (X, E, MM, ...) carries a footnote mark,
"X¹", pointing to its row's reason in the list under the table. Each
distinct reason is listed once, numbered in reading order (row by row, fwd
before bwd), however many cells share it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pandas as pd

from lcab.report import legend, tables
from lcab.status import Status

REASON_CHARS = 400  # a traceback is cut here; the tidy export keeps it whole


def clean_reason(reason) -> str:
    """A reason on one line, at most REASON_CHARS long ("" for none)."""
    if not isinstance(reason, str):
        return ""
    text = re.sub(r"\s+", " ", reason).strip()
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1].rstrip() + "…"


class WhyList:
    """The distinct reasons of one table, numbered in order of first use."""

    def __init__(self):
        self.numbers: dict[str, int] = {}

    def mark(self, reason: str) -> str:
        """The footnote mark of a reason ("" for none), numbering it if new."""
        if not reason:
            return ""
        number = self.numbers.setdefault(reason, len(self.numbers) + 1)
        return legend.superscript(number)

    def markdown(self) -> str:
        """"Why:" and a numbered list; "" when no cell needed one."""
        if not self.numbers:
            return ""
        items = [f"{number}. {_markdown_text(reason)}" for reason, number in self.numbers.items()]
        return "\n".join(["Why (the numbers after the codes above):", "", *items])


def _markdown_text(text: str) -> str:
    # A reason quoting code ("<module>", "dict[str]") must not read as HTML or a link;
    # a "<" before a space ("<= fwd median") is plain text already.
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text).replace("[", "\\[")


def _reason_of(row) -> str:
    return "" if row["status"] == Status.OK.value else clean_reason(row.get("reason"))


def noted_table(rows: pd.DataFrame, index: Sequence[str]) -> tuple[pd.DataFrame, WhyList]:
    """Cells "fwd / bwd" per line (rows' "line" column: tables.with_line),
    index `index`, each code marked with its reason; and the reasons.

    Lines with nothing but blanks and "-" (unavailable everywhere here: not
    installed where it ran) are left out, as tables.paired_kernel_table does.
    """
    index = list(index)
    row_index = tables.sorted_index(rows, index)
    columns = tables.line_order(rows)
    directions = [d for d in tables.DIRECTIONS if (rows["direction"] == d).any()]
    shown, why = [], []
    for direction in directions:
        mine = rows[rows["direction"] == direction]
        shown.append(tables.cell_table(mine, index, "line", columns, row_index))
        why.append(tables.cell_table(mine, index, "line", columns, row_index,
                                     formatter=_reason_of))
    unavailable = tables.status_code(Status.UNAVAILABLE.value)
    kept = [c for c in columns if any((~table[c].isin(["", unavailable])).any()
                                      for table in shown)]
    shown = [table[kept].to_numpy() for table in shown]
    why = [table[kept].to_numpy() for table in why]
    notes = WhyList()  # numbered row by row, left to right: the order a reader meets them
    cells = [[_cell([t[i, j] for t in shown], [w[i, j] for w in why], notes)
              for j in range(len(kept))] for i in range(len(row_index))]
    table = pd.DataFrame(cells, index=row_index, columns=kept, dtype=object)
    return table, notes


def _cell(texts: list[str], reasons: list[str], notes: WhyList) -> str:
    if not any(texts):
        return ""
    return " / ".join(text + notes.mark(reason) if text else ""
                      for text, reason in zip(texts, reasons)).strip()
