"""The runner: statuses for every failure, rows for every case, isolation."""

import dataclasses
import json

import pytest

import tests.fake_backends  # noqa: F401 - registers the numpy.* test backends
from lcab import registry, results, validation
from lcab.masks import MASK_NAMES, AttnMask, AttnSlice, make_mask, small_mask
from lcab.runner import Case, Runner, Settings, run_cases
from lcab.validation import TOLERANCE
from lcab.workloads import Workload
from tests.row_checks import measured_or_noisy, status_noise_as_ok

SETTINGS = Settings(warmup=1, iters=5, run_id="test", git_commit="abc123")


def workload(mask_name="causal", seqlen=256, dtype="float32", heads=(4, 2), head_dim=16):
    mask = small_mask(mask_name, seqlen) if seqlen >= 32 else make_mask(mask_name, seqlen)
    return Workload(1, seqlen, seqlen, *heads, head_dim, dtype, mask)


def run(tmp_path, cases, settings=SETTINGS, **kwargs):
    path = tmp_path / "rows.jsonl"
    run_cases(cases, results.Writer(path), settings, **kwargs)
    return results.read_rows([path])


def test_a_correct_backend_gets_timed_rows(tmp_path):
    # Seven repeats; a busy host's noise blurring the backward has the pair
    # measured again with at least four times as many. On a 2-core machine
    # running the suite in two workers even that can leave the backward
    # "not measurable" (status_noise_as_ok: the runner right): then the whole
    # measurement again, up to three times, since this test is about the
    # rows of a measurable one.
    settings = dataclasses.replace(SETTINGS, iters=7)
    for attempt in range(3):
        rows = run(tmp_path / str(attempt), [Case("numpy.reference", workload("causal_document"))],
                   settings)
        if all(status_noise_as_ok(r) == r["status"] for r in rows):
            break
    assert [(r["direction"], r["status"]) for r in rows] == [("fwd", "OK"), ("bwd", "OK")]
    assert len(rows[0]["samples_ms"]) == len(rows[1]["samples_ms"]) in (7, *range(28, 1001))
    for row in rows:
        assert set(row) == set(results.COLUMNS)
        assert row["tflops"] > 0 and row["median_ms"] > 0 and min(row["samples_ms"]) > 0
        assert row["p20_ms"] <= row["median_ms"] <= row["p80_ms"]
        assert row["max_err"] < 1e-6  # float32 reference vs float64 reference
        assert row["mask"] == "causal_document" and row["notes"] == "dense float64 reference"
        assert row["flops"] == workload("causal_document").flops(row["direction"])
        assert row["git_commit"] == "abc123" and row["framework"] == "numpy"
        assert json.loads(json.dumps(row["mask_params"]))["doc_lens"] == [40, 72, 24, 56, 64]
    fwd, bwd = rows
    assert bwd["tflops"] == pytest.approx(
        bwd["flops"] / (bwd["median_ms"] / 1e3) / 1e12
    )


def test_a_wrong_kernel_is_a_mismatch_not_a_number(tmp_path):
    case = Case("numpy.off_by_one", workload("sliding_window", dtype="bf16"), ("fwd",))
    rows = run(tmp_path, [case])
    assert [r["status"] for r in rows] == ["MISMATCH"]
    assert rows[0]["max_err"] > TOLERANCE["bfloat16"]
    assert rows[0]["median_ms"] is None and rows[0]["tflops"] is None
    assert "probe" in rows[0]["reason"]


