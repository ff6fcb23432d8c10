"""The comm suite: sizes, bandwidth conventions, the alpha-beta fit, the
collectives' values on JAX host devices, and the CLI's rows and table."""

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lcab import comm, results
from lcab.report import comm_table


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
        assert row["status"] == "OK" or "not measurable" in row["reason"], row["reason"]
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


def test_more_ranks_than_devices_is_unavailable_not_a_crash():
    from lcab.comm_suite import CommSweep, run_comm

    rows = []
    run_comm("jax", CommSweep(ops=("ppermute",), sizes=(4096,), ranks=(64,), warmup=1, iters=2),
             rows.append, git_commit="t", run_id="r", flags="{}")
    assert [r["status"] for r in rows] == ["UNAVAILABLE"]
    assert "64 ranks" in rows[0]["reason"]


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
        assert row["status"] == "OK" or "not measurable" in row["reason"], row["reason"]
        assert row["framework"] == "torch" and row["device"] == "cpu"
        assert "gloo" in row["notes"] or row["status"] != "OK"
    assert "| torch" in done.stdout
