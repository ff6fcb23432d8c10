"""The GPUs' clocks, power and temperature while a case's samples run.

A Hopper card at its power limit lowers its SM clock, and how far depends
on what ran just before: the same forward kernel read 5-13 % faster when
its samples alternated with a slower backward
(results/gpu/2026-12-02-h200-one-pass/). A row that carries the clock it
ran at tells such a shift from a kernel change. nvidia-smi polls in a
child process (no framework, no extra package); without it, or when it
fails, rows carry no clocks and nothing else changes.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
from typing import Self

# Fields every nvidia-smi since long before Hopper knows; one unknown field
# fails the whole query.
FIELDS = ("index", "utilization.gpu", "clocks.sm", "clocks.max.sm", "power.draw", "power.limit",
          "temperature.gpu")
POLL_MS = 20
# A poll counts when a kernel ran for at least this share of nvidia-smi's
# last sample period: the polled block also compiles and warms up, when the
# GPU idles at other clocks.
BUSY_PERCENT = 50


def visible_gpus(environ=os.environ) -> str | None:
    """nvidia-smi's -i for CUDA_VISIBLE_DEVICES when it lists indices (None: all)."""
    value = environ.get("CUDA_VISIBLE_DEVICES", "").replace(" ", "")
    ids = value.split(",") if value else []
    return ",".join(ids) if ids and all(i.isdigit() for i in ids) else None


def parse_line(line: str) -> dict[str, float] | None:
    """One poll of one GPU ({field: value}, [N/A] fields left out), or None
    for a line that is not one (an error, a header)."""
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(FIELDS):
        return None
    poll = {}
    for field, value in zip(FIELDS, values):
        try:
            poll[field] = float(value)
        except ValueError:
            if field == "index":
                return None
    return poll


def summarise(polls: list[dict[str, float]]) -> dict | None:
    """The row's `clocks` column: SM clock (median and lowest, MHz; the
    card's maximum beside them), board power (median, W; the limit) and the
    hottest reading (C), over the busy polls (BUSY_PERCENT) of every polled
    GPU; None when none was busy."""
    busy = [p for p in polls if p.get("utilization.gpu", 0) >= BUSY_PERCENT]
    if not busy:
        return None
    summary: dict = {"polls": len(busy), "idle_polls": len(polls) - len(busy),
                     "gpus": len({p["index"] for p in busy})}
    for key, field, how in (("sm_mhz", "clocks.sm", statistics.median),
                            ("sm_mhz_min", "clocks.sm", min),
                            ("sm_mhz_max", "clocks.max.sm", max),
                            ("power_w", "power.draw", statistics.median),
                            ("power_limit_w", "power.limit", max),
                            ("temp_c_max", "temperature.gpu", max)):
        values = [p[field] for p in busy if field in p]
        if values:
            summary[key] = round(how(values), 1)
    return summary


class GpuPoll:
    """`with GpuPoll() as poll: ...` then poll.summary(): what nvidia-smi
    read every POLL_MS while the block ran (None without nvidia-smi)."""

    def __init__(self, command: str = "nvidia-smi", environ=os.environ):
        self._path = shutil.which(command)
        self._gpus = visible_gpus(environ)
        self._polls: list[dict[str, float]] = []
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> Self:
        if self._path is None:
            return self
        argv = [self._path, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits",
                f"--loop-ms={POLL_MS}"]
        if self._gpus is not None:
            argv.append(f"--id={self._gpus}")
        try:
            self._process = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return self
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    # No watchdog is needed if this process dies without __exit__ (SIGKILL):
    # the pipe's reading end closes with it, and nvidia-smi's next poll, 20 ms
    # later, ends it by SIGPIPE.
    def _read(self) -> None:
        for line in self._process.stdout:
            poll = parse_line(line)
            if poll is not None:
                self._polls.append(poll)

    def __exit__(self, *exc) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=5)

    def summary(self) -> dict | None:
        return summarise(list(self._polls))
