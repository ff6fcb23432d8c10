"""Where the model's figures are extrapolated: the per-GPU kernel calls a
set of predictions made, set against what the kernel curve measured.

The curve holds its nearest measured speed beyond its points, so a call
smaller or larger than any measured call of similar density runs at a
speed nobody measured at that size; and a curve whose rows have one length
gives one speed per density whatever the size. Neither stops the model;
the output says so (`extrapolation_warnings`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lcab.model.kernel_curve import KernelCurve
from lcab.workloads import format_seqlen


@dataclasses.dataclass
class Calls:
    """The calls of one direction: how many, how many the curve does not
    cover, and the smallest and largest (FLOPs)."""
    count: int = 0
    outside: int = 0
    smallest: float = float("inf")
    largest: float = 0.0


class CallLog:
    """Stands in for a KernelCurve in lcab.model.strategies.predict (which
    asks a curve only for `seconds_of`) and notes every non-empty call it
    answers, per direction."""

    def __init__(self, curve: KernelCurve):
        self.curve = curve
        self.calls: dict[str, Calls] = {}

    def seconds_of(self, flops, density, direction: str):
        flops, density = np.broadcast_arrays(np.asarray(flops, dtype=np.float64),
                                             np.asarray(density, dtype=np.float64))
        busy = flops > 0
        if busy.any():
            calls = self.calls.setdefault(direction, Calls())
            calls.count += int(busy.sum())
            calls.outside += int((~self.curve.covered(flops[busy], density[busy],
                                                      direction)).sum())
            calls.smallest = min(calls.smallest, float(flops[busy].min()))
            calls.largest = max(calls.largest, float(flops[busy].max()))
        return self.curve.seconds_of(flops, density, direction)


def lengths_text(curve: KernelCurve) -> str:
    """'at 32k' or 'at 4k, 16k, 64k': the lengths the curve's rows measured."""
    if not curve.lengths:
        return "at lengths not recorded"
    return "at " + ", ".join(map(format_seqlen, curve.lengths))


def extrapolation_warnings(log: CallLog) -> list[str]:
    """One line per way the logged calls leave what the curve measured."""
    curve, found = log.curve, []
    if len(curve.lengths) == 1:
        length = format_seqlen(curve.lengths[0])
        found.append(
            f"warning: the kernel curve was measured at one length ({length}), so it gives "
            f"one speed per mask density whatever a call's size: every per-GPU TFLOP/s below "
            f"is extrapolated from {length} calls (a canonical blog run, or --kernel_results "
            "with rows of several lengths, gives a curve over call sizes)")
    outside = {d: c for d, c in log.calls.items() if c.outside}
    if outside:
        total = sum(c.count for c in log.calls.values())
        off = sum(c.outside for c in outside.values())
        modelled = "; ".join(f"{d} {_span(c.smallest, c.largest)}" for d, c in outside.items())
        measured = "; ".join(f"{d} {_span(*curve.flops_range(d))}" for d in outside)
        found.append(
            f"warning: {off} of the {total} per-GPU kernel calls modelled ({modelled}) lie "
            f"outside the work the curve measured at their mask density (its rows, all "
            f"densities: {measured}, {lengths_text(curve)}); the curve holds its nearest "
            "measured speed there, so their figures are extrapolated")
    return found


def _span(smallest: float, largest: float) -> str:
    return _work(smallest) if smallest == largest else f"{_work(smallest)} to {_work(largest)}"


def _work(flops: float) -> str:
    """FLOPs of one call in the largest unit it fills: '2.2 TFLOP'."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops / 1e6:.3g} MFLOP"
