"""What a careful (and unlucky) user does to the CLI, and what must follow.

One section per class of failure a hostile test battery found: wrong
numbers published as OK, a failing backward taking the forward with it,
silent partial sweeps, duplicated and stale rows, user errors ending in a
traceback, Ctrl-C, and smaller edges. Each test runs the CLI (or the
runner) with plugin backends that fail on purpose (tests/fake_backends.py).
Damaged result files have tests of their own (tests/test_damaged_results.py).
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from lcab import results
from lcab.masks import make_mask
from lcab.report import tables
from lcab.runner import Case, Runner, Settings, run_cases
from lcab.runtime import Timing
from lcab.validation import Verdict
from lcab.workloads import Workload
from tests.row_checks import measured_or_noisy

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLUGIN = "--backend_modules=tests.fake_backends"
# Forward only where the backward adds nothing: a tiny CPU backward time can
# drown in noise ("not measurable", an ERROR that --resume measures again).
SMALL = ("--heads=2:1", "--head_dim=8", "--warmup=0", "--iters=2", "--masks=causal",
         "--directions=fwd")


def command(*args) -> list[str]:
    return [sys.executable, "-m", "lcab.experiments", "--noprogress", PLUGIN, *args]


def cli(*args, env=None, timeout=300):
    return subprocess.run(command(*args), capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                **(env or {})})


def _default_ctrl_c():
    # A shell's background job ignores SIGINT, and a child would inherit
    # that: the command under test must see Ctrl-C as a terminal sends it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args, **popen):
    return subprocess.Popen(command(*args), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_ctrl_c,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, **popen)


def statuses(path) -> dict[tuple, str]:
    """{(backend, seqlen, direction): status} of the rows in `path`."""
    return {(r["backend"], r["seqlen"], r["direction"]): r["status"]
            for r in results.read_rows([path])}


def wait_for_rows(path: pathlib.Path, count: int, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and len(results.read_rows([path])) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {count} rows")


def processes_naming(text: str) -> list[int]:
    """Live (not zombie) processes whose command line contains `text` (Linux /proc)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command_line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError, ValueError):
            continue  # not a process, or gone meanwhile
        if text in command_line and state != "Z":
            found.append(int(entry.name))
    return found


# ----- 1. wrong numbers published as OK ----------------------------------------------

@pytest.mark.parametrize("isolate", [False, True], ids=["in_process", "isolated"])
@pytest.mark.parametrize("backend, shape", [
    ("numpy.nan_beyond_probe", ("--seqlens=1536", "--heads=2:1", "--batch=1")),
    ("numpy.wrong_batch_row", ("--seqlens=64", "--heads=2:1", "--batch=4")),
    ("numpy.wrong_middle_heads", ("--seqlens=64", "--heads=16:8", "--batch=1")),
])
def test_a_fault_only_at_the_timed_size_batch_or_heads_is_a_mismatch(
        tmp_path, backend, shape, isolate):
    # Each passes the small probe (at most 2 batch rows, 2 K/V heads, a
    # short length) and fails where it is timed.
    run = cli(f"--backends={backend},numpy.reference", "--masks=causal", "--head_dim=8",
              "--warmup=0", "--iters=2", *shape, f"--out={tmp_path}",
              *(["--isolate"] if isolate else []))
    assert run.returncode == 0, run.stderr
    rows = results.read_rows([tmp_path / "kernel_numpy.jsonl"])
    wrong = [r for r in rows if r["backend"] == backend]
    assert len(rows) == 4 and {r["status"] for r in wrong} == {"MISMATCH"}, [
        r["reason"] for r in rows]
    assert all(measured_or_noisy(r) for r in rows if r["backend"] == "numpy.reference")
    assert all(r["median_ms"] is None and r["tflops"] is None for r in wrong)
    assert all("full-size check" in r["reason"] for r in wrong)