def test_failures_become_statuses_and_the_sweep_goes_on(tmp_path):
    cases = [
        Case("numpy.oom", workload("causal", 1024)),
        Case("numpy.raises", workload("causal")),
        Case("numpy.causal_only", workload("full_document")),
        Case("numpy.causal_only", make_causal_only_case()),
        Case("numpy.missing", workload("causal")),
        Case("numpy.oom", workload("causal", 256)),
    ]
    rows = run(tmp_path, cases)
    statuses = [(r["backend"], r["direction"], status_noise_as_ok(r)) for r in rows]
    assert statuses == [
        ("numpy.oom", "fwd", "OOM"), ("numpy.oom", "bwd", "OOM"),
        ("numpy.raises", "fwd", "ERROR"), ("numpy.raises", "bwd", "ERROR"),
        ("numpy.causal_only", "bwd", "UNSUPPORTED"), ("numpy.causal_only", "fwd", "UNSUPPORTED"),
        ("numpy.causal_only", "bwd", "UNSUPPORTED"), ("numpy.causal_only", "fwd", "OK"),
        ("numpy.missing", "fwd", "UNAVAILABLE"), ("numpy.missing", "bwd", "UNAVAILABLE"),
        ("numpy.oom", "fwd", "OK"), ("numpy.oom", "bwd", "OK"),
    ]
    reasons = {(r["backend"], r["direction"], r["status"]): r["reason"] for r in rows}
    assert "80.00 GiB" in reasons[("numpy.oom", "fwd", "OOM")]
    assert "kernel launch failed" in reasons[("numpy.raises", "fwd", "ERROR")]
    assert "only the causal mask" in reasons[("numpy.causal_only", "fwd", "UNSUPPORTED")]
    assert "has no bwd pass" in reasons[("numpy.causal_only", "bwd", "UNSUPPORTED")]
    assert "a_package_that_is_not_installed" in reasons[("numpy.missing", "fwd", "UNAVAILABLE")]


class StrategyBackend(tests.fake_backends.ReferenceBackend):
    """A stand-in CP strategy: the reference, declaring the kernel it runs inside."""

    name = "numpy.strategy"
    suite = "cp"
    strategy = "ring"
    options = {"block": str}

    def __init__(self, block: str = "64"):
        self.block = block

    def inner(self):
        return "numpy.reference", {"block": self.block}


registry.register_backend(StrategyBackend.name, f"{__name__}:StrategyBackend", "cp")


def test_rows_name_the_inner_kernel_in_columns(tmp_path):
    settings = dataclasses.replace(SETTINGS, backend_options=(("numpy.strategy", "block", "32"),))
    rows = run(tmp_path, [Case("numpy.strategy", workload("causal"), ("fwd",), "cp"),
                          Case("numpy.reference", workload("causal"), ("fwd",))], settings)
    strategy, kernel = rows
    assert (strategy["inner"], strategy["inner_options"]) == ("numpy.reference", {"block": "32"})
    assert strategy["strategy"] == "ring" and strategy["options"] == {"block": "32"}
    assert kernel["inner"] is None and kernel["inner_options"] is None
    frame = results.load([tmp_path / "rows.jsonl"])  # JSON text, as the options column
    assert frame["inner_options"].iloc[0] == '{"block": "32"}'
    assert frame["inner_options"].isna().iloc[1]


def make_causal_only_case():
    return Workload(1, 300, 300, 2, 2, 8, "float32", make_mask("causal", 300))


def test_nan_outputs_and_raising_backends_never_end_the_sweep(tmp_path):
    cases = [
        Case("numpy.nan", workload("causal"), ("fwd",)),
        Case("numpy.raises_in_supports", workload("causal")),
        Case("numpy.raises_at_start", workload("causal")),
        Case("numpy.reference", workload("causal")),
    ]
    rows = run(tmp_path, cases)
    assert [(r["backend"], status_noise_as_ok(r)) for r in rows] == [
        ("numpy.nan", "MISMATCH"),
        ("numpy.raises_in_supports", "ERROR"), ("numpy.raises_in_supports", "ERROR"),
        ("numpy.raises_at_start", "UNAVAILABLE"), ("numpy.raises_at_start", "UNAVAILABLE"),
        ("numpy.reference", "OK"), ("numpy.reference", "OK"),
    ]
    assert rows[0]["max_err"] is None and "inf" in rows[0]["reason"]
    assert "KeyError" in rows[1]["reason"] and "no table entry" in rows[1]["reason"]
    assert "driver handle could not be created" in rows[3]["reason"]
    assert rows[3]["device"] == "cpu"  # the runtime loaded, so the row names the device


