"""How fast one kernel runs one call, read off its committed kernel rows.

A call's speed depends mostly on how much work it has (small calls leave the
GPU part idle) and on how dense its mask is (sparse masks waste part of each
tile). The curve keeps, per direction, the measured (FLOPs, density,
TFLOP/s) points of one backend on one device, and answers a call of given
FLOPs and density by interpolating TFLOP/s linearly in log FLOPs over the
points of similar density (within a factor of two; all points if none are),
held constant beyond the measured range. A call outside the FLOPs its
similar-density points span is extrapolated (`covers`); a curve whose rows
have one length has only one size per density, so every other call is.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from lcab.flops import TIMED_DIRECTIONS
from lcab.results import default_options


@dataclasses.dataclass(frozen=True)
class KernelCurve:
    backend: str
    device: str
    # direction -> (flops, density, tflops) arrays, sorted by flops
    points: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    lengths: tuple[int, ...] = ()  # the sequence lengths its rows measured

    @classmethod
    def from_rows(cls, rows, backend: str, device: str | None = None, *,
                  heads_q: int | None = None, head_dim: int | None = None,
                  dtype: str | None = None) -> "KernelCurve":
        """The curve of curve_rows(rows, ...); ValueError if it has none."""
        chosen = curve_rows(rows, backend, device, heads_q=heads_q, head_dim=head_dim,
                            dtype=dtype)
        if not chosen:
            where = f" on {device}" if device else ""
            raise ValueError(f"no OK kernel rows of {backend}{where} to build its curve from")
        points = {}
        for direction in TIMED_DIRECTIONS:
            mine = [r for r in chosen if r["direction"] == direction]
            if not mine:
                continue
            flops = np.array([float(r["flops"]) for r in mine])
            density = np.array([float(r["density"]) for r in mine])
            tflops = np.array([float(r["tflops"]) for r in mine])
            order = np.argsort(flops, kind="stable")
            points[direction] = (flops[order], density[order], tflops[order])
        lengths = tuple(sorted({int(r["seqlen"]) for r in chosen if r.get("seqlen")}))
        return cls(backend, chosen[0]["device"], points, lengths)

    def counts(self) -> dict[str, int]:
        """direction -> how many measured points the curve has."""
        return {direction: len(flops) for direction, (flops, _, _) in self.points.items()}

    def flops_range(self, direction: str) -> tuple[float, float]:
        """The smallest and largest call the curve measured in `direction`."""
        flops = self._points(direction)[0]
        return float(flops[0]), float(flops[-1])

    def covers(self, flops: float, density: float, direction: str) -> bool:
        """Whether a call lies within the FLOPs of the points its speed is
        read from (those of similar density); outside, it is extrapolated."""
        return bool(self.covered(flops, density, direction))

    def has_density(self, density: float, direction: str) -> bool:
        """Whether some measured point lies within a factor of two of
        `density` (else every point stands in, and the speed is a guess)."""
        return bool(self._within_two(density, direction).any())

    def _within_two(self, density, direction: str) -> np.ndarray:
        """Which points lie within a factor of two of `density`: a flag per
        point, for each value of `density` (a scalar or an array)."""
        dens = self._points(direction)[1]
        return np.abs(np.log2(np.maximum(dens, 1e-12)
                              / np.maximum(density, 1e-12)[..., None])) <= 1.0

    def _points(self, direction: str):
        if direction not in self.points:
            raise ValueError(f"{self.backend}: no {direction} rows; has {sorted(self.points)}")
        return self.points[direction]

    def _near(self, density: float, direction: str):
        """(flops, tflops) of the points a call of `density` is read from:
        those within a factor of two in density (all if none are), by flops."""
        x, _, speed = self._points(direction)
        near = self._within_two(density, direction)
        return (x[near], speed[near]) if near.any() else (x, speed)

    def tflops(self, flops: float, density: float, direction: str) -> float:
        return float(_speed_at(*self._near(density, direction), flops))

    def seconds(self, flops: float, density: float, direction: str) -> float:
        """One call's time; an empty call costs nothing (the strategies skip it)."""
        return float(self.seconds_of(flops, density, direction))

    def seconds_of(self, flops, density, direction: str) -> np.ndarray:
        """seconds() of many calls at once (arrays that broadcast): calls
        that read the same points share one interpolation, so the model's
        thousands of calls cost a few."""
        flops, groups = self._grouped(flops, density, direction)
        x, _, speed = self._points(direction)
        tflops = np.ones(flops.shape)
        for near, calls in groups:
            tflops[calls] = _speed_at(x[near], speed[near], flops[calls])
        return np.where(flops > 0, flops / (tflops * 1e12), 0.0)

    def covered(self, flops, density, direction: str) -> np.ndarray:
        """covers() of many calls at once (arrays that broadcast). A hair of
        slack: a call the size of a measured row may differ in the last bit."""
        flops, groups = self._grouped(flops, density, direction)
        x = self._points(direction)[0]
        inside = np.zeros(flops.shape, dtype=bool)
        for near, calls in groups:
            lowest, highest = x[near][0], x[near][-1]
            inside[calls] = ((lowest * (1 - 1e-9) <= flops[calls])
                             & (flops[calls] <= highest * (1 + 1e-9)))
        return inside

    def _grouped(self, flops, density, direction: str):
        """(flops as a float array of the broadcast shape, [(points, calls)]):
        the calls grouped by the points _near reads for them, as masks."""
        flops, density = np.broadcast_arrays(np.asarray(flops, dtype=np.float64),
                                             np.asarray(density, dtype=np.float64))
        # The points a call reads depend on its density alone, and the model
        # asks for few distinct densities: group those first (a fast 1-D
        # unique), not the calls' rows of flags (a slow unique over rows).
        densities, density_of_call = np.unique(density.reshape(-1), return_inverse=True)
        near = self._within_two(densities, direction)
        near[~near.any(axis=-1)] = True  # as _near: all points where none is near
        patterns, pattern_of_density = np.unique(near, axis=0, return_inverse=True)
        group = pattern_of_density.reshape(-1)[density_of_call.reshape(-1)].reshape(flops.shape)
        return flops, [(pattern, group == index) for index, pattern in enumerate(patterns)]


