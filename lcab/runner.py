"""The runner: for each case, check, validate, time and write rows.

Every suite runs through it. A case writes one row per *part* (an attention
case per direction, a collective per message size, lcab.comm_suite) and
runs its own steps; the runner owns what every suite shares: the runtime,
statuses (lcab.status), the failure path (OOM, ERROR, UNAVAILABLE, harness
errors), isolation in a child process, resume and the rows of cases a dead
process never wrote. A case is a frozen, picklable value with `framework`,
`parts`, `only(parts)`, `options(settings)`, `keys(options)` (the
results.row_key of each part's row), `row(part, status, settings, **fields)`
and `run(runner, runtime, rows, context)`.

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
import math
import multiprocessing
import os
import pathlib
import signal
import statistics
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from multiprocessing import resource_tracker

from lcab import fullcheck, processes, registry, results, validation
from lcab.flops import tflops_per_second
from lcab.gpu_poll import GpuPoll
from lcab.runtime import Runtime, Timing
from lcab.status import Status
from lcab.workloads import Workload

_REASON_CHARS = 600

# The backward is timed as the fwd+bwd samples minus the forward's median.
# Its time stands only when it is clear of the noise: at most BELOW_SHARE of
# the fwd+bwd samples at or below the forward's median (so the backward's
# p20 and median are positive; a few stray samples of a busy CPU among a
# hundred do not void a clear difference), and the difference of the
# medians more than RESOLVE_SIGMAS standard errors.
# A pair short of that is measured once more, with more samples (at least
# REMEASURE_FACTOR times as many and REMEASURE_MIN_S of sampling, at most
# REMEASURE_MAX_S or REMEASURE_MAX_ITERS); one still short gets no time.
RESOLVE_SIGMAS = 3.0
BELOW_SHARE = 0.1
REMEASURE_FACTOR = 4
REMEASURE_MIN_S = 1.0
REMEASURE_MAX_S = 20.0
REMEASURE_MAX_ITERS = 1000
# Standard error of a median: sqrt(pi / 2) sigma / sqrt(n) for normal
# samples, sigma taken robustly as the median absolute deviation times this.
_MAD_TO_SIGMA = 1.4826
_MEDIAN_ERROR = math.sqrt(math.pi / 2)


@dataclasses.dataclass(frozen=True)
class BackwardGap:
    """The fwd+bwd median minus the forward's median (ms), its standard
    error, and how many fwd+bwd samples fell at or below the forward's median."""

    ms: float
    error_ms: float
    samples: int
    below: int

    @property
    def resolved(self) -> bool:
        return (self.below <= BELOW_SHARE * self.samples
                and self.ms > RESOLVE_SIGMAS * self.error_ms)

    def reason(self) -> str:
        """Why the backward gets no time ("not measurable: ...")."""
        told = (f"not measurable: fwd+bwd median minus fwd median is {self.ms:.3g} ms "
                f"± {self.error_ms:.2g} ms over {self.samples} samples")
        if self.ms <= 0:
            return f"{told} (noise exceeds the backward)"
        if self.below > BELOW_SHARE * self.samples:
            return (f"{told}; {self.below} fwd+bwd samples at or below the fwd median, more "
                    f"than {BELOW_SHARE:.0%} of them (noise exceeds the backward)")
        return f"{told} (within {RESOLVE_SIGMAS:g} standard errors of the noise)"


def median_error_ms(timing: Timing) -> float:
    """The standard error of a Timing's median (ms), from its samples' spread."""
    samples = timing.samples_ms
    middle = statistics.median(samples)
    sigma = _MAD_TO_SIGMA * statistics.median(abs(s - middle) for s in samples)
    return _MEDIAN_ERROR * sigma / math.sqrt(len(samples))


def backward_gap(forward: Timing, both: Timing) -> BackwardGap:
    """How far the fwd+bwd samples stand above the forward's."""
    return BackwardGap(
        ms=both.median_ms - forward.median_ms,
        error_ms=math.hypot(median_error_ms(forward), median_error_ms(both)),
        samples=len(both.samples_ms),
        below=sum(s <= forward.median_ms for s in both.samples_ms),
    )