def test_hand_built_masks_are_probed_each_on_its_own(tmp_path):
    full = AttnMask(128, 128, [AttnSlice(0, 128, 0, 128, "full")])
    causal = AttnMask(128, 128, [AttnSlice(0, 128, 0, 128, "causal")])
    cases = [Case("numpy.ignores_mask", Workload(1, 128, 128, 2, 1, 8, "float32", mask), ("fwd",))
             for mask in (full, causal)]
    rows = run(tmp_path, cases)
    assert [r["status"] for r in rows] == ["OK", "MISMATCH"]


def test_the_probe_takes_the_timed_code_path():
    # One 4096-token document: jax.xla runs it as plain causal (is_causal),
    # so its probe must be a one-document mask too, not five documents.
    backend = registry.load_backend("jax.xla")
    mask = make_mask("causal_document", 4096, doc_lens=[4096])
    timed = Workload(1, 4096, 4096, 8, 2, 64, "bfloat16", mask)
    probe, note = validation.choose_probe(backend, timed)
    assert backend.supports(timed).how == backend.supports(probe).how == "is_causal"
    assert probe.seqlen_q == backend.probe_seqlen and note == ""
    assert (probe.heads_q, probe.heads_kv) == (8, 2)
    packed = timed.with_mask(make_mask("causal_document", 4096, distribution="pile"))
    probe, note = validation.choose_probe(backend, packed)
    assert backend.supports(probe).how == "dense boolean mask" and note == ""
    assert len(probe.mask.doc_lens()) > 1


def test_a_mask_can_run_in_fewer_directions_than_the_backend(tmp_path):
    cases = [Case("numpy.causal_forward_only", workload(m)) for m in ("full", "causal")]
    rows = run(tmp_path, cases)
    assert [(r["mask"], r["direction"], status_noise_as_ok(r)) for r in rows] == [
        ("full", "fwd", "OK"), ("full", "bwd", "OK"),
        ("causal", "bwd", "UNSUPPORTED"), ("causal", "fwd", "OK"),
    ]
    assert rows[2]["reason"] == "numpy.causal_forward_only runs causal fwd only"


def test_isolation_turns_a_crash_into_one_error_case(tmp_path):
    cases = [Case("numpy.crash", workload("causal")), Case("numpy.reference", workload("causal"))]
    rows = run(tmp_path, cases, isolate=True)
    assert [(r["backend"], r["status"]) for r in rows[:3]] == [
        ("numpy.crash", "ERROR"), ("numpy.crash", "ERROR"), ("numpy.reference", "OK"),
    ]
    assert "isolated child process died (exit code 3)" in rows[0]["reason"]
    # The next case ran in its own child; its bwd (fwd+bwd minus fwd, two
    # timed calls on a tiny shape) can drown in a loaded CPU's noise.
    assert measured_or_noisy(rows[3])


def test_resume_retries_errors_but_not_settled_rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    cases = [Case("numpy.raises", workload("causal")), Case("numpy.reference", workload("causal"))]
    run_cases(cases, results.Writer(path), SETTINGS)
    # On a loaded CPU the reference's tiny backward (fwd+bwd minus fwd) can
    # come out "not measurable", an ERROR like any other: retried too.
    noise = {results.row_key(r) for r in results.read_rows([path])
             if r["backend"] == "numpy.reference" and r["status"] != "OK"
             and measured_or_noisy(r)}
    settled = results.done_keys([path], settled_only=True)
    assert settled == set(cases[1].keys()) - noise
    run_cases(cases, results.Writer(path), SETTINGS, skip=settled)
    rows = results.read_rows([path])
    assert [r["backend"] for r in rows].count("numpy.raises") == 4  # measured again
    assert [r["backend"] for r in rows].count("numpy.reference") == 2 + len(noise)  # not


