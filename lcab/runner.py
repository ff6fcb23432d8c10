"""The runner: for each case, check, validate, time and write rows.

It never looks at a backend's name: everything it does comes from the
backend's declarations, the framework's runtime and the result statuses.
A failure of any kind becomes a status on that case's rows and the sweep
goes on; with `isolate`, each case runs in a child process so that even a
crashed driver loses one case, not the run.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import multiprocessing
import traceback
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from lcab import registry, results, validation
from lcab.flops import tflops_per_second
from lcab.runtime import Runtime, Timing
from lcab.status import Status
from lcab.workloads import Workload

_REASON_CHARS = 600


@dataclasses.dataclass(frozen=True)
class Case:
    """One backend on one workload, in the given directions."""

    backend: str
    workload: Workload
    directions: tuple[str, ...] = ("fwd", "bwd")
    suite: str = "kernel"

    def keys(self) -> list[tuple]:
        return [
            (self.suite, self.backend, self.workload.key(), direction)
            for direction in self.directions
        ]


@dataclasses.dataclass(frozen=True)
class Settings:
    warmup: int = 3
    iters: int = 10
    flush_l2: bool = True
    seed: int = 0
    run_id: str = ""
    flags: str = ""
    git_commit: str = "unknown"
    plugin_modules: tuple[str, ...] = ()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


class Runner:
    def __init__(self, writer: results.Writer, settings: Settings):
        self.writer = writer
        self.settings = settings
        self._verdicts: dict[tuple, validation.Verdict | Exception] = {}

    # ----- rows -----------------------------------------------------------
    def _row(self, case: Case, direction: str, status: Status, **fields) -> dict:
        w = case.workload
        framework = registry.framework_of(case.backend)
        device = fields.pop("device_info", None)
        versions = fields.pop("versions", None)
        cp_size = fields.pop("cp_size", 1)
        row = results.make_row(
            framework=framework,
            backend=case.backend,
            suite=case.suite,
            mask=w.mask.name,
            mask_params=w.mask.params,
            mask_fingerprint=w.mask.fingerprint(),
            mask_area=w.mask.area(),
            density=w.mask.density(),
            seqlen=w.seqlen_q,
            seqlen_k=w.seqlen_k,
            batch=w.batch,
            heads_q=w.heads_q,
            heads_kv=w.heads_kv,
            head_dim=w.head_dim,
            dtype=w.dtype,
            direction=direction,
            status=status.value,
            reason=fields.pop("reason", ""),
            flops=w.flops(direction),
            device=device.name if device else None,
            n_devices=device.count if device else None,
            cp_size=cp_size,
            versions=versions,
            git_commit=self.settings.git_commit,
            timestamp=_now(),
            workload_key=w.key(),
            run_id=self.settings.run_id,
            flags=self.settings.flags,
            warmup=self.settings.warmup,
            iters=self.settings.iters,
            **fields,
        )
        self.writer.write(row)
        return row

    def _rows_for_all(self, case, status, directions=None, **fields) -> list[dict]:
        return [self._row(case, d, status, **fields) for d in (directions or case.directions)]

    # ----- one case ---------------------------------------------------------
    def run_case(self, case: Case) -> list[dict]:
        try:
            runtime = registry.load_runtime(registry.framework_of(case.backend))
            backend = registry.load_backend(case.backend)
        except registry.Unavailable as exc:
            return self._rows_for_all(case, Status.UNAVAILABLE, reason=str(exc))
        context = dict(
            device_info=runtime.device(),
            versions=runtime.versions(),
            cp_size=backend.cp_size,
            strategy=backend.strategy,
        )
        rows = []
        directions = [d for d in case.directions if d in backend.directions]
        missing = [d for d in case.directions if d not in backend.directions]
        if missing:
            rows += self._rows_for_all(
                case, Status.UNSUPPORTED, missing,
                reason=f"{case.backend} has no {'/'.join(missing)} pass", **context,
            )
        if not directions:
            return rows
        support = backend.supports(case.workload)
        if not support.ok:
            return rows + self._rows_for_all(
                case, Status.UNSUPPORTED, directions, reason=support.reason, **context
            )
        context["notes"] = support.how

        verdict = self._validate(backend, runtime, case.workload, "bwd" in directions)
        if isinstance(verdict, Exception):
            status = Status.OOM if runtime.is_oom(verdict) else Status.ERROR
            return rows + self._rows_for_all(
                case, status, directions,
                reason=f"correctness probe failed to run: {_describe(verdict)}", **context,
            )
        timed = []
        for direction in directions:
            if verdict.ok(direction):
                timed.append(direction)
            else:
                rows.append(self._row(
                    case, direction, Status.MISMATCH, max_err=verdict.error(direction),
                    reason=(
                        f"normalised max error {verdict.error(direction):.3g} > "
                        f"{verdict.tolerance:g} on the probe ({verdict.probe})"
                    ),
                    **context,
                ))
        if timed:
            rows += self._time(case, backend, runtime, timed, verdict, context)
        return rows

    def _validate(self, backend, runtime, workload: Workload, backward: bool):
        key = (backend.name, workload.mask.name, workload.dtype, workload.head_dim,
               workload.gqa_ratio, backward)
        if key not in self._verdicts:
            try:
                self._verdicts[key] = validation.check(
                    backend, runtime, workload, backward=backward, seed=self.settings.seed
                )
            except Exception as exc:  # noqa: BLE001 - any failure is a row status
                self._verdicts[key] = exc
                runtime.cleanup()
        return self._verdicts[key]

    def _time(self, case, backend, runtime: Runtime, directions, verdict, context) -> list[dict]:
        w = case.workload
        q_shape = (w.batch, w.seqlen_q, w.heads_q, w.head_dim)
        kv_shape = (w.batch, w.seqlen_k, w.heads_kv, w.head_dim)
        if backend.layout == "bhsd":
            q_shape, kv_shape = tuple(np.array(q_shape)[[0, 2, 1, 3]]), tuple(
                np.array(kv_shape)[[0, 2, 1, 3]]
            )
        measure = dict(warmup=self.settings.warmup, iters=self.settings.iters,
                       flush_l2=self.settings.flush_l2)
        rows = []
        try:
            inputs = runtime.random_inputs(
                [q_shape, kv_shape, kv_shape, q_shape], w.dtype, self.settings.seed
            )
            fn = backend.build(w)
            forward = runtime.measure(fn, inputs[:3], backward=False, **measure)
        except Exception as exc:  # noqa: BLE001
            runtime.cleanup()
            return self._failed(case, directions, exc, runtime, context, "forward")
        if "fwd" in directions:
            rows.append(self._measured(case, "fwd", forward, verdict, context))
        if "bwd" in directions:
            try:
                both = runtime.measure(fn, inputs, backward=True, **measure)
            except Exception as exc:  # noqa: BLE001
                runtime.cleanup()
                return rows + self._failed(case, ["bwd"], exc, runtime, context, "backward")
            backward = Timing(
                tuple(s - forward.median_ms for s in both.samples_ms),
                compile_s=both.compile_s,
                peak_mem_bytes=both.peak_mem_bytes,
            )
            rows.append(self._measured(case, "bwd", backward, verdict, context))
        del inputs, fn
        runtime.cleanup()
        return rows

    def _measured(self, case, direction, timing: Timing, verdict, context) -> dict:
        fields = dict(
            median_ms=timing.median_ms, p20_ms=timing.p20_ms, p80_ms=timing.p80_ms,
            samples_ms=list(timing.samples_ms), compile_s=timing.compile_s,
            peak_mem_bytes=timing.peak_mem_bytes, max_err=verdict.error(direction), **context,
        )
        if timing.median_ms <= 0:
            return self._row(
                case, direction, Status.ERROR,
                reason="not measurable: fwd+bwd median <= fwd median", **fields,
            )
        tflops = tflops_per_second(
            case.workload.flops(direction), timing.median_ms / 1e3, context["cp_size"]
        )
        return self._row(case, direction, Status.OK, tflops=tflops, **fields)

    def _failed(self, case, directions, exc, runtime, context, stage) -> list[dict]:
        status = Status.OOM if runtime.is_oom(exc) else Status.ERROR
        return self._rows_for_all(
            case, status, directions, reason=f"{stage}: {_describe(exc)}", **context
        )

    # ----- isolation --------------------------------------------------------
    def run_case_isolated(self, case: Case) -> None:
        """Run the case in a spawned child; if it dies, write ERROR rows for it."""
        context = multiprocessing.get_context("spawn")
        child = context.Process(
            target=_child_main,
            args=(case, self.settings, str(self.writer.path), registry.plugins()),
        )
        child.start()
        child.join()
        written = results.done_keys([self.writer.path])
        lost = [d for d, key in zip(case.directions, case.keys()) if key not in written]
        if lost:
            code = child.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            self._rows_for_all(
                case, Status.ERROR, lost, reason=f"isolated child process died ({how})"
            )


def import_plugins(modules: Iterable[str]) -> None:
    """Import modules that register extra backends (--backend_modules)."""
    for module in modules:
        importlib.import_module(module)


def _child_main(case: Case, settings: Settings, path: str, plugins: dict) -> None:
    import_plugins(settings.plugin_modules)
    for name, entry in plugins.items():
        registry.register_backend(name, entry.target, entry.suite)
    try:
        Runner(results.Writer(path), settings).run_case(case)
    except BaseException:
        traceback.print_exc()
        raise


def run_cases(
    cases: Sequence[Case],
    writer: results.Writer,
    settings: Settings,
    *,
    isolate: bool = False,
    skip: set[tuple] = frozenset(),
    progress: Callable[[Case], None] | None = None,
) -> None:
    """Run every case not already done (all of its keys in `skip`)."""
    runner = Runner(writer, settings)
    for case in cases:
        todo = [d for d, key in zip(case.directions, case.keys()) if key not in skip]
        if todo:
            case = dataclasses.replace(case, directions=tuple(todo))
            if isolate:
                runner.run_case_isolated(case)
            else:
                runner.run_case(case)
        if progress:
            progress(case)
