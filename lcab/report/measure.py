"""What a cell's number is: TFLOP/s on a GPU, median milliseconds on a CPU.

A CPU run's TFLOP/s are around 0.001 and say nothing a reader can use,
while its times compare backends directly; so rows measured on a CPU show
their median time, and the caption says so. The choice follows the row's
device, never its backend: a table holds one setting (device included,
tables.SETTING_COLUMNS), so all its cells share one measure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import pandas as pd


def is_cpu(device) -> bool:
    """Whether a row's device names a CPU ("cpu", "TFRT_CPU_0", ...)."""
    return isinstance(device, str) and "cpu" in device.lower()


@dataclasses.dataclass(frozen=True)
class Measure:
    name: str  # as captions and axes name it
    column: str  # the result column that holds it
    higher_is_better: bool

    def value(self, row: Mapping) -> float:
        return float(row.get(self.column))

    def bounds(self, row: Mapping) -> tuple[float, float]:
        """(low, high) of the p20-p80 range of the samples in this measure.

        TFLOP/s at the p20 time is the higher bound: a shorter time is more
        TFLOP/s per the same FLOPs (tflops * median / p20)."""
        p20, p80, median = (float(row.get(c)) for c in ("p20_ms", "p80_ms", "median_ms"))
        if self.column == "median_ms":
            return p20, p80
        tflops = float(row.get("tflops"))
        return tflops * median / p80, tflops * median / p20


TFLOPS = Measure("TFLOP/s", "tflops", higher_is_better=True)
MEDIAN_MS = Measure("median ms", "median_ms", higher_is_better=False)


def of_device(device) -> Measure:
    return MEDIAN_MS if is_cpu(device) else TFLOPS


def of_rows(frame: pd.DataFrame) -> Measure:
    """MEDIAN_MS when every row with a known device ran on a CPU, else TFLOPS."""
    found = [d for d in frame["device"].dropna()] if "device" in frame else []
    return MEDIAN_MS if found and all(map(is_cpu, found)) else TFLOPS


def caption(devices: Iterable) -> str:
    """What the numbers of rows on these devices are, in a few words."""
    cpus = [is_cpu(d) for d in devices if isinstance(d, str)]
    if cpus and all(cpus):
        return ("median milliseconds (lower is better): these rows ran on a CPU, where "
                "TFLOP/s are too small to compare")
    if any(cpus):
        return "TFLOP/s on a GPU, median milliseconds on a CPU (each table says which)"
    return "TFLOP/s (higher is better; per GPU for context parallel)"


def format_number(value: float) -> str:
    """An integer from 10 up, two significant digits below (0.041, 2.7)."""
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.2g}"