def test_rows_record_their_options_and_resume_tells_option_sets_apart(tmp_path):
    path = tmp_path / "rows.jsonl"
    case = Case("numpy.tunable", workload("causal"))
    runs = {v: dataclasses.replace(SETTINGS, backend_options=(("numpy.tunable", "variant", v),))
            for v in "ab"}
    run_cases([case], results.Writer(path), runs["a"])
    run_cases([case], results.Writer(path), runs["a"], skip=results.done_keys([path]))
    run_cases([case], results.Writer(path), runs["b"], skip=results.done_keys([path]))
    rows = results.read_rows([path])
    # "a" ran once (its second run was resumed past); "b" is another measurement.
    assert [r["options"] for r in rows] == [{"variant": "a"}] * 2 + [{"variant": "b"}] * 2
    assert all(measured_or_noisy(r) for r in rows)
    assert len({results.row_key(r) for r in rows}) == 4


def test_rows_from_before_the_options_column_take_their_options_from_their_flags(tmp_path):
    path = tmp_path / "rows.jsonl"
    settings = dataclasses.replace(SETTINGS, backend_options=(("numpy.tunable", "variant", "a"),))
    run_cases([Case("numpy.tunable", workload("causal"))], results.Writer(path), settings)
    new = results.read_rows([path])
    flags = {"backend_options": [["numpy.tunable", "variant", "a"], ["other", "variant", "b"]]}
    legacy = [{k: v for k, v in row.items() if k != "options"} | {"flags": json.dumps(flags)}
              for row in new]
    legacy += [{k: v for k, v in legacy[0].items() if k != "flags"}]  # no record: no options
    path.write_text("".join(json.dumps(row) + "\n" for row in legacy))
    rows = results.read_rows([path])
    assert [r["options"] for r in rows] == [{"variant": "a"}] * 2 + [{}]
    assert [results.row_key(r) for r in rows[:2]] == [results.row_key(r) for r in new]


def test_newest_rows_keeps_the_last_measurement_of_each_key():
    row = {"suite": "cp", "backend": "b", "workload_key": "w", "direction": "fwd",
           "cp_size": 2, "strategy": "ring", "device": "gpu"}
    old = row | {"timestamp": "2026-11-26T10:00:00+00:00", "tflops": 1.0, "options": None}
    new = row | {"timestamp": "2026-11-26T13:00:00+00:00", "tflops": 2.0, "options": {}}
    other = new | {"options": {"dispatch": "zigzag"}, "tflops": 3.0}
    kept = results.newest_rows([new, other, old])
    # No options and empty options are one measurement; another option set is another.
    assert sorted(r["tflops"] for r in kept) == [2.0, 3.0]


def test_isolation_kills_a_case_that_hangs(tmp_path):
    settings = Settings(warmup=0, iters=1, isolate_timeout_s=2.0)
    path = tmp_path / "rows.jsonl"
    hang = Case("numpy.hangs", workload("causal"), ("fwd",))
    run_cases([hang], results.Writer(path), settings, isolate=True)
    rows = results.read_rows([path])
    assert [(r["status"], r["reason"]) for r in rows] == [
        ("ERROR", "isolated child process died (killed after 2 s)")]


class _Interrupted(Exception):
    pass


def test_a_ctrl_c_held_back_during_a_childs_start_takes_the_child_with_it(tmp_path,
                                                                          monkeypatch):
    """A Ctrl-C that lands while the isolated child starts is held back
    until start() returns; raised then, it must still kill the child
    (else a hung case outlives its run). The signal is sent to this thread
    right after start, and a handler of the test's own turns it into an
    exception (pytest's workers may treat a real Ctrl-C otherwise)."""
    import multiprocessing.process
    import os
    import signal
    import threading

    started = []
    start = multiprocessing.process.BaseProcess.start

    def start_then_ctrl_c(process):
        start(process)
        started.append(process.pid)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    def interrupted(*_):
        raise _Interrupted

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start_then_ctrl_c)
    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        settings = Settings(warmup=0, iters=1, isolate_timeout_s=60.0)
        runner = Runner(results.Writer(tmp_path / "rows.jsonl"), settings)
        with pytest.raises(_Interrupted):
            runner.run_case_isolated(Case("numpy.hangs", workload("causal"), ("fwd",)))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(started) == 1
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(started[0], 0)


