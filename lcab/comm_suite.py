"""The comm suite's sweep: every collective x rank count x message size,
checked once per (collective, ranks) on known values, then timed; one row
each (lcab.comm.comm_row), whatever happens to it."""

from __future__ import annotations

import dataclasses
from typing import Callable

from lcab import registry
from lcab.comm import comm_row, rounded_bytes
from lcab.runtime import Timing
from lcab.status import Status


@dataclasses.dataclass(frozen=True)
class CommSweep:
    ops: tuple[str, ...]
    sizes: tuple[int, ...]  # bytes per rank, before rounding to whole pieces
    ranks: tuple[int, ...]
    warmup: int
    iters: int


def run_comm(framework: str, sweep: CommSweep, write: Callable[[dict], None], *,
             git_commit: str, run_id: str, flags: str) -> None:
    try:
        runtime = registry.load_runtime(framework)
        device, versions = runtime.device(), runtime.versions()
    except registry.Unavailable as exc:
        runtime, device, versions = None, None, {}
        unavailable = str(exc)

    def row(op, nbytes, ranks, samples=(), **fields):
        write(comm_row(framework=framework, op=op, nbytes=nbytes, ranks=ranks,
                       samples_ms=list(samples), device=device.name if device else "",
                       versions=versions, git_commit=git_commit, run_id=run_id,
                       flags=flags, **fields))

    for ranks in sweep.ranks:
        for op in sweep.ops:
            sizes = [rounded_bytes(op, size, ranks) for size in sweep.sizes]
            problem = None
            if runtime is None:
                problem = (Status.UNAVAILABLE, unavailable)
            elif ranks > device.count:
                problem = (Status.UNAVAILABLE, f"{ranks} ranks: {device.count} devices here")
            else:
                problem = _check(runtime, op, ranks)
            for nbytes in sizes:
                if problem:
                    row(op, nbytes, ranks, status=problem[0].value, reason=problem[1])
                    continue
                try:
                    samples, notes = runtime.time_collective(
                        op, nbytes, ranks, warmup=sweep.warmup, iters=sweep.iters)
                except Exception as exc:  # noqa: BLE001 - one row says what failed
                    status = Status.OOM if runtime.is_oom(exc) else Status.ERROR
                    row(op, nbytes, ranks, status=status.value,
                        reason=f"{type(exc).__name__}: {exc}"[:500])
                    runtime.cleanup()
                    continue
                if Timing(tuple(samples)).median_ms <= 0:
                    # Too fast to tell apart from the host's own noise (CPU).
                    row(op, nbytes, ranks, samples, status=Status.ERROR.value,
                        reason="not measurable: median <= 0 after the empty loop's time",
                        notes=notes)
                else:
                    row(op, nbytes, ranks, samples, notes=notes)


def _check(runtime, op: str, ranks: int):
    """None if one `op` moves the right values, else (status, reason)."""
    try:
        runtime.check_collective(op, ranks)
    except NotImplementedError as exc:
        return Status.UNSUPPORTED, str(exc)
    except AssertionError as exc:
        return Status.MISMATCH, str(exc)
    except Exception as exc:  # noqa: BLE001
        return Status.ERROR, f"{type(exc).__name__}: {exc}"[:500]
    return None
