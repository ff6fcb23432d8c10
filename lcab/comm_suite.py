"""The comm suite's cases: one collective over one rank count, at every
message size, run by lcab.runner like every other suite.

A case checks its collective once on known values, then times it at each
size; it writes one row per size (lcab.comm.comm_row). The runner gives it
what every suite shares: UNAVAILABLE when the framework cannot load, OOM or
ERROR for a failure, isolation, resume and the rows a dead process left
unwritten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lcab import results
from lcab.comm import comm_row, rounded_bytes
from lcab.runtime import Runtime, Timing
from lcab.status import Status


@dataclasses.dataclass(frozen=True)
class CollectiveCase:
    framework: str
    op: str
    ranks: int
    sizes: tuple[int, ...]  # bytes per rank, each one row
    suite = results.COMM_SUITE

    @property
    def parts(self) -> tuple[int, ...]:
        return self.sizes

    def only(self, parts: Sequence[int]) -> "CollectiveCase":
        return dataclasses.replace(self, sizes=tuple(parts))

    def options(self, settings) -> dict[str, str]:
        return {}  # collectives take no backend options

    def keys(self, options=None) -> list[tuple]:
        return [results.comm_key(self.framework, self.op, self.ranks, n) for n in self.sizes]

    def row(self, nbytes: int, status: Status, settings, **fields) -> dict:
        """The size's result row (lcab.results.COMM_COLUMNS)."""
        device = fields.get("device_info")
        return comm_row(
            framework=self.framework, op=self.op, nbytes=nbytes, ranks=self.ranks,
            samples_ms=list(fields.get("samples_ms") or ()),
            device=device.name if device else "", versions=fields.get("versions") or {},
            git_commit=settings.git_commit, run_id=settings.run_id, flags=settings.flags,
            status=status.value, reason=fields.get("reason", ""), notes=fields.get("notes", ""))

    def run(self, runner, runtime: Runtime, rows: list[dict], context: dict) -> None:
        count = context["device_info"].count
        if self.ranks > count:
            rows += runner.write_all(self, Status.UNAVAILABLE,
                                     reason=f"{self.ranks} ranks: {count} devices here", **context)
            return
        try:
            runtime.check_collective(self.op, self.ranks)
        except NotImplementedError as exc:
            rows += runner.write_all(self, Status.UNSUPPORTED, reason=str(exc), **context)
            return
        except AssertionError as exc:
            rows += runner.write_all(self, Status.MISMATCH, reason=str(exc), **context)
            return
        except Exception as exc:  # noqa: BLE001 - a status on this case's rows
            runtime.cleanup()
            rows += runner.failed(self, None, exc, runtime, context, "check on known values")
            return
        warmup = max(1, runner.settings.warmup)  # the first call sets up the group
        for nbytes in self.sizes:
            try:
                samples, notes = runtime.time_collective(
                    self.op, nbytes, self.ranks, warmup=warmup, iters=runner.settings.iters)
            except Exception as exc:  # noqa: BLE001 - a status on this size's row
                runtime.cleanup()
                rows += runner.failed(self, [nbytes], exc, runtime, context, "timing")
                continue
            if Timing(tuple(samples)).median_ms <= 0:
                # Too fast to tell apart from the host's own noise (CPU).
                rows.append(runner.write(
                    self, nbytes, Status.ERROR, samples_ms=samples, notes=notes,
                    reason="not measurable: median <= 0 after the empty loop's time", **context))
            else:
                rows.append(runner.write(self, nbytes, Status.OK, samples_ms=samples,
                                         notes=notes, **context))


def collective_cases(framework: str, ops: Sequence[str], sizes: Sequence[int],
                     ranks: Sequence[int]) -> list[CollectiveCase]:
    """Every collective x rank count, each at every size (rounded so the op
    splits it into whole elements per rank)."""
    return [CollectiveCase(framework, op, count,
                           tuple(dict.fromkeys(rounded_bytes(op, n, count) for n in sizes)))
            for count in ranks for op in ops]