def test_resume_skips_rows_that_exist(tmp_path):
    cases = [Case("numpy.reference", workload(m)) for m in ("causal", "full", "causal_document")]
    path = tmp_path / "rows.jsonl"
    run_cases(cases[:2], results.Writer(path), SETTINGS)
    first = results.read_rows([path])
    run_cases(cases, results.Writer(path), SETTINGS, skip=results.done_keys([path]))
    rows = results.read_rows([path])
    assert rows[: len(first)] == first
    assert len(rows) == 6 and len({results.row_key(r) for r in rows}) == 6


# ----- the real CPU backends against the reference, family by family --------
LOW_PRECISION_MASKS = ["causal", "causal_document", "block_sparse", "longformer_window"]


@pytest.mark.parametrize("backend", ["jax.xla", "torch.sdpa_math"])
@pytest.mark.parametrize(
    "dtype, masks", [("float32", MASK_NAMES), ("bfloat16", LOW_PRECISION_MASKS)]
)
def test_cpu_backends_match_the_reference_on_every_family(tmp_path, backend, dtype, masks):
    try:
        registry.load_backend(backend)
    except registry.Unavailable as exc:
        pytest.skip(str(exc))
    cases = [Case(backend, workload(m, 128, dtype, (8, 2), 32)) for m in masks]
    path = tmp_path / "rows.jsonl"
    run_cases(cases, results.Writer(path), Settings(warmup=2, iters=5))
    rows = results.read_rows([path])
    # At a few hundred tokens on a loaded CPU, fwd+bwd - fwd can drown in
    # noise; the harness then says "not measurable", which is not a failure
    # of the backend. Everything else must be OK.
    bad = [(r["mask"], r["direction"], r["status"], r["reason"]) for r in rows
           if not measured_or_noisy(r)]
    assert not bad
    assert len(rows) == 2 * len(masks)
    assert all(r["status"] == "OK" for r in rows if r["direction"] == "fwd")
    assert sum(r["status"] == "OK" for r in rows if r["direction"] == "bwd") >= len(masks) // 2
    assert max(r["max_err"] for r in rows) < TOLERANCE[dtype] / 4
    assert all(r["tflops"] > 0 for r in rows if r["status"] == "OK")


def test_rows_say_when_a_sample_averages_several_calls(tmp_path, monkeypatch):
    from lcab.numpy_runtime import NumpyRuntime
    from lcab.runtime import Timing

    measure = NumpyRuntime.measure

    def batched(self, *args, **kwargs):
        timing = measure(self, *args, **kwargs)
        return Timing(timing.samples_ms, timing.compile_s, timing.peak_mem_bytes, 8)

    monkeypatch.setattr(NumpyRuntime, "measure", batched)
    rows = run(tmp_path, [Case("numpy.reference", workload("causal"))])
    assert [r["notes"] for r in rows] == [
        "dense float64 reference; each sample the mean of 8 back-to-back calls"] * 2


def test_a_backward_that_fails_when_timed_leaves_the_forward_timed(tmp_path):
    rows = run(tmp_path, [Case("numpy.backward_fails_when_timed", workload("causal"))])
    fwd, bwd = sorted(rows, key=lambda r: r["direction"], reverse=True)
    assert fwd["direction"] == "fwd" and fwd["status"] == "OK" and fwd["median_ms"] > 0
    assert fwd["check_err"] is not None
    assert bwd["status"] == "ERROR" and "backward failed while timed" in bwd["reason"]


def test_warm_up_runs_until_two_samples_agree():
    from lcab import runtime

    values = iter([9.0, 5.0, 3.0, 2.0, 2.02, 7.0])
    assert runtime.warm_until_steady(lambda: next(values)) == 5  # 2.0 then 2.02
    assert runtime.warm_until_steady(lambda: 1.0) == 2
    drifting = iter(range(1, 1000, 10))
    assert runtime.warm_until_steady(lambda: float(next(drifting))) == runtime.MAX_WARM_SAMPLES