def test_a_non_finite_output_at_the_timed_size_is_never_ok_even_unchecked(tmp_path):
    run = cli("--backends=numpy.nan_beyond_probe", "--masks=causal", "--seqlens=1536",
              "--heads=2:1", "--head_dim=8", "--warmup=0", "--iters=2", "--nofull_check",
              f"--out={tmp_path}")
    assert run.returncode == 0, run.stderr
    rows = results.read_rows([tmp_path / "kernel_numpy.jsonl"])
    assert {r["status"] for r in rows} == {"MISMATCH"}
    assert all("non-finite" in r["reason"] and r["median_ms"] is None for r in rows)


# ----- 2. a failing backward poisons the forward -----------------------------------

@pytest.mark.parametrize("backend, status", [("numpy.backward_raises", "ERROR"),
                                             ("numpy.backward_oom", "OOM")])
def test_a_backward_that_fails_leaves_the_forward_measured(tmp_path, backend, status):
    run = cli(f"--backends={backend}", *SMALL, "--directions=fwd,bwd", "--seqlens=64",
              f"--out={tmp_path}")
    assert run.returncode == 0, run.stderr
    rows = {r["direction"]: r for r in results.read_rows([tmp_path / "kernel_numpy.jsonl"])}
    assert rows["fwd"]["status"] == "OK" and rows["fwd"]["median_ms"] > 0
    assert rows["fwd"]["check_err"] is not None
    assert rows["bwd"]["status"] == status and "backward" in rows["bwd"]["reason"]


# ----- 3. silent partial sweeps ----------------------------------------------------

def test_sys_exit_in_a_case_costs_that_case_only(tmp_path):
    run = cli("--backends=numpy.sys_exit", *SMALL, "--seqlens=64,96,128", f"--out={tmp_path}")
    assert run.returncode == 0, run.stderr
    found = statuses(tmp_path / "kernel_numpy.jsonl")
    assert len(found) == 3
    assert {s for (_, n, _), s in found.items() if n == 96} == {"ERROR"}
    assert {s for (_, n, _), s in found.items() if n != 96} == {"OK"}
    reasons = [r["reason"] for r in results.read_rows([tmp_path / "kernel_numpy.jsonl"])]
    assert any("SystemExit" in reason for reason in reasons)


def test_a_framework_process_that_ends_early_leaves_error_rows_and_fails(tmp_path):
    run = cli("--backends=numpy.os_exit", *SMALL, "--seqlens=64,96,128", f"--out={tmp_path}")
    assert run.returncode == 1
    found = statuses(tmp_path / "kernel_numpy.jsonl")
    assert len(found) == 3  # every case has its row: measured, or ERROR
    assert {s for (_, n, _), s in found.items() if n == 64} == {"OK"}
    assert {s for (_, n, _), s in found.items() if n != 64} == {"ERROR"}
    assert "without 2 of its rows" in run.stderr
    assert "ERR" in run.stdout  # the summary shows the loss


def test_isolated_an_early_end_is_one_error_case(tmp_path):
    run = cli("--backends=numpy.os_exit", *SMALL, "--seqlens=64,96,128", "--isolate",
              f"--out={tmp_path}")
    assert run.returncode == 0, run.stderr
    found = statuses(tmp_path / "kernel_numpy.jsonl")
    assert {s for (_, n, _), s in found.items() if n == 96} == {"ERROR"}
    assert {s for (_, n, _), s in found.items() if n != 96} == {"OK"}


# ----- 4. duplicated and stale rows ------------------------------------------------

def test_values_listed_twice_are_measured_once(tmp_path):
    run = cli("--backends=numpy.reference,numpy.reference", "--masks=causal,causal",
              "--seqlens=1k,1024,1k", "--heads=2:1", "--head_dim=8", "--warmup=0",
              "--iters=1", "--directions=fwd,fwd", f"--out={tmp_path}")
    assert run.returncode == 0, run.stderr
    rows = results.read_rows([tmp_path / "kernel_numpy.jsonl"])
    assert len(rows) == 1 and rows[0]["seqlen"] == 1024


