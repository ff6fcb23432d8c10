"""Which measured rows the model is calibrated on, and how to say so.

By default the newest canonical runs (lcab.canonical; found from the
package, so any working directory will do):

- the kernel curve: the kernel's rows on the card of the newest cp run
  (which the links and the validation come from, so that one model never
  joins two cards' speeds), from that card's current blog run (lengths
  1k-64k: the small per-rank calls of many GPUs) and its current cp run's
  single-GPU rows (16k-128k), joined;
- the links inside a node: the newest cp run's comm rows of the modelled
  kernel's framework (each framework times its own collectives);
- the validation: the newest cp run's CP and single-GPU rows.

Paths given for a role replace its canonical run. With neither, the model
stops with NoCanonicalRun rather than read older rows in their place.
Every Source says which folders, commits, devices and dates it read.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections import Counter

from lcab import canonical, results
from lcab.comm import AlphaBeta
from lcab.model.coverage import lengths_text
from lcab.model.kernel_curve import KernelCurve, curve_rows
from lcab.model.network import INFINIBAND_NDR, NVLINK_H100, Network, comm_fits, comm_rows

# The canonical sweeps a kernel curve may come from, in order of preference.
KERNEL_SWEEPS = ("blog", "cp")
# The sweep whose run calibrates the links and is validated against.
CP_SWEEP = "cp"


class CalibrationError(ValueError):
    """Rows the model cannot be calibrated on; the message is one line for
    the user."""


class NoCanonicalRun(CalibrationError):
    """No canonical run of the sweeps a role reads, and no paths for it."""

    def __init__(self, sweeps: tuple[str, ...], root: pathlib.Path):
        self.sweeps, self.root = sweeps, root
        names = " or ".join(f"<date>-<device>-{sweep}/" for sweep in sweeps)
        super().__init__(f"no canonical {' or '.join(sweeps)} run under {root} "
                         f"(a folder {names}, written by a GPU run of that sweep)")


@dataclasses.dataclass(frozen=True)
class Source:
    """The rows one part of the model was calibrated on."""
    role: str                          # e.g. "kernel curve"
    paths: tuple[pathlib.Path, ...]    # what was read
    rows: tuple[dict, ...]             # the rows the part took from them
    detail: str                        # what it took, in words

    def describe(self) -> str:
        return f"{self.role}: {self.detail}; from {where(self.paths)}; {about(self.rows)}"


def read(paths) -> list[dict]:
    """The rows of files or folders, each measurement once (its newest row,
    lcab.results.newest_rows); a path that does not exist is a
    CalibrationError."""
    try:
        return results.newest_rows(results.read_rows(paths))
    except FileNotFoundError as exc:
        raise CalibrationError(str(exc)) from None


def kernel_curve(backend: str, *, head_dim: int, dtype: str, directions, device=None,
                 paths=(), root: pathlib.Path | None = None
                 ) -> tuple[KernelCurve, Source]:
    """The curve of `backend` (default options) from `paths`, else from the
    rows of the current KERNEL_SWEEPS runs on the card of the newest cp
    run, joined: the blog run's short lengths and the cp run's long ones."""
    root = root or canonical.RESULTS
    if paths:
        group = tuple(map(pathlib.Path, paths))
        chosen = curve_rows(read(group), backend, device, head_dim=head_dim, dtype=dtype)
    else:
        device = device or cp_card(root)
        runs = [folder for sweep in KERNEL_SWEEPS for folder in canonical.current(sweep, root)]
        if not runs:
            raise NoCanonicalRun(KERNEL_SWEEPS, root)
        found = {folder: curve_rows(read((folder,)), backend, device, head_dim=head_dim,
                                    dtype=dtype) for folder in runs}
        # A run of another card contributes nothing and is not named.
        group = tuple(folder for folder, rows in found.items() if rows) or tuple(runs)
        chosen = [row for rows in found.values() for row in rows]
    missing = sorted(set(directions) - {row["direction"] for row in chosen})
    if not chosen or missing:
        on = f" on {device}" if device else ""
        what = f"no {'/'.join(missing)} rows" if chosen else "no OK rows"
        raise CalibrationError(f"{where(group)} has {what} of {backend} with its default "
                               f"options{on} at d={head_dim}, {dtype}")
    curve = KernelCurve.from_rows(chosen, backend)
    counts = ", ".join(f"{d} {n}" for d, n in curve.counts().items())
    detail = (f"{backend} with its default options on {curve.device} "
              f"(d={head_dim}, {dtype}), {len(chosen)} rows ({counts}) {lengths_text(curve)}")
    return curve, Source("kernel curve", group, tuple(chosen), detail)


def cp_card(root: pathlib.Path | None = None) -> str | None:
    """The card of the newest cp run's rows (the one most of them ran on),
    or None where there is no such run."""
    folder = canonical.newest(CP_SWEEP, root or canonical.RESULTS)
    if folder is None:
        return None
    devices = Counter(row.get("device") for row in read((folder,))
                      if row.get("status") == "OK" and row.get("device"))
    return devices.most_common(1)[0][0] if devices else None


def links(*, framework: str, gpus_per_node: int, inter: AlphaBeta = INFINIBAND_NDR, paths=(),
          root: pathlib.Path | None = None) -> tuple[Network, Source]:
    """The intra-node links fitted to `framework`'s comm rows of `paths`,
    else of the newest cp run (the cp sweep times both frameworks'
    collectives; the modelled strategies use one framework's). An op
    without rows keeps its NVLINK_H100 constant; the Source says so, and
    which framework's rows it used."""
    group = _paths_or_newest(paths, root)
    rows = read(group)
    fits = comm_fits(rows, framework)
    network = Network(gpus_per_node=gpus_per_node,
                      intra={**NVLINK_H100, **{op: link for op, (link, _) in fits.items()}},
                      inter=inter)
    parts = []
    for op, link in network.intra.items():
        if op in fits:
            fitted = f"fitted to {len(fits[op][1])} rows at {fits[op][1][0]['ranks']} ranks"
        else:
            fitted = f"no {framework} comm rows: lcab.model.network.NVLINK_H100's constant"
        parts.append(f"{op} {link.alpha_s * 1e6:.1f} us, "
                     f"{link.beta_bytes_per_s / 1e9:.0f} GB/s ({fitted})")
    frameworks = {str(r.get("framework")) for r in rows if r.get("suite") == results.COMM_SUITE}
    left_out = [f"{len(comm_rows(rows, other))} {other}"
                for other in sorted(frameworks - {framework})]
    whose = f"{framework}'s collectives only" + (
        f" ({', '.join(left_out)} comm rows left out)" if left_out else "")
    fitted_rows = tuple(row for _, ok in fits.values() for row in ok)
    return network, Source("links inside a node", group, fitted_rows,
                           f"{whose}: {'; '.join(parts)}")


def measured(paths=(), root: pathlib.Path | None = None) -> tuple[list[dict], Source]:
    """The rows to validate against: of `paths`, else of the newest cp run."""
    group = _paths_or_newest(paths, root)
    rows = read(group)
    cp_rows = [r for r in rows if r.get("suite") == "cp" and r.get("status") == "OK"]
    single = [r for r in rows if r.get("suite") == "kernel" and r.get("status") == "OK"]
    detail = f"{len(cp_rows)} OK CP rows, {len(single)} OK single-GPU rows"
    return rows, Source("validation", group, tuple(cp_rows + single), detail)


def _paths_or_newest(paths, root: pathlib.Path | None) -> tuple[pathlib.Path, ...]:
    if paths:
        return tuple(map(pathlib.Path, paths))
    root = root or canonical.RESULTS  # read now, so a test may point it elsewhere
    folder = canonical.newest(CP_SWEEP, root)
    if folder is None:
        raise NoCanonicalRun((CP_SWEEP,), root)
    return (folder,)


def where(paths) -> str:
    """The paths read, each canonical folder with its sweep, date and device."""
    shown = []
    for path in paths:
        path = pathlib.Path(path).absolute()  # not resolved: a linked folder keeps its name
        text = str(path.relative_to(canonical.ROOT)) if path.is_relative_to(canonical.ROOT) \
            else str(path)
        parsed = canonical.parse_folder(path.name)
        if parsed:
            date, device, sweep = parsed
            text += f" (canonical {sweep} run, {date}, {device})"
        shown.append(text)
    return ", ".join(shown)


def about(rows) -> str:
    """Commits, devices and dates of the rows: what they were measured with."""
    if not rows:
        return "no rows"
    commits = sorted({str(row.get("git_commit") or "unknown") for row in rows})
    devices = sorted({str(row.get("device") or "unknown") for row in rows})
    days = sorted({str(row.get("timestamp") or "")[:10] for row in rows} - {""})
    dates = (days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}") if days else "unknown"
    return (f"commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}; "
            f"device{'s' if len(devices) > 1 else ''} {', '.join(devices)}; measured {dates}")