def test_rows_carry_their_spread(tmp_path):
    rows = run(tmp_path, [Case("numpy.reference", workload("causal"))])
    timed = [row for row in rows if row["status"] == "OK"]
    assert {row["direction"] for row in timed} >= {"fwd"}  # the backward may be noise (above)
    for row in timed:
        assert row["spread"] == pytest.approx(row["p80_ms"] / row["p20_ms"])


def test_a_runtime_without_a_reference_leaves_rows_unchecked_and_says_so(tmp_path):
    from lcab.numpy_runtime import NumpyRuntime
    from lcab.runner import Runner
    from lcab.runtime import Runtime

    class Bare(NumpyRuntime):
        full_reference = Runtime.full_reference

    assert NumpyRuntime().has_full_check and not Bare().has_full_check
    runner = Runner(results.Writer(tmp_path / "rows.jsonl"), SETTINGS)
    context = {"notes": "dense"}
    case = Case("numpy.reference", workload("causal"))
    checked, failure = runner._full_check(case, registry.load_backend("numpy.reference"),
                                          Bare(), None, ["fwd"], context)
    assert checked == {} and failure is None
    assert context["notes"] == "dense; no full-size check: the numpy runtime has no reference"


# ----- the backward's time: fwd+bwd minus fwd, published only clear of noise ------------

def timing(*samples, calls=1):
    from lcab.runtime import Timing

    return Timing(tuple(float(s) for s in samples), compile_s=0.5, calls_per_sample=calls)


def test_a_backward_clear_of_the_noise_is_resolved():
    from lcab.runner import backward_gap, backward_timing

    forward, both = timing(1.0, 1.1, 0.9), timing(3.0, 3.2, 2.9)
    gap = backward_gap(forward, both)
    assert gap.resolved and gap.below == 0 and gap.samples == 3
    assert gap.ms == pytest.approx(2.0)
    # MAD 0.1 each: sigma 0.148, median error 1.2533 * 0.148 / sqrt(3) = 0.107 each.
    assert gap.error_ms == pytest.approx(0.1517, rel=1e-3)
    assert backward_timing(forward, both).samples_ms == pytest.approx((2.0, 2.2, 1.9))


@pytest.mark.parametrize("forward, both, says", [
    # The case a busy 2-core host made of torch.sdpa_math at 256 tokens.
    ((91.5, 106.0, 41.8), (84.1, 62.6, 44.0), "noise exceeds the backward"),
    # Median above, but one fwd+bwd sample of five below the forward's median.
    ((10.0, 10.0, 10.0, 10.0, 10.0), (12.0, 12.0, 9.0, 12.0, 12.0),
     "1 fwd+bwd samples at or below the fwd median, more than 10% of them"),
    # Every sample above, but the medians differ by less than 3 standard errors.
    ((10.0, 10.2, 9.8, 10.4, 9.6), (10.5, 10.9, 10.3, 11.5, 10.4), "standard errors"),
])
def test_a_backward_within_the_noise_is_not_resolved(forward, both, says):
    from lcab.runner import backward_gap

    gap = backward_gap(timing(*forward), timing(*both))
    assert not gap.resolved
    assert gap.reason().startswith("not measurable: fwd+bwd median minus fwd median is")
    assert says in gap.reason()


def test_a_few_stray_samples_do_not_void_a_clear_backward():
    """A busy CPU scatters some samples: the case the suite's default run
    met (jax.xla, causal at 256, 104 samples, 9 of them at or below the
    forward's median, the medians 3.4 ms apart) stands, with its median
    and p20 positive; more than a tenth below does not."""
    from lcab.runner import backward_gap, backward_timing

    forward = timing(*([3.9] * 95 + [3.7, 4.1] * 4 + [9.0]))
    both = timing(*([7.3, 7.4, 7.2, 7.5] * 23 + [3.5] * 9 + [7.3, 7.4, 7.2]))
    gap = backward_gap(forward, both)
    assert (gap.samples, gap.below) == (104, 9) and gap.resolved
    backward = backward_timing(forward, both)
    assert backward.median_ms == pytest.approx(3.4, abs=0.1) and backward.p20_ms > 0
    noisier = timing(*([7.3, 7.4, 7.2, 7.5] * 23 + [3.5] * 12))
    assert backward_gap(forward, noisier).below == 12
    assert not backward_gap(forward, noisier).resolved