def backward_timing(forward: Timing, both: Timing) -> Timing:
    """The backward's samples: each fwd+bwd sample minus the forward's median."""
    return Timing(
        tuple(s - forward.median_ms for s in both.samples_ms),
        compile_s=both.compile_s,
        peak_mem_bytes=both.peak_mem_bytes,
        calls_per_sample=both.calls_per_sample,
    )


def remeasure_iters(forward: Timing, both: Timing, iters: int) -> int | None:
    """Samples for a second measurement of an unresolved pair, or None when
    the time limits leave no more than it had."""
    pair_ms = (forward.median_ms * forward.calls_per_sample
               + max(both.median_ms, 0.0) * both.calls_per_sample)
    if pair_ms <= 0:
        return None
    wanted = max(REMEASURE_FACTOR * iters, math.ceil(REMEASURE_MIN_S * 1e3 / pair_ms))
    allowed = min(REMEASURE_MAX_ITERS, math.floor(REMEASURE_MAX_S * 1e3 / pair_ms))
    chosen = min(wanted, allowed)
    return chosen if chosen > iters else None


@dataclasses.dataclass(frozen=True)
class Case:
    """One backend on one workload, in the given directions (its parts)."""

    backend: str
    workload: Workload
    directions: tuple[str, ...] = ("fwd", "bwd")
    suite: str = "kernel"

    @property
    def framework(self) -> str:
        return registry.framework_of(self.backend)

    @property
    def parts(self) -> tuple[str, ...]:
        return self.directions

    def only(self, parts: Sequence[str]) -> "Case":
        return dataclasses.replace(self, directions=tuple(parts))

    def options(self, settings: "Settings") -> dict[str, str]:
        return settings.options_for(self.backend)

    def keys(self, options: dict[str, str] | None = None) -> list[tuple]:
        """results.row_key of each direction's row, run with `options`."""
        return [
            (self.suite, self.backend, self.workload.key(), direction,
             results.options_key(options))
            for direction in self.directions
        ]

    def row(self, direction: str, status: Status, settings: "Settings", **fields) -> dict:
        """The direction's result row (lcab.results.COLUMNS)."""
        w = self.workload
        device = fields.pop("device_info", None)
        flops = fields.pop("flops_of", {}).get(direction) or w.flops(direction)
        inner_options = fields.pop("inner_options", None)
        options = self.options(settings)
        # A row written without the backend loaded (a dead process's) still
        # says which CP size was asked for, so it lands beside its peers.
        asked = options.get("cp_size", "")
        cp_size = fields.pop("cp_size", None) or (int(asked) if asked.isdigit() else 1)
        return results.make_row(
            framework=self.framework,
            backend=self.backend,
            suite=self.suite,
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
            flops=flops,
            options=options,
            inner_options=dict(inner_options) if inner_options is not None else None,
            device=device.name if device else None,
            n_devices=device.count if device else None,
            cp_size=cp_size,
            git_commit=settings.git_commit,
            timestamp=now(),
            workload_key=w.key(),
            run_id=settings.run_id,
            flags=settings.flags,
            warmup=settings.warmup,
            iters=settings.iters,
            **fields,
        )

    def run(self, runner: "Runner", runtime: Runtime, rows: list[dict], context: dict) -> None:
        runner._run_attention(self, runtime, rows, context)


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
    isolate_timeout_s: float | None = None  # an isolated case running longer is killed
    backend_options: tuple[tuple[str, str, str], ...] = ()  # (backend, key, value)
    golden_dir: str | None = None  # save or compare outputs and gradients (orbax)
    profile_dir: str | None = None  # one profiled call per case, after timing (traces)
    full_check: bool = True  # lcab.fullcheck before timing (off: quicker, rows unchecked)
    reference_cache: str | None = None  # the check's references shared between processes

    def options_for(self, backend: str) -> dict[str, str]:
        return {key: value for name, key, value in self.backend_options if name == backend}


