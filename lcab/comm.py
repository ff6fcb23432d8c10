"""The communication suite's vocabulary: collectives, message sizes, rows,
and the alpha-beta fit the CP performance model calibrates from.

A comm row times one collective of the CP strategies over `ranks` devices:

- ``ppermute``: every rank sends `bytes` to its ring neighbour (one ring step
  of K/V);
- ``all_gather``: every rank ends with `bytes`, of which it contributed
  1/ranks (K/V all-gather);
- ``all_to_all``: every rank holds `bytes` and keeps 1/ranks of it (Ulysses).

Sizes and bus bandwidth follow nccl-tests: `bytes` is the per-rank buffer
(the gathered output for all_gather), algbw = bytes / time, and busbw =
algbw x (ranks - 1) / ranks for all_gather and all_to_all, x 1 for ppermute
-- the rate at which each link carries data, comparable across ops and
rank counts.
"""

from __future__ import annotations

import dataclasses
import datetime
import re

import numpy as np

from lcab import results
from lcab.runtime import Timing

COMM_OPS = ("ppermute", "all_gather", "all_to_all")

_SIZE = re.compile(r"^(\d+)([kmg]?)(i?b)?$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_bytes(text: str) -> int:
    """'4k' / '4KiB' / '4096' -> 4096 (binary units)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError(f"message size {text!r} is not a count of bytes such as 4096, 64k, 16MiB")
    value = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise ValueError(f"message size {text!r} must be positive")
    return value


def check_op(name: str) -> str:
    if name not in COMM_OPS:
        raise ValueError(f"collective {name!r} is not one of {', '.join(COMM_OPS)}")
    return name


def bus_factor(op: str, ranks: int) -> float:
    """busbw / algbw for the op (nccl-tests' convention)."""
    check_op(op)
    return 1.0 if op == "ppermute" else (ranks - 1) / ranks


def rounded_bytes(op: str, nbytes: int, ranks: int, itemsize: int = 2) -> int:
    """The largest size <= nbytes (at least one element per rank's piece)
    that the op can split evenly: all_gather and all_to_all cut the buffer
    into `ranks` pieces of whole elements."""
    unit = itemsize * (1 if op == "ppermute" else ranks)
    return max(unit, nbytes // unit * unit)


@dataclasses.dataclass(frozen=True)
class AlphaBeta:
    """time = alpha + bytes / beta for one op on one link level."""

    alpha_s: float  # latency per call, seconds
    beta_bytes_per_s: float  # algorithmic bandwidth, bytes per second

    def seconds(self, nbytes: float) -> float:
        return self.alpha_s + nbytes / self.beta_bytes_per_s


def fit_alpha_beta(nbytes, seconds) -> AlphaBeta:
    """Least-squares alpha and beta over measured (bytes, seconds) points,
    weighted by 1/time so small messages (latency) count as much as large
    ones (bandwidth); alpha is kept >= 0."""
    x = np.asarray(nbytes, np.float64)
    t = np.asarray(seconds, np.float64)
    if x.size < 2 or np.unique(x).size < 2:
        raise ValueError("an alpha-beta fit needs at least two message sizes")
    weights = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * weights[:, None]
    (alpha, inverse_beta), *_ = np.linalg.lstsq(design, t * weights, rcond=None)
    if alpha < 0:  # a bandwidth-only line through the origin
        alpha, inverse_beta = 0.0, float(np.sum(weights**2 * x * t) / np.sum(weights**2 * x * x))
    if inverse_beta <= 0:
        raise ValueError("the measured times do not grow with the message size")
    return AlphaBeta(float(alpha), float(1.0 / inverse_beta))


def comm_row(*, framework: str, op: str, nbytes: int, ranks: int, samples_ms: list[float],
             device: str, versions: dict, git_commit: str, run_id: str, flags: str,
             status: str = "OK", reason: str = "", notes: str = "") -> dict:
    """One comm result row (its own schema, lcab.results.COMM_COLUMNS)."""
    timing = Timing(tuple(samples_ms)) if samples_ms else None
    median = timing.median_ms if timing else None
    algbw = nbytes / (median * 1e-3) / 1e9 if median and median > 0 else None
    return results.make_comm_row(
        framework=framework, op=op, bytes=int(nbytes), ranks=int(ranks), status=status,
        reason=reason, median_ms=median,
        p20_ms=timing.p20_ms if timing else None,
        p80_ms=timing.p80_ms if timing else None,
        samples_ms=[float(s) for s in samples_ms],
        algbw_gbps=algbw,
        busbw_gbps=algbw * bus_factor(op, ranks) if algbw else None,
        device=device, notes=notes, versions=versions, git_commit=git_commit,
        timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        run_id=run_id, flags=flags,
    )
