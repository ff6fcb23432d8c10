"""Golden data (--golden_dir): the first run of a workload keeps its inputs
and results in an orbax store; later runs -- other kernels, CP strategies,
the other framework -- run on the same inputs and report golden_err."""

import subprocess
import sys

import numpy as np
import pytest

from lcab import golden
from lcab import results
from lcab.masks import small_mask
from lcab.runner import Case, Settings, run_cases
from lcab.workloads import Workload
from tests.row_checks import measured_or_noisy


def run(backend, workload, directory, path):
    settings = Settings(warmup=1, iters=5, git_commit="t", golden_dir=str(directory))
    run_cases([Case(backend, workload)], results.Writer(path), settings)
    return results.read_rows([path])


def test_errors_are_normalised_and_non_finite_results_are_infinite():
    want = {"out": np.array([[1.0, -2.0], [0.5, 4.0]])}
    assert golden.normalised_error({"out": want["out"]}, want) == 0.0
    assert golden.normalised_error({"out": want["out"] + 0.4}, want) == pytest.approx(0.1)
    assert golden.normalised_error({"out": np.full((2, 2), np.nan)}, want) == float("inf")
    with pytest.raises(ValueError, match="golden shape"):
        golden.normalised_error({"out": np.zeros(3)}, want)


def test_jax_saves_and_torch_compares_on_the_same_inputs_in_its_own_layout(tmp_path):
    # jax.xla is (b, s, h, d); torch.sdpa_math is (b, h, s, d): the store
    # keeps one layout, and each side runs on the saved inputs.
    workload = Workload(1, 128, 128, 4, 2, 16, "float32", small_mask("causal_document", 128))
    first = run("jax.xla", workload, tmp_path / "golden", tmp_path / "jax.jsonl")
    assert [r["golden_err"] for r in first] == [None, None]
    assert all(r["notes"].endswith("saved as golden data") for r in first)
    second = run("torch.sdpa_math", workload, tmp_path / "golden", tmp_path / "torch.jsonl")
    # The point is golden_err; a tiny CPU case's bwd time may be too noisy
    # to subtract, which its row says instead of a time.
    assert all(measured_or_noisy(r) for r in second)
    assert all(r["golden_err"] < 1e-5 for r in second)


def test_a_run_that_differs_from_the_golden_results_is_a_mismatch_without_a_time(tmp_path):
    # One case's golden check covers out, dq, dk and dv together, so both of
    # its rows say MISMATCH when any of them differs.
    workload = Workload(1, 128, 128, 2, 2, 16, "float32", small_mask("causal", 128))
    run("torch.sdpa_math", workload, tmp_path / "golden", tmp_path / "a.jsonl")
    key = golden.golden_key(f"{workload.key()}/seed0", True)
    stored = golden.restore_numpy(tmp_path / "golden", key)
    stored["results"]["dq"] = stored["results"]["dq"] * 1.5
    golden.save(tmp_path / "tampered", key, stored["inputs"], stored["results"])
    rows = run("jax.xla", workload, tmp_path / "tampered", tmp_path / "b.jsonl")
    for row in rows:
        assert row["status"] == "MISMATCH" and row["median_ms"] is None
        assert row["golden_err"] == pytest.approx(1 / 3, rel=1e-3)  # 0.5 dq over 1.5 dq
        assert "differs from the golden data" in row["reason"]


@pytest.mark.slow
def test_a_torch_cp_run_is_checked_against_a_single_device_jax_run(tmp_path):
    store = tmp_path / "golden"
    shared = [sys.executable, "-m", "lcab.experiments", "--seqlens=512", "--heads=4:2",
              "--head_dim=32", "--dtype=float32", "--masks=causal_document", "--warmup=1",
              "--iters=3", f"--golden_dir={store}", f"--out={tmp_path}", "--noprogress",
              "--nosummary", "--git_commit=t"]
    single = shared + ["--framework=jax", "--backends=jax.pallas_flex"]
    cp = shared + ["--framework=torch", "--suite=cp", "--cp_size=2",
                   "--backends=torch.cp_allgather",
                   "--backend_options=torch.cp_allgather:inner=torch.sdpa_math"]
    for command in (single, cp):
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    saved = results.read_rows([tmp_path / "kernel_jax.jsonl"])
    assert all(row["notes"].endswith("saved as golden data") for row in saved)
    rows = results.read_rows([tmp_path / "cp_torch.jsonl"])
    assert len(rows) == 2
    for row in rows:
        assert row["golden_err"] is not None and row["golden_err"] < 1e-5, row["notes"]