def test_a_second_measurement_takes_more_samples_within_its_limits():
    from lcab import runner

    # 4x the samples, or a second of sampling when that is more.
    assert runner.remeasure_iters(timing(1.0), timing(3.0), 10) == 250
    assert runner.remeasure_iters(timing(100.0), timing(300.0), 10) == 40
    # At most REMEASURE_MAX_S of sampling: a slow pair gets what fits...
    assert runner.remeasure_iters(timing(1000.0), timing(3000.0), 3) == 5
    # ...and none when no more than it had fits; never above REMEASURE_MAX_ITERS.
    assert runner.remeasure_iters(timing(4000.0), timing(6000.0), 3) is None
    assert runner.remeasure_iters(timing(0.001), timing(0.002), 10) == runner.REMEASURE_MAX_ITERS
    # Batched samples take calls_per_sample calls each.
    assert runner.remeasure_iters(timing(1.0, calls=10), timing(3.0, calls=10), 3) == 25


class ScriptedPairs:
    """NumpyRuntime.measure_pair replaced: the given (fwd, fwd+bwd) sample
    patterns in turn, each repeated to the iters asked for (recorded)."""

    def __init__(self, *pairs):
        self.pairs, self.iters = list(pairs), []

    def __call__(self, fn, inputs, *, warmup, iters, flush_l2):  # set on the class: unbound
        self.iters.append(iters)
        return tuple(timing(*(pattern * iters)[:iters]) for pattern in self.pairs.pop(0))


def test_a_noisy_pair_is_measured_again_with_more_samples(tmp_path, monkeypatch):
    from lcab.numpy_runtime import NumpyRuntime

    scripted = ScriptedPairs(((91.5, 106.0, 41.8), (84.1, 62.6, 44.0)), ((2.0,), (5.0, 5.5)))
    monkeypatch.setattr(NumpyRuntime, "measure_pair", scripted)
    settings = dataclasses.replace(SETTINGS, iters=3)
    fwd, bwd = run(tmp_path, [Case("numpy.reference", workload("causal"))], settings)
    assert scripted.iters == [3, 12]  # 4x the samples: over a second of 154 ms pairs
    assert fwd["status"] == "OK" and fwd["median_ms"] == 2.0 and len(fwd["samples_ms"]) == 12
    assert bwd["status"] == "OK" and bwd["median_ms"] == pytest.approx(3.25)
    assert min(bwd["samples_ms"]) == pytest.approx(3.0) and bwd["p20_ms"] > 0
    assert bwd["compile_s"] == 0.5 and bwd["tflops"] > 0


def test_a_backward_lost_in_noise_stays_not_measurable_and_carries_no_time(tmp_path,
                                                                          monkeypatch):
    from lcab.numpy_runtime import NumpyRuntime

    noisy = ((30.0, 50.0, 40.0), (45.0, 35.0, 38.0))
    scripted = ScriptedPairs(noisy, noisy)
    monkeypatch.setattr(NumpyRuntime, "measure_pair", scripted)
    settings = dataclasses.replace(SETTINGS, iters=3)
    fwd, bwd = run(tmp_path, [Case("numpy.reference", workload("causal"))], settings)
    assert scripted.iters == [3, 13]  # measured again: a second's worth of 78 ms pairs
    assert fwd["status"] == "OK" and fwd["median_ms"] == 40.0
    assert bwd["status"] == "ERROR"
    assert bwd["reason"] == ("not measurable: fwd+bwd median minus fwd median is -2 ms "
                             "± 5.4 ms over 13 samples (noise exceeds the backward)")
    assert all(bwd[c] is None for c in ("median_ms", "p20_ms", "p80_ms", "samples_ms", "tflops"))
    assert bwd["max_err"] is not None and bwd["check_err"] is not None


