"""lcab.gpu_poll: the clocks a case's samples ran at, from a stand-in nvidia-smi."""

import os
import pathlib
import stat
import subprocess
import sys
import time

import pytest

import tests.fake_backends  # noqa: F401 - registers the numpy.* test backends
from lcab import gpu_poll, results
from lcab.gpu_poll import GpuPoll, parse_line, summarise, visible_gpus
from lcab.runner import Case
from tests.test_runner import SETTINGS, run, workload

# What `nvidia-smi --query-gpu=<FIELDS> --format=csv,noheader,nounits` prints.
BUSY = "0, 100, 1755, 1980, 690.52, 700.00, 61"
IDLE = "0, 0, 1980, 1980, 120.00, 700.00, 40"


def fake_nvidia_smi(folder, lines, record=None):
    """An executable `nvidia-smi` in folder printing `lines` every --loop-ms
    until killed; with record, it first writes its argv there."""
    script = folder / "nvidia-smi"
    script.write_text(f"""#!{sys.executable}
import sys, time
if {str(record)!r} != "None":
    open({str(record)!r}, "w").write(" ".join(sys.argv[1:]))
loop = [a for a in sys.argv if a.startswith("--loop-ms=")]
period = int(loop[0].split("=")[1]) / 1000 if loop else None
while True:
    for line in {lines!r}:
        print(line, flush=True)
        if period is None:
            sys.exit(0)
        time.sleep(period)
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_a_poll_line_is_read_field_by_field():
    assert parse_line(BUSY) == {"index": 0, "utilization.gpu": 100, "clocks.sm": 1755,
                                "clocks.max.sm": 1980, "power.draw": 690.52,
                                "power.limit": 700, "temperature.gpu": 61}
    # A field the card does not report is left out, the rest kept.
    assert parse_line("1, 97, 1600, 1980, [N/A], 700.00, 70") == {
        "index": 1, "utilization.gpu": 97, "clocks.sm": 1600, "clocks.max.sm": 1980,
        "power.limit": 700, "temperature.gpu": 70}
    for not_a_poll in ("Field \"clocks.foo\" is not a valid field to query.", "",
                       "[N/A], 100, 1755, 1980, 690.52, 700.00, 61"):
        assert parse_line(not_a_poll) is None


def test_the_summary_is_over_the_busy_polls_of_every_gpu():
    polls = [parse_line(line) for line in (
        BUSY, IDLE, "1, 99, 1650, 1980, 700.00, 700.00, 66", "0, 100, 1800, 1980, 650.00, 700.00, 58")]
    assert summarise(polls) == {
        "polls": 3, "idle_polls": 1, "gpus": 2, "sm_mhz": 1755.0, "sm_mhz_min": 1650.0,
        "sm_mhz_max": 1980.0, "power_w": 690.5, "power_limit_w": 700.0, "temp_c_max": 66.0}
    # Compiling and warming up alone (idle polls), or no polls: no clocks.
    assert summarise([parse_line(IDLE)] * 5) is None
    assert summarise([]) is None


def test_the_polled_gpus_are_the_visible_ones():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == "2,3"
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": " 0 "}) == "0"
    # UUIDs, an empty list or none set: nvidia-smi polls every GPU.
    for environ in ({"CUDA_VISIBLE_DEVICES": "GPU-8624"}, {"CUDA_VISIBLE_DEVICES": ""}, {}):
        assert visible_gpus(environ) is None


def test_a_block_is_polled_until_it_ends(tmp_path):
    argv = tmp_path / "argv"
    script = fake_nvidia_smi(tmp_path, [IDLE, BUSY, BUSY], record=argv)
    with GpuPoll(str(script), environ={"CUDA_VISIBLE_DEVICES": "1"}) as poll:
        deadline = time.monotonic() + 20
        while (poll.summary() or {}).get("polls", 0) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    summary = poll.summary()
    assert summary["polls"] >= 4 and summary["idle_polls"] >= 1
    assert (summary["sm_mhz"], summary["power_w"], summary["temp_c_max"]) == (1755.0, 690.5, 61.0)
    assert argv.read_text().split() == [
        f"--query-gpu={','.join(gpu_poll.FIELDS)}", "--format=csv,noheader,nounits",
        f"--loop-ms={gpu_poll.POLL_MS}", "--id=1"]
    # The poller is gone once the block ends: no more polls arrive.
    time.sleep(0.2)
    assert poll.summary() == summary


def test_without_nvidia_smi_there_are_no_clocks(tmp_path):
    with GpuPoll(str(tmp_path / "nvidia-smi")) as poll:
        pass
    assert poll.summary() is None
    # One that fails (an unknown field, a driver mismatch) says nothing useful.
    failing = fake_nvidia_smi(tmp_path, ["Failed to initialize NVML: Driver/library mismatch"])
    with GpuPoll(str(failing)) as poll:
        time.sleep(0.2)
    assert poll.summary() is None


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to see the poller end")
def test_the_poller_dies_with_a_killed_parent(tmp_path):
    # A process killed inside the block (SIGKILL, no __exit__) leaves no
    # nvidia-smi behind polling forever: its next write finds the pipe closed.
    pid_file = tmp_path / "pid"
    script = fake_nvidia_smi(tmp_path, [BUSY])
    parent = subprocess.run([sys.executable, "-c", f"""
import os, sys, time
sys.path.insert(0, {str(pathlib.Path(gpu_poll.__file__).parents[1])!r})
from lcab.gpu_poll import GpuPoll
poll = GpuPoll({str(script)!r}).__enter__()
while not poll._polls:
    time.sleep(0.01)
open({str(pid_file)!r}, "w").write(str(poll._process.pid))
os.kill(os.getpid(), 9)
"""], check=False, timeout=60)
    assert parent.returncode == -9
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie, dead but not yet reaped by init, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


class PatientPoll(GpuPoll):
    """GpuPoll that lets the stand-in answer once before the block ends: a
    case of the numpy test backends is timed in milliseconds, less than a
    process takes to start (a real nvidia-smi polls long GPU runs)."""

    def __exit__(self, *exc):
        deadline = time.monotonic() + 20
        while self._process is not None and not self._polls and time.monotonic() < deadline:
            time.sleep(0.02)
        super().__exit__(*exc)


@pytest.mark.parametrize("with_nvidia_smi", [True, False])
def test_timed_rows_carry_the_clocks_they_ran_at(tmp_path, monkeypatch, with_nvidia_smi):
    if with_nvidia_smi:
        fake_nvidia_smi(tmp_path, [BUSY])
    monkeypatch.setenv("PATH", str(tmp_path))  # no other nvidia-smi
    monkeypatch.setattr("lcab.runner.GpuPoll", PatientPoll)
    rows = run(tmp_path, [Case("numpy.reference", workload("causal"), ("fwd",))], SETTINGS)
    assert [r["status"] for r in rows] == ["OK"]
    clocks = rows[0]["clocks"]
    if with_nvidia_smi:
        assert clocks["sm_mhz"] == 1755.0 and clocks["polls"] >= 1
        assert results.row_problem(rows[0]) is None
    else:
        assert clocks is None
