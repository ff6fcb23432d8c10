"""Your rows against ours: whether a rerun reproduces the rows it repeats.

    python -m lcab.report --results out/blog --against results/2026-11-27-h100-blog

Each measurement that both sides hold is one case. Both sides must agree on the
backend, workload (mask with its drawn documents, length, shapes, dtype),
direction, options, CP size and strategy. The device may differ; the output says
so first. A case's ratio is your median time over ours: above 1 you were slower.
A case reproduces when its ratio lies within the noise of the two runs: each
side's relative spread (p80 - p20 over the median), added, and never less than
FLOOR. Repeats of one case on one machine differ by a few per cent. The
canonical sweeps measured again on H200s kept every backend's median ratio within
1 % at 1k-8k, with single short cases up to 10.5 % (experiments/README.md).

A case whose status differs is listed apart: for example ours OK and yours
MISMATCH, or yours OK where ours ran out of memory. Those are the differences a
reader most needs to see.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from lcab import results
from lcab.workloads import format_seqlen

# The least tolerance of a case, whatever its spreads say (medians of short
# kernels move by a few per cent between calls on one card).
FLOOR = 0.05
# A backend whose median ratio moves by more than this is named in the verdict.
BACKEND_SHIFT = 0.02
# Cases shown individually, the farthest from 1 first.
SHOWN = 20


# What both sides must share: results.MEASUREMENT_KEY but the device.
CASE_KEY = tuple(column for column in results.MEASUREMENT_KEY if column != "device")


def case_key(row: Mapping) -> tuple:
    return results.key_of(row, CASE_KEY)


def _spread(row: Mapping) -> float:
    p20, p80, median = row.get("p20_ms"), row.get("p80_ms"), row.get("median_ms")
    if not median or p20 is None or p80 is None:
        return 0.0
    return max(p80 - p20, 0.0) / median


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement on both sides."""

    mine: Mapping
    ours: Mapping

    @property
    def both_ok(self) -> bool:
        return self.mine["status"] == "OK" == self.ours["status"]

    @property
    def ratio(self) -> float:
        return self.mine["median_ms"] / self.ours["median_ms"]

    @property
    def tolerance(self) -> float:
        return max(FLOOR, _spread(self.mine) + _spread(self.ours))

    @property
    def reproduces(self) -> bool:
        return abs(self.ratio - 1) <= self.tolerance

    def label(self) -> str:
        row = self.mine
        where = f"cp {row['cp_size']} {row['strategy']}" if row.get("strategy") else ""
        options = "" if results.default_options(row.get("options")) else (
            f"({results.options_key(row.get('options'))})")
        return " ".join(filter(None, [row["backend"], row["mask"], format_seqlen(row["seqlen"]),
                                      row["direction"], where, options]))


def cases(mine: Iterable[Mapping], ours: Iterable[Mapping]) -> list[Case]:
    """The measurements both sides hold, each side's newest row of each."""
    theirs = {case_key(row): row for row in results.newest_rows(ours)
              if row.get("suite") != results.COMM_SUITE}
    found = [Case(row, theirs[case_key(row)]) for row in results.newest_rows(mine)
             if row.get("suite") != results.COMM_SUITE and case_key(row) in theirs]
    return sorted(found, key=lambda case: case.label())


def _devices(rows: Sequence[Mapping]) -> str:
    return ", ".join(sorted({str(row.get("device")) for row in rows if row.get("device")}))


def per_case_frame(found: Sequence[Case]) -> pd.DataFrame:
    """One line per case: both statuses and medians, the ratio and whether
    it lies within the case's tolerance (numbers, for a CSV)."""
    return pd.DataFrame([{
        "backend": case.mine["backend"], "mask": case.mine["mask"],
        "seqlen": case.mine["seqlen"], "direction": case.mine["direction"],
        "cp_size": case.mine.get("cp_size"), "strategy": case.mine.get("strategy"),
        "options": results.options_key(case.mine.get("options")),
        "status_yours": case.mine["status"], "status_ours": case.ours["status"],
        "median_ms_yours": case.mine.get("median_ms"), "median_ms_ours": case.ours.get("median_ms"),
        "ratio": case.ratio if case.both_ok else None,
        "tolerance": case.tolerance if case.both_ok else None,
        "reproduces": case.reproduces if case.both_ok else None,
    } for case in found])


def markdown(mine: Sequence[Mapping], ours: Sequence[Mapping],
             found: Sequence[Case] | None = None) -> str:
    """The comparison as markdown: devices, one line per backend, the
    cases whose status differs, the timed cases outside their tolerance,
    and a verdict. found: cases(mine, ours), where the caller has them."""
    found = cases(mine, ours) if found is None else found
    lines = []
    yours_on, ours_on = _devices(mine), _devices(ours)
    if yours_on != ours_on:
        lines += [(f"Different devices: yours {yours_on or 'unknown'}, ours "
                   f"{ours_on or 'unknown'}; the times are compared, but a different card is "
                   "not a rerun."), ""]
    if not found:
        return "\n".join([*lines, ("No measurement is in both sets of rows: compare the same "
                                   "sweep's rows (backend, workload, direction, options).")])
    timed = [case for case in found if case.both_ok]
    by_backend: dict[str, list[Case]] = {}
    for case in timed:
        by_backend.setdefault(case.mine["backend"], []).append(case)
    lines += ["| backend | cases | your time / ours, median | range | outside tolerance |",
              "|---|---:|---:|---|---:|"]
    shifted = []
    for backend, group in sorted(by_backend.items()):
        ratios = [case.ratio for case in group]
        middle = statistics.median(ratios)
        if abs(middle - 1) > BACKEND_SHIFT:
            shifted.append(f"{backend} ({middle:.3f})")
        lines.append(f"| {backend} | {len(group)} | {middle:.3f} | {min(ratios):.3f}-"
                     f"{max(ratios):.3f} | {sum(not case.reproduces for case in group)} |")
    differing = [case for case in found if case.mine["status"] != case.ours["status"]]
    if differing:
        lines += ["", "Statuses that differ:", "", "| case | yours | ours | your reason |",
                  "|---|---|---|---|"]
        lines += [f"| {case.label()} | {case.mine['status']} | {case.ours['status']} | "
                  f"{(case.mine.get('reason') or '').replace('|', '/')[:160]} |"
                  for case in differing]
    outside = sorted((case for case in timed if not case.reproduces),
                     key=lambda case: -abs(case.ratio - 1))
    if outside:
        lines += ["", f"Outside tolerance (the {min(len(outside), SHOWN)} farthest):", "",
                  "| case | your ms | our ms | ratio | tolerance |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {case.label()} | {case.mine['median_ms']:.4g} | "
                  f"{case.ours['median_ms']:.4g} | {case.ratio:.3f} | +-{case.tolerance:.1%} |"
                  for case in outside[:SHOWN]]
    within = len(timed) - len(outside)
    verdict = (f"{within} of {len(timed)} timed cases reproduce within tolerance; "
               f"{len(differing)} of {len(found)} cases differ in status.")
    if shifted:
        verdict += (f" Backends whose median moved by more than {BACKEND_SHIFT:.0%}: "
                    f"{', '.join(shifted)}.")
    return "\n".join([*lines, "", verdict])
