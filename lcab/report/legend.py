"""The one legend of what a table or figure cell shows.

Every table, page, figure footnote and the short summary take their legend
from here, so a code means the same thing wherever it is printed. The
status codes themselves are lcab.status.CODES; this module says what each
one, each flag after a number and each footnote mark means.

    from lcab.report import legend
    legend.markdown()   # a pipe table: code, status, meaning
    legend.one_line()   # "E = out of device memory, X = ..." for captions
"""

from __future__ import annotations

import dataclasses

from lcab.runtime import SPREAD_LIMIT
from lcab.status import CODES, Status

FLAG_UNSTEADY = "~"  # after a number: the samples' p80 / p20 exceeds SPREAD_LIMIT
FLAG_UNCHECKED = "?"  # after a number: no full-size check at this workload (lcab.fullcheck)
# After a number, followed by the changes' numbers: its kernel changed since
# (lcab.registry.changes_since, numbered by lcab.report.changes.numbers).
FLAG_CHANGED = "†"
# Footnote marks after a code (X¹) point to the numbered reason under the table.
SUPERSCRIPT_DIGITS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


@dataclasses.dataclass(frozen=True)
class Entry:
    code: str  # as printed in a cell
    status: str  # the row status it stands for; "" for a flag or mark
    meaning: str
    kind: str  # "number", "status", "flag" (after a number), "note" (after a code), "blank"


# What each non-OK status's code means; the codes are lcab.status.CODES.
_STATUS_MEANINGS = {
    Status.OOM: "out of device memory",
    Status.UNSUPPORTED: "the backend cannot express this mask or shape exactly "
                        "(it is never run as something else)",
    Status.UNAVAILABLE: "unavailable where it ran (a package or the device is missing)",
    Status.ERROR: "the run failed; its reason says how",
    Status.MISMATCH: "output or gradients disagree with the reference (float64 on the probe, "
                     "float32 at the timed size; it ran, and its time is not shown)",
}

ENTRIES: tuple[Entry, ...] = (
    Entry("612", Status.OK.value, "TFLOP/s (per GPU for context parallel); on a CPU, median "
          "milliseconds, as the caption says; paired cells are fwd / bwd", "number"),
    # Every status with a code, a new one too (its name standing for its meaning).
    *(Entry(code, status.value, _STATUS_MEANINGS.get(status, status.value.lower()), "status")
      for status, code in CODES.items()),
    Entry(FLAG_UNSTEADY, "", f"after a number: samples spread over "
          f"{round((SPREAD_LIMIT - 1) * 100)} % (p80 / p20)", "flag"),
    Entry(FLAG_UNCHECKED, "", "after a number: no full-size check at this workload stands "
          "behind it", "flag"),
    Entry(f"{FLAG_CHANGED}5,11", "", "after a number: measured before the later changes to its "
          "kernel that can move it, by number (changes 5 and 11, named under the table or "
          "at the top of the page); older code's figure", "flag"),
    Entry("X¹", "", "after a code: the numbered reason under the table", "note"),
    Entry("", "", "never measured", "blank"),
)


def superscript(number: int) -> str:
    """A footnote mark: 12 -> "¹²"."""
    return str(number).translate(SUPERSCRIPT_DIGITS)


def markdown() -> str:
    """The legend as a pipe table (the README pastes it between markers)."""
    lines = ["| Cell | Status | Meaning |", "|:-----|:-------|:--------|"]
    for entry in ENTRIES:
        code = f"`{entry.code}`" if entry.code else "(blank)"
        lines.append(f"| {code} | {entry.status} | {entry.meaning} |")
    return "\n".join(lines)


def one_line() -> str:
    """The status codes and flags on one line, for captions, figures and the
    summary: "E = out of device memory, X = ..., ~ = ..."."""
    return ", ".join(f"{entry.code} = {_short(entry.meaning)}" for entry in ENTRIES
                     if entry.kind in ("status", "flag"))


def _short(meaning: str) -> str:
    """A meaning without its parenthesis or second clause."""
    return meaning.split(" (")[0].split(";")[0].removeprefix("after a number: ")
