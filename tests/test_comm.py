"""The comm suite: sizes, bandwidth conventions, the alpha-beta fit, the
collectives' values on JAX host devices, its cases in the shared runner
(statuses, resume, lost rows), and the CLI's rows and table."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lcab import comm, results
from lcab.comm_suite import CollectiveCase, collective_cases
from lcab.numpy_runtime import NumpyRuntime
from lcab.report import comm_table
from lcab.runner import Runner, Settings, fill_missing, run_cases
from lcab.runtime import DeviceInfo
from tests.row_checks import measured_or_noisy


def test_sizes_parse_in_binary_units_and_bad_ones_name_the_form():
    assert comm.parse_bytes("4096") == 4096
    assert comm.parse_bytes("64k") == 64 << 10
    assert comm.parse_bytes("16MiB") == 16 << 20
    assert comm.parse_bytes("1g") == 1 << 30
    for bad in ("", "1.5m", "-4k", "0", "4 tb"):
        with pytest.raises(ValueError, match="bytes such as|must be positive"):
            comm.parse_bytes(bad)


def test_bus_bandwidth_follows_nccl_tests():
    assert comm.bus_factor("ppermute", 4) == 1.0
    assert comm.bus_factor("all_gather", 4) == 0.75
    assert comm.bus_factor("all_to_all", 2) == 0.5
    with pytest.raises(ValueError, match="ppermute, all_gather, all_to_all"):
        comm.bus_factor("reduce_scatter", 2)
    row = comm.comm_row(framework="jax", op="all_gather", nbytes=1 << 30, ranks=4,
                        samples_ms=[9.0, 10.0, 11.0], device="d", versions={},
                        git_commit="c", run_id="r", flags="{}")
    assert list(row) == list(results.COMM_COLUMNS)
    assert row["median_ms"] == 10.0
    assert row["algbw_gbps"] == pytest.approx((1 << 30) / 0.010 / 1e9)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 0.75)


@given(st.sampled_from(comm.COMM_OPS), st.integers(1, 1 << 28), st.integers(2, 16))
def test_rounded_sizes_split_into_whole_elements(op, nbytes, ranks):
    size = comm.rounded_bytes(op, nbytes, ranks)
    assert size <= max(nbytes, 2 * ranks) and size % 2 == 0
    if op != "ppermute":
        assert size % (2 * ranks) == 0


@given(st.floats(0.0, 1e-4), st.floats(1e9, 1e12))
def test_the_fit_recovers_a_known_line(alpha, beta):
    sizes = np.array([4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20], float)
    fit = comm.fit_alpha_beta(sizes, alpha + sizes / beta)
    assert fit.alpha_s == pytest.approx(alpha, abs=1e-9)
    assert fit.beta_bytes_per_s == pytest.approx(beta, rel=1e-6)
    assert fit.seconds(1 << 20) == pytest.approx(alpha + (1 << 20) / beta, rel=1e-6)


def test_the_fit_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError, match="two message sizes"):
        comm.fit_alpha_beta([1024, 1024], [1e-5, 1e-5])
    with pytest.raises(ValueError, match="do not grow"):
        comm.fit_alpha_beta([1024, 1 << 20], [1e-3, 1e-5])


@pytest.mark.parametrize("ranks", [2, 4, 8])
@pytest.mark.parametrize("op", comm.COMM_OPS)
def test_the_jax_collectives_move_the_right_values(op, ranks):
    from jax_backends import comm as jax_comm

    jax_comm.check_result(op, ranks)


def test_the_cli_writes_a_row_per_size_and_a_table(tmp_path):
    command = [sys.executable, "-m", "lcab.experiments", "--suite=comm", "--framework=jax",
               "--comm_ranks=2,4", "--comm_sizes=4k,1m", "--comm_ops=ppermute,all_gather",
               "--iters=3", f"--out={tmp_path}", "--git_commit=test"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "alpha us" in done.stdout and "| ppermute" in done.stdout
    rows = results.read_rows([tmp_path / "comm_jax.jsonl"])
    assert {(r["op"], r["ranks"], r["bytes"]) for r in rows} == {
        (op, ranks, size) for op in ("ppermute", "all_gather") for ranks in (2, 4)
        for size in (4096, 1 << 20)}
    for row in rows:
        # A CPU's collectives can be too quick to tell from its own noise;
        # then the row says so instead of giving a time.
        assert measured_or_noisy(row), row["reason"]
        assert row["device"] == "cpu" and len(row["samples_ms"]) == 3
        assert json.loads(row["flags"])["ranks"] == [2, 4]
    # Comm rows have their own schema: the attention tables leave them out.
    assert results.load([tmp_path]).empty
    table = comm_table(rows)
    assert list(table.index.names) == ["framework", "device", "op", "ranks"]
    assert {"4 KiB", "1 MiB", "alpha us", "beta GB/s"} <= set(table.columns)


def test_bad_comm_flags_fail_at_once_naming_the_choices(tmp_path):
    for flag, message in (("--comm_ops=broadcast", "ppermute, all_gather, all_to_all"),
                          ("--comm_sizes=lots", "bytes such as"),
                          ("--comm_ranks=1", "device count of 2 or more")):
        done = subprocess.run([sys.executable, "-m", "lcab.experiments", "--suite=comm", flag,
                               f"--out={tmp_path}"], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]


def test_more_ranks_than_devices_is_unavailable_not_a_crash(tmp_path):
    writer = results.Writer(tmp_path / "comm_jax.jsonl")
    rows = Runner(writer, Settings(warmup=1, iters=2)).run_case(
        CollectiveCase("jax", "ppermute", 64, (4096,)))
    assert [r["status"] for r in rows] == ["UNAVAILABLE"]
    assert "64 ranks" in rows[0]["reason"]


def test_the_cases_round_sizes_to_whole_pieces_once():
    cases = collective_cases("jax", ["ppermute", "all_to_all"], [4096, 4097, 6002], [2, 4])
    assert [(c.op, c.ranks) for c in cases] == [("ppermute", 2), ("all_to_all", 2),
                                                ("ppermute", 4), ("all_to_all", 4)]
    assert cases[0].sizes == (4096, 6002) and cases[3].sizes == (4096, 6000)


@pytest.fixture
def host_collectives(monkeypatch):
    """The NumPy runtime with 8 devices and made-up collectives: ppermute
    checks out and times (running out of memory at 1 MiB, failing at 4 MiB),
    all_to_all moves the wrong values, all_gather is not offered."""

    def check(self, op, ranks):
        if op == "all_to_all":
            raise AssertionError(f"{op} over {ranks} devices moved the wrong values")
        if op == "all_gather":
            raise NotImplementedError("numpy has no all_gather")

    def time_collective(self, op, nbytes, ranks, *, warmup, iters):
        if nbytes == 1 << 20:
            raise MemoryError("out of memory: 1 MiB")
        if nbytes == 4 << 20:
            raise RuntimeError("link down")
        return [1.0 + i for i in range(iters)], "made up"

    monkeypatch.setattr(NumpyRuntime, "device",
                        lambda self: DeviceInfo(name="cpu", platform="cpu", count=8))
    monkeypatch.setattr(NumpyRuntime, "check_collective", check)
    monkeypatch.setattr(NumpyRuntime, "time_collective", time_collective)


def test_comm_cases_take_the_runners_statuses_and_resume(tmp_path, host_collectives):
    path = tmp_path / "comm_numpy.jsonl"
    cases = collective_cases("numpy", comm.COMM_OPS, [4096, 1 << 20, 4 << 20], [2])
    settings = Settings(warmup=1, iters=3, run_id="a", git_commit="t")
    run_cases(cases, results.Writer(path), settings)
    rows = results.read_rows([path])
    status = {(r["op"], r["bytes"]): r["status"] for r in rows}
    assert status == {
        ("ppermute", 4096): "OK", ("ppermute", 1 << 20): "OOM", ("ppermute", 4 << 20): "ERROR",
        **{("all_gather", n): "UNSUPPORTED" for n in (4096, 1 << 20, 4 << 20)},
        **{("all_to_all", n): "MISMATCH" for n in (4096, 1 << 20, 4 << 20)}}
    reasons = {(r["op"], r["bytes"]): r["reason"] for r in rows}
    assert reasons[("ppermute", 4 << 20)] == "timing: RuntimeError: link down"
    assert "moved the wrong values" in reasons[("all_to_all", 4096)]
    assert all(list(r) == list(results.COMM_COLUMNS) for r in rows)
    # Resume: only the ERROR row is measured again.
    again = dataclasses.replace(settings, run_id="b")
    run_cases(cases, results.Writer(path), again,
              skip=results.done_keys([path], settled_only=True))
    rerun = [r for r in results.read_rows([path]) if r["run_id"] == "b"]
    assert [(r["op"], r["bytes"]) for r in rerun] == [("ppermute", 4 << 20)]


def test_a_dead_comm_process_leaves_error_rows_for_what_it_did_not_write(tmp_path):
    writer = results.Writer(tmp_path / "comm_torch.jsonl")
    cases = collective_cases("torch", ["ppermute"], [4096, 65536], [2, 4])
    assert fill_missing(cases, writer, Settings(), reason="torchrun exited with 1") == 4
    rows = results.read_rows([writer.path])
    assert {(r["ranks"], r["bytes"], r["status"]) for r in rows} == {
        (ranks, n, "ERROR") for ranks in (2, 4) for n in (4096, 65536)}
    assert fill_missing(cases, writer, Settings(), reason="again") == 0


def test_torch_times_the_same_collectives_under_torchrun(tmp_path):
    command = [sys.executable, "-m", "lcab.experiments", "--suite=comm", "--framework=torch",
               "--comm_ranks=2,4", "--comm_sizes=4k,64k", "--iters=3", f"--out={tmp_path}",
               "--git_commit=test"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = results.read_rows([tmp_path / "comm_torch.jsonl"])
    # Each op was checked on known values over 2 and 4 gloo processes first.
    assert {(r["op"], r["ranks"]) for r in rows} == {
        (op, ranks) for op in comm.COMM_OPS for ranks in (2, 4)}
    for row in rows:
        assert measured_or_noisy(row), row["reason"]
        assert row["framework"] == "torch" and row["device"] == "cpu"
        assert "gloo" in row["notes"] or row["status"] != "OK"
    assert "| torch" in done.stdout
