"""Multi-process JAX (jax.distributed) through the CLI, as a multi-host run
starts it: two CPU processes of two devices each meet at a coordinator, a
cp 4 mesh spans both, only process 0 writes rows, and the rows pass the
reference check."""

import os
import socket
import subprocess
import sys

import pytest

from lcab import processes, results
from tests.row_checks import measured_or_noisy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_on_two_processes(out, *flags) -> list[tuple[str, str]]:
    """The CLI with `flags` in two JAX processes of two CPU devices each,
    meeting at a local coordinator; (stdout, stderr) of each, both checked
    for success."""
    port = free_port()
    environment = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    command = [sys.executable, "-m", "lcab.experiments", "--framework=jax", *flags,
               "--masks=causal_document", "--seqlens=256", "--head_dim=16", "--dtype=float32",
               "--cp_size=4", "--dispatch=balanced", f"--out={out}", "--noprogress",
               "--git_commit=t", f"--jax_coordinator=localhost:{port}", "--jax_num_processes=2"]
    running = [subprocess.Popen(command + [f"--jax_process_id={i}"], env=environment,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(2)]
    outputs = [p.communicate(timeout=600) for p in running]
    for process, (_, err) in zip(running, outputs):
        assert process.returncode == 0, err[-3000:]
    return outputs


def assert_checked_cp4_rows(rows) -> None:
    for row in rows:
        # A tiny CPU case's bwd time may be too noisy to subtract from the
        # fwd; its row then says so instead of a time. Its check must pass.
        assert measured_or_noisy(row), row["reason"]
        assert row["max_err"] < 1e-4
        assert row["n_devices"] == 4 and row["cp_size"] == 4


@pytest.mark.slow
def test_two_processes_share_one_cp_mesh_and_write_rows_once(tmp_path):
    outputs = run_on_two_processes(
        tmp_path, "--suite=cp", "--backends=jax.cp_ring,jax.cp_allgather,jax.cp_groupcast",
        "--heads=4:4", "--warmup=1", "--iters=5")
    assert "Context parallel" in outputs[0][0] and "Context parallel" not in outputs[1][0]
    rows = results.read_rows([tmp_path / "cp_jax.jsonl"])
    assert len(rows) == 6  # written by process 0 alone
    assert_checked_cp4_rows(rows)


@pytest.mark.slow
def test_the_attention_module_runs_across_two_processes(tmp_path):
    """jax.module around jax.cp_ring at cp 4 over two processes: each
    process builds the layer's weights from the same seed and places them
    on the shared mesh; the attention inside passes the reference."""
    run_on_two_processes(tmp_path, "--suite=module", "--backends=jax.module",
                         "--backend_options=jax.module:inner=jax.cp_ring", "--heads=4:2",
                         "--warmup=1", "--iters=3")
    rows = results.read_rows([tmp_path / "module_jax.jsonl"])
    assert sorted(row["direction"] for row in rows) == ["bwd", "fwd"]  # process 0 alone
    assert_checked_cp4_rows(rows)
    assert {row["strategy"] for row in rows} == {"ring"}


@pytest.mark.parametrize("flags, message", [
    ((None, 2, 0, False), "needs all of --jax_coordinator"),
    (("h:1", 2, 2, False), "--jax_process_id 2 is not in [0, 2)"),
    (("h:1", None, None, True), "do not also give"),
])
def test_incomplete_jax_process_flags_are_refused(flags, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        processes.jax_setting(*flags)


def test_process_indices_come_from_the_launcher(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", processes.JAX_DISTRIBUTED, "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    assert processes.torchrun_rank() is None and processes.jax_process_index() is None
    monkeypatch.setenv(processes.JAX_DISTRIBUTED, "h:1,4,3")
    assert processes.jax_process_index() == 3
    monkeypatch.setenv(processes.JAX_DISTRIBUTED, "auto")
    monkeypatch.setenv("SLURM_PROCID", "5")
    assert processes.jax_process_index() == 5
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert processes.torchrun_rank() == 1