def _speed_at(x: np.ndarray, speed: np.ndarray, flops):
    """TFLOP/s at `flops` from points (x FLOPs, speed), linear in log FLOPs
    and constant beyond them; points of equal FLOPs (two masks of one area)
    average."""
    unique, inverse = np.unique(np.log(x), return_inverse=True)
    mean = np.bincount(inverse, weights=speed) / np.bincount(inverse)
    return np.interp(np.log(np.maximum(flops, 1.0)), unique, mean)


def curve_rows(rows, backend: str, device: str | None = None, *,
               heads_q: int | None = None, head_dim: int | None = None,
               dtype: str | None = None) -> list:
    """The rows a curve of `backend` is made of: its OK, timed kernel rows
    run with its default options (on `device`; default: the device with
    most such rows), optionally of one head count, head_dim, dtype. A row
    with backend options measured a variant (e.g. pallas_flex's
    fused_backward), not the kernel a CP strategy runs inside."""
    def wanted(row):
        return (row.get("suite") == "kernel" and row.get("backend") == backend
                and row.get("status") == "OK" and row.get("tflops")
                and row.get("flops") and row.get("density") is not None
                and row.get("direction") in TIMED_DIRECTIONS
                and default_options(row.get("options"))
                and (heads_q is None or row.get("heads_q") == heads_q)
                and (head_dim is None or row.get("head_dim") == head_dim)
                and (dtype is None or row.get("dtype") == dtype))

    chosen = [row for row in rows if wanted(row)]
    if chosen and device is None:
        device = Counter(row.get("device") for row in chosen).most_common(1)[0][0]
    return [row for row in chosen if row.get("device") == device]
