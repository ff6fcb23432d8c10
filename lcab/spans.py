"""Sets of integers as short text: (0, 1, 2, 7) -> "0-2,7" (heads, rows, cores)."""

from __future__ import annotations

from collections.abc import Iterable


def spans_text(values: Iterable[int], separator: str = ",") -> str:
    """Sorted runs of consecutive values as "a-b", single values as "a"."""
    values = sorted(values)
    parts, start = [], None
    for i, value in enumerate(values):
        if start is None:
            start = value
        if i + 1 == len(values) or values[i + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return separator.join(parts)
