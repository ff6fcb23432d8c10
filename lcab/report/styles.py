"""A distinct look for every line of a figure: colour, marker and dash.

Twenty colours are too many to tell apart (tab20's pairs differ only in
lightness), so colours come from the ten of tab10 and each line also gets a
marker and, past the tenth, a dash pattern. Line i takes colour i % 10 and
marker i % 7: as 10 and 7 share no factor, no two of the first 70 lines
share both, and any two lines differ in colour or marker (most in both).
Styles are handed out in the order of the names given (the tables' order:
frameworks, then backends alphabetically), so they follow the data, never
a backend's name.
"""

from __future__ import annotations

import dataclasses

from matplotlib import colormaps

COLOURS = colormaps["tab10"].colors
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
DASHES = ("-", "--", "-.", ":")
HATCHES = ("", "//", "..", "xx")  # bars: a pattern where a colour repeats


@dataclasses.dataclass(frozen=True)
class Style:
    color: tuple
    marker: str
    linestyle: str
    hatch: str

    def line_kwargs(self) -> dict:
        return {"color": self.color, "marker": self.marker, "linestyle": self.linestyle}


def style(i: int) -> Style:
    """The i-th line's style (see the module docstring)."""
    repeat = (i // len(COLOURS)) % len(DASHES)
    return Style(COLOURS[i % len(COLOURS)], MARKERS[i % len(MARKERS)], DASHES[repeat],
                 HATCHES[repeat % len(HATCHES)])


def styles(names) -> dict[str, Style]:
    """One style per name, in the order given (duplicates take the first)."""
    return {name: style(i) for i, name in enumerate(dict.fromkeys(names))}
