"""--dry_run says what a sweep would run and skip, and why, and runs nothing."""

import os
import pathlib
import subprocess
import sys

from lcab.experiments import dry_run, launch
from lcab.masks import make_mask
from lcab.runner import Case, Settings
from lcab.workloads import Workload

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLUGIN = "--backend_modules=tests.fake_backends"
SMALL = ("--heads=2:1", "--head_dim=8", "--warmup=0", "--iters=1", "--nofull_check")


def cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "lcab.experiments", "--noprogress", PLUGIN, *SMALL, *args],
        capture_output=True, text=True, cwd=ROOT, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)})


def planned(stdout: str) -> list[tuple[str, ...]]:
    """(backend, mask, seqlen, direction, decision) of each row the dry run lists."""
    return [tuple(line.split(None, 5)[:5]) for line in stdout.splitlines()
            if line.strip().startswith("numpy.")]


def test_a_dry_run_lists_every_row_and_why_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    run = cli("--backends=numpy.reference,numpy.causal_only,numpy.missing",
              "--masks=causal,full", "--seqlens=64,4k", "--directions=fwd,bwd", "--dry_run",
              f"--out={out}")
    assert run.returncode == 0, run.stderr
    rows = planned(run.stdout)
    expected = []
    for mask in ("causal", "full"):
        for seqlen in ("64", "4k"):
            fits = seqlen == "64"  # the dense reference stops at 2048 tokens
            expected += [
                ("numpy.reference", mask, seqlen, "fwd", "run" if fits else "UNSUPPORTED"),
                ("numpy.reference", mask, seqlen, "bwd", "run" if fits else "UNSUPPORTED"),
                ("numpy.causal_only", mask, seqlen, "fwd",
                 "run" if mask == "causal" else "UNSUPPORTED"),
                ("numpy.causal_only", mask, seqlen, "bwd", "UNSUPPORTED"),  # no backward
                ("numpy.missing", mask, seqlen, "fwd", "UNAVAILABLE"),
                ("numpy.missing", mask, seqlen, "bwd", "UNAVAILABLE"),
            ]
    assert rows == expected
    assert "numpy.causal_only has no bwd pass" in run.stdout
    assert "only the causal mask" in run.stdout
    assert "dense reference limited to 2048 x 2048" in run.stdout
    assert "cannot import a_package_that_is_not_installed" in run.stdout
    assert "In all: 6 run, 10 UNSUPPORTED, 8 UNAVAILABLE." in run.stdout
    assert not out.exists()  # no rows, no lock, not even the folder


def test_without_backends_a_dry_run_names_those_left_out(tmp_path):
    run = cli("--framework=numpy", "--masks=causal", "--seqlens=64", "--directions=fwd",
              "--dry_run", f"--out={tmp_path}")
    assert run.returncode == 0, run.stderr
    assert "left out (no rows): numpy.missing: cannot import a_package_that_is_not_installed" \
        in run.stdout
    assert "left out (no rows): numpy.raises_at_start: numpy.raises_at_start failed to start" \
        in run.stdout
    backends = {row[0] for row in planned(run.stdout)}
    assert "numpy.reference" in backends and "numpy.missing" not in backends
    assert ("numpy.raises_in_supports", "causal", "64", "fwd", "ERROR") in planned(run.stdout)
    assert not list(tmp_path.iterdir())


def test_record_unavailable_gives_rows_to_those_it_would_leave_out(tmp_path):
    """--record_unavailable (the canonical sweeps): a backend of the default
    sweep that cannot run here gets UNAVAILABLE rows saying why."""
    run = cli("--framework=numpy", "--masks=causal", "--seqlens=64", "--directions=fwd",
              "--record_unavailable", "--dry_run", f"--out={tmp_path}")
    assert run.returncode == 0, run.stderr
    assert "left out (no rows): numpy.missing" not in run.stdout
    planned_rows = planned(run.stdout)
    assert ("numpy.missing", "causal", "64", "fwd", "UNAVAILABLE") in planned_rows
    assert ("numpy.reference", "causal", "64", "fwd", "run") in planned_rows
    assert not list(tmp_path.iterdir())


def test_under_resume_a_dry_run_marks_the_rows_already_there(tmp_path):
    sweep = ("--backends=numpy.reference", "--masks=causal", "--directions=fwd",
             f"--out={tmp_path}")
    first = cli(*sweep, "--seqlens=64")
    assert first.returncode == 0, first.stderr
    path = tmp_path / "kernel_numpy.jsonl"
    before = path.read_text()
    run = cli(*sweep, "--seqlens=64,96", "--resume", "--dry_run")
    assert run.returncode == 0, run.stderr
    assert planned(run.stdout) == [("numpy.reference", "causal", "64", "fwd", "done"),
                                   ("numpy.reference", "causal", "96", "fwd", "run")]
    assert path.read_text() == before


def test_a_per_rank_job_is_left_to_its_ranks():
    # Nothing is loaded for it, so this names torch without importing it.
    workload = Workload(1, 64, 64, 2, 1, 8, "float32", make_mask("causal", 64))
    job = launch.Job("torch", "cp", pathlib.Path("nowhere/cp_torch.jsonl"),
                     (Case("torch.cp_ring_flex", workload, ("fwd",), "cp"),), Settings(),
                     ranks=2)
    text = dry_run.text([job], resume=False)
    assert "torch.cp_ring_flex  causal  64      fwd        at run time" in text
    assert "torchrun runs this job (2 ranks)" in text


def test_claims_follow_the_runners_order():
    from tests import fake_backends

    workload = Workload(1, 64, 64, 2, 1, 8, "float32", make_mask("causal", 64))
    case = Case("numpy.causal_forward_only", workload)
    claims = dry_run.attention_claims(case, fake_backends.CausalForwardOnlyBackend())
    assert claims == {"fwd": ("run", "is_causal"),
                      "bwd": ("UNSUPPORTED", "numpy.causal_forward_only runs causal fwd only")}