def test_a_rerun_that_dies_shows_its_loss_not_the_older_rows(tmp_path):
    first = cli("--backends=numpy.os_exit", *SMALL, "--seqlens=64", f"--out={tmp_path}")
    assert first.returncode == 0, first.stderr
    second = cli("--backends=numpy.os_exit", *SMALL, "--seqlens=64", f"--out={tmp_path}",
                 env={"LCAB_TEST_OS_EXIT": "1"})
    assert second.returncode == 1
    rows = results.read_rows([tmp_path / "kernel_numpy.jsonl"])
    old, new = rows[:1], rows[1:]
    assert {r["status"] for r in old} == {"OK"} and {r["status"] for r in new} == {"ERROR"}
    assert len({r["run_id"] for r in old}) == 1 and len({r["run_id"] for r in new}) == 1
    assert old[0]["run_id"] != new[0]["run_id"]
    # The report of the folder shows the newer run's failure, not the older number.
    report = subprocess.run([sys.executable, "-m", "lcab.report", f"--results={tmp_path}",
                             "--summary"], capture_output=True, text=True, cwd=ROOT)
    assert report.returncode == 0, report.stderr
    assert "ERR" in report.stdout
    old_figure = tables.format_cell("OK", old[0]["tflops"])
    assert old_figure not in report.stdout and "nan" not in report.stdout


def test_children_die_with_the_command_and_resume_repeats_nothing(tmp_path):
    path = tmp_path / "kernel_numpy.jsonl"
    args = ("--backends=numpy.slow", *SMALL, "--seqlens=64,80,96,112,128", f"--out={tmp_path}")
    process = start(*args)
    wait_for_rows(path, 2)
    process.kill()  # the command alone, not its process group
    process.wait()
    deadline = time.time() + 10
    while processes_naming(str(tmp_path)) and time.time() < deadline:
        time.sleep(0.1)
    assert not processes_naming(str(tmp_path)), "an orphan outlived the command"
    resumed = cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    rows = results.read_rows([path])
    keys = [results.row_key(r) for r in rows]
    assert len(keys) == len(set(keys)) == 5


def test_a_second_run_into_the_same_folder_is_refused(tmp_path):
    path = tmp_path / "kernel_numpy.jsonl"
    first = start("--backends=numpy.slow", *SMALL, "--seqlens=64,80,96,112",
                  f"--out={tmp_path}")
    try:
        wait_for_rows(path, 1)
        second = cli("--backends=numpy.reference", *SMALL, "--seqlens=64", "--resume",
                     f"--out={tmp_path}")
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 1
    assert "is in use by lcab.experiments run" in second.stderr
    assert "Traceback" not in second.stderr
    assert "numpy.reference" not in {r["backend"] for r in results.read_rows([path])}


# ----- 5. user errors end with a message, at once ---------------------------------

def _bad_command_lines(tmp_path: pathlib.Path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    return [
        (f"--out={a_file}", "--out", "exists and is not a folder"),
        (f"--out={a_file}/below", "--out", "cannot write there"),
        ("--out=/proc/lcab_no_such_folder/out", "--out", "cannot write there"),
        ("--out=", "--out", "empty"),
        (f"--golden_dir={a_file}", "--golden_dir", "exists and is not a folder"),
        (f"--profile_dir={a_file}", "--profile_dir", "exists and is not a folder"),
        ("--mask_seed=-1", "mask_seed", "0"),
        ("--seed=-1", "seed", "0"),
        ("--seed=100000000000000000000", "seed", ""),
        ("--seqlens=1e17", "seqlens", "positive size"),
        ("--seqlens=100000000000000000", "seqlens", "over 16m"),
        ("--seqlens=", "seqlens", "empty"),
        ("--masks=", "masks", "empty"),
        ("--directions=", "directions", "empty"),
        ("--backends=", "backends", "empty"),
        ("--suite=cp", "--backends numpy.reference (kernel) not of --suite=cp", "jax.cp_ring"),
        ("--framework=nope", "--framework 'nope'", "numpy"),
    ]


def test_every_bad_command_line_fails_at_once_naming_the_flag(tmp_path):
    for bad, flag, allowed in _bad_command_lines(tmp_path):
        out = tmp_path / "out"
        args = [a for a in ("--backends=numpy.reference", "--masks=causal", "--seqlens=64",
                            "--heads=2:1", "--head_dim=8", "--iters=1", f"--out={out}")
                if a.split("=")[0] != bad.split("=")[0]]
        run = cli(*args, bad, timeout=60)
        assert run.returncode != 0, bad
        assert "Traceback" not in run.stderr, (bad, run.stderr)
        assert flag in run.stderr and allowed in run.stderr, (bad, run.stderr)
        assert not list(tmp_path.rglob("*.jsonl")), bad  # nothing ran


# ----- 6. Ctrl-C --------------------------------------------------------------------

@pytest.mark.parametrize("isolate", [False, True], ids=["in_process", "isolated"])
def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tmp_path, isolate):
    path = tmp_path / "kernel_numpy.jsonl"
    process = start("--backends=numpy.slow", *SMALL, "--seqlens=64,80,96,112,128",
                    f"--out={tmp_path}", *(["--isolate"] if isolate else []),
                    start_new_session=True)
    wait_for_rows(path, 2)
    os.killpg(process.pid, signal.SIGINT)  # as a terminal does: the whole group
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "Traceback" not in out
    written = len(results.read_rows([path]))
    assert f"{written} rows of this run are in {path}" in err
    assert "--resume" in err
    assert not processes_naming(str(tmp_path))