def now() -> str:
    """A row's timestamp: UTC, ISO 8601, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def describe(exc: BaseException) -> str:
    """An exception as a row's reason: type and message, one line, bounded."""
    text = f"{type(exc).__name__}: {exc}".strip()
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def probe_as_check(workload: Workload, verdict: validation.Verdict | None,
                   directions: Sequence[str]) -> dict[str, fullcheck.CheckResult]:
    """{direction: CheckResult} of a probe that ran `workload` itself (a short
    one, with few heads, is its own probe): it compared every batch row, head
    and query row with the float64 reference, more than the full-size check
    would, so its errors stand for that check. Empty when the probe was
    another workload or did not cover every direction."""
    if verdict is None or verdict.workload != workload:
        return {}
    covered = ("out", "dq", "dk", "dv") if "bwd" in directions else ("out",)
    if not all(name in verdict.errors for name in covered):
        return {}
    heads = f"{fullcheck.selection(workload).describe(workload)} (the probe: float64 reference)"

    def result(errors: dict[str, float]) -> fullcheck.CheckResult:
        return fullcheck.CheckResult(errors, verdict.tolerance, heads, workload.seqlen_q,
                                     verdict.seconds or 0.0)

    # The fwd row's check is the forward run alone, as it is timed.
    return {direction: result({"out": verdict.fwd_err} if direction == "fwd"
                              else dict(verdict.errors))
            for direction in directions}


@dataclasses.dataclass(frozen=True)
class Claims:
    """What a loaded backend says of a case before any probe, in the
    runner's order: the directions it has no pass for, then `supports()`
    (or the exception it raised), the directions its support refuses, each
    group with its reason, and the directions left to probe and time. The
    runner writes the groups as UNSUPPORTED rows; `--dry_run` prints them."""

    missing: tuple[list[str], str] | None
    support: object | None = None  # lcab.backend.Support; None if no direction reached it
    failure: Exception | None = None  # what supports() raised
    refused: tuple[list[str], str] | None = None
    directions: tuple[str, ...] = ()
    # UNAVAILABLE where the machine, not the backend, lacks those passes.
    missing_status: Status = Status.UNSUPPORTED


def claims_of(case: Case, backend) -> Claims:
    """The checks the runner makes before it probes."""
    missing = [d for d in case.directions if d not in backend.directions]
    here = backend.directions_problem
    status = Status.UNAVAILABLE if missing and here else Status.UNSUPPORTED
    missing = (missing, f"{case.backend} has no {'/'.join(missing)} pass"
               + (f" here: {here}" if here else "")) if missing else None
    directions = [d for d in case.directions if d in backend.directions]
    if not directions:
        return Claims(missing, missing_status=status)
    try:
        support = backend.supports(case.workload)
    except Exception as exc:  # noqa: BLE001 - the caller decides what it becomes
        return Claims(missing, failure=exc, missing_status=status)
    if not support.ok:
        return Claims(missing, support, refused=(directions, support.reason),
                      missing_status=status)
    refused = None
    if support.directions is not None:
        blocked = [d for d in directions if d not in support.directions]
        if blocked:
            refused = (blocked, f"{case.backend} runs {case.workload.mask.name} "
                                f"{'/'.join(support.directions)} only")
        directions = [d for d in directions if d in support.directions]
    return Claims(missing, support, refused=refused, directions=tuple(directions),
                  missing_status=status)