def test_a_clear_backward_is_measured_once(tmp_path, monkeypatch):
    from lcab.numpy_runtime import NumpyRuntime

    scripted = ScriptedPairs(((1.0, 1.1, 0.9), (3.0, 3.2, 2.9)))
    monkeypatch.setattr(NumpyRuntime, "measure_pair", scripted)
    _, bwd = run(tmp_path, [Case("numpy.reference", workload("causal"))],
                   dataclasses.replace(SETTINGS, iters=3))
    assert scripted.iters == [3]
    assert bwd["status"] == "OK" and bwd["samples_ms"] == pytest.approx([2.0, 2.2, 1.9])


# ----- a workload that is its own probe is not checked twice ------------------------

def counting_full_checks(monkeypatch) -> list:
    from lcab.numpy_runtime import NumpyRuntime

    calls, full_check = [], NumpyRuntime.full_check

    def counted(self, *args, **kwargs):
        calls.append(1)
        return full_check(self, *args, **kwargs)

    monkeypatch.setattr(NumpyRuntime, "full_check", counted)
    return calls


def test_the_probe_of_the_very_workload_is_its_full_size_check(tmp_path, monkeypatch):
    calls = counting_full_checks(monkeypatch)
    rows = run(tmp_path, [Case("numpy.reference", workload("causal"))])  # 256 tokens, 2 kv heads
    assert calls == [] and [status_noise_as_ok(r) for r in rows] == ["OK", "OK"]
    fwd, bwd = rows
    assert fwd["check_heads"] == ("batch 0 of 1; kv 0-1 of 2; q 0-3 of 4 "
                                  "(the probe: float64 reference)")
    assert fwd["check_len"] == 256 and fwd["check_s"] > 0
    assert set(fwd["check_errors"]) == {"out"}
    assert set(bwd["check_errors"]) == {"out", "dq", "dk", "dv"}
    assert fwd["check_err"] == fwd["max_err"] < 1e-6  # the probe's own errors
    assert bwd["check_err"] == max(bwd["check_errors"].values()) < 1e-6


def test_a_workload_beyond_its_probe_still_gets_the_full_size_check(tmp_path, monkeypatch):
    calls = counting_full_checks(monkeypatch)
    rows = run(tmp_path, [Case("numpy.reference", workload("causal", heads=(8, 4)))])
    assert calls == [1] and [status_noise_as_ok(r) for r in rows] == ["OK", "OK"]
    assert rows[0]["check_heads"] == ("batch 0 of 1; kv 0,3 of 4; q 0-1,6-7 of 8; every batch "
                                      "row and head at query rows 0-255")


def test_a_pass_this_machine_lacks_is_unavailable_not_unsupported():
    """A backend whose instance has fewer directions here than elsewhere
    (directions_problem) gets UNAVAILABLE rows for the missing ones, with
    the reason; what it lacks everywhere stays UNSUPPORTED; the dry run
    decides the same."""
    from lcab.experiments.dry_run import attention_claims
    from lcab.runner import claims_of
    from lcab.status import Status

    backend = registry.load_backend("numpy.causal_only", {})
    case = Case("numpy.causal_only", Workload(1, 64, 64, 2, 2, 16, "float32",
                                              small_mask("causal", 64)))
    assert claims_of(case, backend).missing_status is Status.UNSUPPORTED
    backend.directions_problem = "its backward needs a GPU"
    claims = claims_of(case, backend)
    assert claims.missing_status is Status.UNAVAILABLE
    assert claims.missing == (["bwd"], ("numpy.causal_only has no bwd pass here: its "
                                        "backward needs a GPU"))
    assert attention_claims(case, backend)["bwd"][0] == "UNAVAILABLE"