def test_sigterm_to_the_command_stops_its_children_too(tmp_path):
    path = tmp_path / "kernel_numpy.jsonl"
    process = start("--backends=numpy.slow", *SMALL, "--seqlens=64,80,96,112,128",
                    f"--out={tmp_path}")
    wait_for_rows(path, 2)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "stopped by SIGTERM" in err
    time.sleep(0.5)
    count = len(results.read_rows([path]))
    time.sleep(1.5)
    assert len(results.read_rows([path])) == count  # nothing writes on
    assert not processes_naming(str(tmp_path))


# ----- 8. smaller edges -------------------------------------------------------------

def test_an_unmeasurable_backward_carries_no_time(tmp_path):
    workload = Workload(1, 64, 64, 2, 1, 8, "float32", make_mask("causal", 64))
    case = Case("numpy.reference", workload)
    runner = Runner(results.Writer(tmp_path / "rows.jsonl"), Settings())
    verdict = Verdict(0.0, 0.0, 0.04, "probe")
    context = {"flops_of": {"bwd": 1.0}, "cp_size": 1}
    row = runner._measured(case, "bwd", Timing((-41.2, -40.0, -42.0)), verdict, context)
    assert row["status"] == "ERROR" and row["reason"].startswith("not measurable")
    assert all(row[c] is None for c in ("median_ms", "p20_ms", "p80_ms", "samples_ms",
                                        "tflops"))
    assert "-41.2 ms" in row["reason"]
    stored, = results.read_rows([tmp_path / "rows.jsonl"])
    assert json.dumps(stored).count("-41") == 1  # only in the reason


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_in_each_framework_a_fault_the_probe_cannot_see_is_a_mismatch(tmp_path, framework):
    import tests.framework_faults as faults

    reference = {"jax": "jax.xla", "torch": "torch.sdpa_math"}[framework]
    shapes = {  # the fault's name -> (batch, seqlen, heads_q, heads_kv)
        "nan_beyond_probe": (1, 1536, 2, 1),
        "wrong_batch_row": (4, 64, 2, 1),
        "wrong_middle_heads": (1, 64, 16, 8),
    }
    cases = []
    for fault, (batch, seqlen, heads_q, heads_kv) in shapes.items():
        workload = Workload(batch, seqlen, seqlen, heads_q, heads_kv, 8, "float32",
                            make_mask("causal", seqlen))
        cases += [Case(f"{framework}.fault_{fault}", workload),
                  Case(reference, workload)]
    assert {f.name for f in faults.FAULTS} >= {case.backend for case in cases[::2]}
    path = tmp_path / "rows.jsonl"
    run_cases(cases, results.Writer(path), Settings(warmup=0, iters=2))
    found = {}
    for row in results.read_rows([path]):
        found.setdefault(row["backend"], set()).add(row["status"])
    for case in cases[::2]:
        assert found[case.backend] == {"MISMATCH"}, case.backend
    assert all(measured_or_noisy(r) for r in results.read_rows([path]) if r["backend"] == reference)