class Runner:
    def __init__(self, writer: results.Writer, settings: Settings):
        self.writer = writer
        self.settings = settings
        self._verdicts: dict[tuple, validation.Verdict | Exception] = {}

    # ----- rows -----------------------------------------------------------
    def write(self, case, part, status: Status, **fields) -> dict:
        row = case.row(part, status, self.settings, **fields)
        self.writer.write(row)
        return row

    def write_all(self, case, status: Status, parts=None, **fields) -> list[dict]:
        """One row of `status` per part (default: every part of the case)."""
        parts = case.parts if parts is None else parts
        return [self.write(case, part, status, **fields) for part in parts]

    def failed(self, case, parts, exc: BaseException, runtime: Runtime, context: dict,
               stage: str) -> list[dict]:
        """OOM or ERROR rows for an exception raised at `stage`."""
        status = Status.OOM if runtime.is_oom(exc) else Status.ERROR
        return self.write_all(case, status, parts, reason=f"{stage}: {describe(exc)}", **context)

    # ----- one case ---------------------------------------------------------
    def run_case(self, case) -> list[dict]:
        """Rows for every part of the case, whatever goes wrong.

        Anything unexpected (a backend raising in supports(), a runtime that
        cannot name its device, a sys.exit() in a backend, ...) becomes
        ERROR rows for the parts not yet written, so no backend can end a
        sweep.
        """
        written: list[dict] = []
        context: dict = {}
        try:
            try:
                runtime = registry.load_runtime(case.framework)
            except registry.Unavailable as exc:
                written += self.write_all(case, Status.UNAVAILABLE, reason=str(exc))
                return written
            context.update(device_info=runtime.device(), versions=runtime.versions())
            case.run(self, runtime, written, context)
        # A backend calling sys.exit() must not end the sweep either; only an
        # interruption (KeyboardInterrupt, lcab.processes' Stopped) does.
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the last line of defence
            done = {results.row_key(row) for row in written}
            keys = case.keys(case.options(self.settings))
            left = [part for part, key in zip(case.parts, keys) if key not in done]
            written += self.write_all(
                case, Status.ERROR, left, reason=f"harness: {describe(exc)}", **context
            )
        return written

    # ----- the attention suites (kernel, cp, module) -------------------------
    def _run_attention(self, case: Case, runtime: Runtime, rows: list[dict],
                       context: dict) -> None:
        options = case.options(self.settings)
        try:
            backend = registry.load_backend(case.backend, options)
        except registry.Unavailable as exc:
            rows += self.write_all(case, Status.UNAVAILABLE, reason=str(exc), **context)
            return
        context.update(cp_size=backend.cp_size, strategy=backend.strategy,
                       flops_of={d: backend.flops(case.workload, d) for d in case.directions})
        inner = backend.inner()
        if inner is not None:  # the kernel a strategy runs inside, as columns
            context.update(inner=inner[0], inner_options=inner[1])
        claims = claims_of(case, backend)
        if claims.missing:
            rows += self.write_all(case, claims.missing_status, claims.missing[0],
                                   reason=claims.missing[1], **context)
        if claims.failure is not None:
            raise claims.failure
        support = claims.support
        if support is None:
            return
        if support.ok:
            context["notes"] = "; ".join(filter(None, [support.how,
                                                       backend.case_notes(case.workload)]))
        if claims.refused:
            rows += self.write_all(case, Status.UNSUPPORTED, claims.refused[0],
                                   reason=claims.refused[1], **context)
        directions = list(claims.directions)
        if not directions:
            return

        verdict = self._validate(backend, runtime, case.workload, support, "bwd" in directions)
        if isinstance(verdict, Exception):
            status = Status.OOM if runtime.is_oom(verdict) else Status.ERROR
            rows += self.write_all(
                case, status, directions,
                reason=f"correctness probe failed to run: {describe(verdict)}", **context,
            )
            return
        if verdict.note:
            context["notes"] = f"{context['notes']}; {verdict.note}"
        context["probe"] = verdict.probe
        if verdict.bwd_failure is not None and "bwd" in directions:
            # The probe's forward ran: the forward stands on its own.
            rows += self.failed(case, ["bwd"], verdict.bwd_failure, runtime, context,
                                "correctness probe failed to run in backward")
            directions = [d for d in directions if d != "bwd"]
        timed = []
        for direction in directions:
            if verdict.ok(direction):
                timed.append(direction)
            else:
                error = verdict.error(direction)
                rows.append(self.write(
                    case, direction, Status.MISMATCH,
                    max_err=error if error is not None and math.isfinite(error) else None,
                    reason=(
                        f"normalised max error {error:.3g} > {verdict.tolerance:g} "
                        f"on the probe ({verdict.probe})"
                    ),
                    **context,
                ))
        if timed:
            rows += self._time(case, backend, runtime, timed, verdict, context)

    def _validate(self, backend, runtime, workload: Workload, support, backward: bool):
        # One probe per code path: the same family expressed the same way
        # (support.how), dtype, head_dim and GQA ratio, so long sweeps probe
        # each family once. A workload short enough to be its own probe,
        # or a hand-built mask, is probed as itself (keyed by fingerprint);
        # a probe sized to the timed case (Backend.probe_needs) and run by
        # the backend pinned to it is keyed by both.
        # The full-size check runs the timed pipelines themselves, so with it
        # on the probe need not be sized to reach them (Backend.probe_needs).
        sized = not self.settings.full_check and backend.probe_needs(workload) is not None
        try:
            probe, note = validation.choose_probe(backend, workload, support.how, sized=sized)
            prober, pinned = backend.pinned_to(workload)
        except Exception as exc:  # noqa: BLE001 - any failure is a row status
            return exc
        family = workload.mask.name
        if probe.mask == workload.mask or family not in validation.FAMILIES_BY_NAME:
            family = f"{family}@{workload.mask.fingerprint()}"
        key = (backend.name, family, support.how, workload.dtype, workload.head_dim,
               workload.gqa_ratio, backward, probe.key() if sized else None, pinned)
        if key not in self._verdicts:
            try:
                self._verdicts[key] = validation.check_probe(
                    prober, runtime, probe, note="; ".join(filter(None, [note, pinned])),
                    backward=backward, seed=self.settings.seed,
                )
            except Exception as exc:  # noqa: BLE001 - any failure is a row status
                self._verdicts[key] = exc
                runtime.cleanup()
        return self._verdicts[key]

    def _time(self, case, backend, runtime: Runtime, directions, verdict, context) -> list[dict]:
        w = case.workload
        if backend.layout == "bhsd":
            q_shape = (w.batch, w.heads_q, w.seqlen_q, w.head_dim)
            kv_shape = (w.batch, w.heads_kv, w.seqlen_k, w.head_dim)
        else:
            q_shape = (w.batch, w.seqlen_q, w.heads_q, w.head_dim)
            kv_shape = (w.batch, w.seqlen_k, w.heads_kv, w.head_dim)
        rows = []
        try:
            start = time.perf_counter()
            fn = backend.build(w)
            context["setup_s"] = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001
            runtime.cleanup()
            return self.failed(case, directions, exc, runtime, context, "build")
        checked = {}
        if self.settings.full_check:
            checked, failure = self._full_check(case, backend, runtime, fn, directions, context,
                                                verdict)
            if failure is not None:  # the directions it left unchecked get no number
                unchecked = [d for d in directions if d not in checked]
                rows += self.failed(case, unchecked, failure, runtime, context,
                                    "full-size check failed to run")
            for direction, check in checked.items():
                if not check.ok(direction):
                    rows.append(self.write(
                        case, direction, Status.MISMATCH, reason=check.mismatch(direction),
                        max_err=verdict.error(direction), **check.columns(direction), **context))
            done = {row["direction"] for row in rows}
            directions = [d for d in directions if d not in done]
            if not directions:
                return rows
        measure = dict(warmup=self.settings.warmup, iters=self.settings.iters,
                       flush_l2=self.settings.flush_l2)
        try:
            inputs = runtime.random_inputs(
                [q_shape, kv_shape, kv_shape, q_shape], w.dtype, self.settings.seed
            )
            non_finite, failure = self._non_finite(runtime, fn, inputs, directions)
        except Exception as exc:  # noqa: BLE001
            runtime.cleanup()
            return rows + self.failed(case, directions, exc, runtime, context, "forward")
        for direction, reason in non_finite.items():
            columns = checked[direction].columns(direction) if direction in checked else {}
            rows.append(self.write(case, direction, Status.MISMATCH, reason=reason,
                                   max_err=verdict.error(direction), **columns, **context))
        if failure is not None:  # the backward failed; the forward stands
            rows += self.failed(case, ["bwd"], failure, runtime, context, "backward")
        directions = [d for d in directions
                      if d not in non_finite and not (failure is not None and d == "bwd")]
        if not directions:
            del inputs, fn
            runtime.cleanup()
            return rows
        both = failure = None
        try:
            with GpuPoll() as poll:
                if "bwd" in directions:  # both from one warm state, samples in turn
                    try:
                        forward, both = self._measure_pair(runtime, fn, inputs, measure)
                    except Exception as exc:  # noqa: BLE001 - the forward may still stand
                        runtime.cleanup()
                        failure = exc
                if both is None:
                    forward = runtime.measure(fn, inputs[:3], backward=False, **measure)
            context["clocks"] = poll.summary()
        except Exception as exc:  # noqa: BLE001
            runtime.cleanup()
            return rows + self.failed(case, directions, exc, runtime, context, "forward")
        if self.settings.profile_dir:
            self._profile(case, runtime, fn, inputs, both is not None)
        golden = {}
        if self.settings.golden_dir:
            golden = self._golden(case, runtime, fn, inputs, both is not None, backend.layout)
            context["golden_err"] = golden.get("error")
        if "fwd" in directions:
            rows.append(self._measured(case, "fwd", forward, verdict, context, golden,
                                       checked.get("fwd")))
        if failure is not None:
            return rows + self.failed(case, ["bwd"], failure, runtime, context, "backward")
        if both is not None:
            gap = backward_gap(forward, both)
            rows.append(self._measured(
                case, "bwd", backward_timing(forward, both), verdict, context, golden,
                checked.get("bwd"), unmeasurable=None if gap.resolved else gap.reason()))
        del inputs, fn
        runtime.cleanup()
        return rows

    @staticmethod
    def _measure_pair(runtime: Runtime, fn, inputs, measure: dict) -> tuple[Timing, Timing]:
        """(forward, fwd+bwd) Timings, measured again with more samples when
        the backward's gap is not clear of the noise (backward_gap). Every
        process of a multi-process run decides alike: runtimes hand each the
        same samples (the slowest process's)."""
        forward, both = runtime.measure_pair(fn, inputs, **measure)
        if backward_gap(forward, both).resolved:
            return forward, both
        iters = remeasure_iters(forward, both, measure["iters"])
        if iters is None:
            return forward, both
        again = runtime.measure_pair(fn, inputs, **{**measure, "iters": iters})
        # The first call's time (compile_s) is the first measurement's.
        return tuple(dataclasses.replace(timing, compile_s=first.compile_s)
                     for timing, first in zip(again, (forward, both)))

    @staticmethod
    def _non_finite(runtime: Runtime, fn, inputs, directions) -> tuple[dict, Exception | None]:
        """One untimed call at the timed inputs: {direction: reason} for the
        directions whose outputs hold a NaN or an infinity (a non-finite
        output at the timed size is never OK, checked or not), and the
        exception of a backward that failed (None: it ran or was not asked).
        A forward that fails raises. The forward runs alone even when the
        backward follows: the fwd row times the forward alone, which may take
        another path (no autodiff, inputs without grad) than fwd+bwd."""
        if not runtime.all_finite([runtime.forward(fn, *inputs[:3])]):
            reason = "non-finite output (NaN or inf) at the timed inputs"
            return {d: reason for d in directions}, None
        if "bwd" not in directions:
            return {}, None
        try:
            found = runtime.forward_backward(fn, *inputs)
        except Exception as exc:  # noqa: BLE001 - the forward may still stand
            runtime.cleanup()
            return {}, exc
        if not runtime.all_finite(list(found)):
            return {"bwd": "non-finite output or gradient (NaN or inf) at the timed inputs"}, None
        return {}, None

    def _full_check(self, case, backend, runtime: Runtime, fn, directions, context,
                    verdict: validation.Verdict | None = None):
        """lcab.fullcheck at the timed workload, before any timing: ({direction:
        CheckResult}, the exception that stopped it or None). A backward that
        fails leaves the forward checked alone; a runtime without a reference
        (Runtime.has_full_check) leaves a note and no check. A workload that
        was its own probe (`verdict`) is not checked again (probe_as_check)."""
        by_probe = probe_as_check(case.workload, verdict, directions)
        if by_probe:
            return by_probe, None
        if not runtime.has_full_check:
            note = f"no full-size check: the {runtime.framework} runtime has no reference"
            context["notes"] = "; ".join(filter(None, [context.get("notes"), note]))
            return {}, None
        check = fullcheck.plan(case.workload, self.settings.seed)
        attempts = [tuple(directions)]
        if "bwd" in directions and "fwd" in directions:
            attempts.append(("fwd",))
        failure = None
        for attempt in attempts:
            start = time.perf_counter()
            try:
                errors = runtime.full_check(fn, backend.layout, check,
                                            backward="bwd" in attempt,
                                            cache_dir=self.settings.reference_cache)
            except Exception as exc:  # noqa: BLE001 - becomes the rows' status
                runtime.cleanup()
                failure = failure or exc
                continue
            result = fullcheck.result(check, errors, time.perf_counter() - start)
            return {direction: result for direction in attempt}, failure
        return {}, failure

    def _profile(self, case, runtime: Runtime, fn, inputs, with_gradients: bool) -> None:
        """One more call of the timed function under the framework's profiler,
        after the timed ones (whose times it does not touch); its trace goes
        to profile_dir/<backend>_<mask>_<seqlen>[_cp<N>]/ (lcab.trace_overlap
        reads it). A profiler that fails costs a warning, not the row."""
        w = case.workload
        cp = case.suite == "cp" and case.options(self.settings).get("cp_size")
        name = f"{case.backend}_{w.mask.name}_{w.seqlen_q}" + (f"_cp{cp}" if cp else "")
        directory = pathlib.Path(self.settings.profile_dir) / name
        try:
            with runtime.profile(directory):
                runtime.measure(fn, inputs if with_gradients else inputs[:3],
                                backward=with_gradients, warmup=0, iters=1, flush_l2=False)
        except Exception as exc:  # noqa: BLE001
            warnings.warn(f"{name}: no profile: {describe(exc)}")

    def _golden(self, case, runtime: Runtime, fn, inputs, with_gradients: bool,
                layout: str) -> dict:
        """Compare the case's outputs (and gradients) with the golden data of
        this workload and input seed, or save them when there is none:
        {error, note, mismatch} for the rows."""
        directory = self.settings.golden_dir
        key = f"{case.workload.key()}/seed{self.settings.seed}"
        try:
            error = runtime.golden_error(fn, inputs, directory, key, with_gradients, layout)
        except Exception as exc:  # noqa: BLE001 - the timing stands; say why nothing was compared
            return {"note": f"golden data not compared: {describe(exc)}"}
        if error is None:
            return {"note": "saved as golden data"}
        tolerance = validation.TOLERANCE[case.workload.dtype]
        if error > tolerance:
            return {"error": error, "mismatch": f"differs from the golden data in {directory} "
                                                f"by {error:.3g} (tolerance {tolerance})"}
        return {"error": error}

    def _measured(self, case, direction, timing: Timing, verdict, context,
                  golden: dict | None = None, check=None,
                  unmeasurable: str | None = None) -> dict:
        """The timed row; `unmeasurable` (a reason) or a median <= 0 makes it
        an ERROR row without a time."""
        golden = golden or {}
        fields = dict(
            median_ms=timing.median_ms, p20_ms=timing.p20_ms, p80_ms=timing.p80_ms,
            spread=timing.spread, samples_ms=list(timing.samples_ms), compile_s=timing.compile_s,
            peak_mem_bytes=timing.peak_mem_bytes, max_err=verdict.error(direction), **context,
        )
        if check is not None:
            fields.update(check.columns(direction))
        if timing.calls_per_sample > 1:
            batched = f"each sample the mean of {timing.calls_per_sample} back-to-back calls"
            fields["notes"] = "; ".join(filter(None, [fields.get("notes"), batched]))
        if golden.get("note"):
            fields["notes"] = "; ".join(filter(None, [fields.get("notes"), golden["note"]]))
        if golden.get("mismatch"):  # a wrong answer gets no time, as at the probe
            for timed in ("median_ms", "p20_ms", "p80_ms", "spread", "samples_ms"):
                fields.pop(timed)
            return self.write(case, direction, Status.MISMATCH, reason=golden["mismatch"],
                             **fields)
        if unmeasurable is None and timing.median_ms <= 0:
            # bwd = (fwd+bwd) - fwd came out <= 0: no time of it exists.
            unmeasurable = (f"not measurable: fwd+bwd median minus fwd median is "
                            f"{timing.median_ms:.3g} ms (noise exceeds the backward)")
        if unmeasurable is not None:  # no time: the reason keeps how far off it was
            for timed in ("median_ms", "p20_ms", "p80_ms", "spread", "samples_ms"):
                fields.pop(timed)
            return self.write(case, direction, Status.ERROR, reason=unmeasurable, **fields)
        tflops = tflops_per_second(
            context["flops_of"][direction], timing.median_ms / 1e3, context["cp_size"]
        )
        return self.write(case, direction, Status.OK, tflops=tflops, **fields)

    # ----- isolation --------------------------------------------------------
    def run_case_isolated(self, case) -> None:
        """Run the case in a spawned child; if it dies, write ERROR rows for it."""
        context = multiprocessing.get_context("spawn")
        child = context.Process(
            target=_child_main,
            args=(case, self.settings, str(self.writer.path), registry.plugins()),
        )
        # The child starts with Ctrl-C blocked (a mask survives fork and
        # exec): one that lands while it imports would print a traceback
        # from multiprocessing's start-up; _child_main unblocks it inside
        # its handler. The mask is this thread's only (another thread of
        # this process may still take a Ctrl-C during start()). The
        # resource tracker starts first: starting it unblocks SIGINT in
        # the calling thread, which would undo the block for the first
        # child.
        resource_tracker.ensure_running()
        try:
            held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                child.start()
            finally:  # a Ctrl-C held back meanwhile is raised here
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
            child.join(self.settings.isolate_timeout_s)
            timed_out = child.is_alive()
        finally:  # an interrupted run takes its child with it
            if child.is_alive():
                child.kill()
                child.join()
        # This run's rows only: an earlier run's row of the case is no proof
        # that this child wrote one.
        written = results.done_keys([self.writer.path], run_id=self.settings.run_id)
        keys = case.keys(case.options(self.settings))
        lost = [part for part, key in zip(case.parts, keys) if key not in written]
        if lost:
            code = child.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            if timed_out:
                how = f"killed after {self.settings.isolate_timeout_s:g} s"
            self.write_all(case, Status.ERROR, lost, reason=f"isolated child process died ({how})")


def fill_missing(cases: Sequence, writer: results.Writer, settings: Settings,
                 reason: str, wanted: set[tuple] | None = None) -> int:
    """ERROR rows for every part of `cases` (only those whose key is in
    `wanted`, when given) that this run (settings.run_id) did not write to
    the file; returns how many."""
    runner = Runner(writer, settings)
    done = results.done_keys([writer.path], run_id=settings.run_id)
    count = 0
    for case in cases:
        keys = case.keys(case.options(settings))
        lost = [part for part, key in zip(case.parts, keys)
                if key not in done and (wanted is None or key in wanted)]
        count += len(runner.write_all(case, Status.ERROR, lost, reason=reason)) if lost else 0
    return count


def import_plugins(modules: Iterable[str]) -> None:
    """Import modules that register extra backends (--backend_modules)."""
    for module in modules:
        importlib.import_module(module)


def _child_main(case, settings: Settings, path: str, plugins: dict) -> None:
    processes.die_with_parent()  # no orphan writes rows after its run was killed
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by its parent
        import_plugins(settings.plugin_modules)
        for name, entry in plugins.items():
            registry.register_backend(name, entry.target, entry.suite)
        Runner(results.Writer(path), settings).run_case(case)
    except KeyboardInterrupt:  # the run was stopped; its parent says so
        os._exit(130)
    except BaseException:
        traceback.print_exc()
        raise


def run_cases(
    cases: Sequence,
    writer: results.Writer,
    settings: Settings,
    *,
    isolate: bool = False,
    skip: set[tuple] = frozenset(),
    progress: Callable[[object], None] | None = None,
) -> None:
    """Run every part of every case not already done (its key in `skip`)."""
    runner = Runner(writer, settings)
    for case in cases:
        keys = case.keys(case.options(settings))
        todo = [part for part, key in zip(case.parts, keys) if key not in skip]
        if todo:
            case = case.only(todo)
            if isolate:
                runner.run_case_isolated(case)
            else:
                runner.run_case(case)
        if progress:
            progress(case)
