"""Synthetic result rows for the report tests (lcab.results.make_row).

Every number is made up: a row's TFLOP/s is given, its median time follows
from a fixed FLOP count (FLOPS), p20 / p80 are 0.9 / 1.25 times the median.
"""

import pathlib
import warnings

import pandas as pd

from lcab import results

FLOPS = 2e12
GPU = "NVIDIA H100 80GB HBM3"
COMMIT = "abc1234"
DATE = "2026-11-28"


def row(backend: str, *, mask: str = "causal", seqlen: int = 8192, direction: str = "fwd",
        status: str = "OK", tflops: float | None = 100.0, checked: bool = True,
        reason: str | None = None, device: str = GPU, suite: str = "kernel", cp_size: int = 1,
        strategy: str | None = None, median_ms: float | None = None, **more) -> dict:
    """One complete row; status not OK: no timings, `reason` (or a default) why."""
    ok = status == "OK"
    if ok and median_ms is None:
        median_ms = FLOPS / (tflops * 1e12) * 1e3
    return results.make_row(**{
        "framework": backend.split(".")[0], "backend": backend, "suite": suite, "mask": mask,
        "seqlen": seqlen, "seqlen_k": seqlen, "batch": 1, "heads_q": 8, "heads_kv": 8,
        "head_dim": 128, "dtype": "bfloat16", "direction": direction, "status": status,
        "reason": None if ok else (reason or f"{backend} {status.lower()} here"),
        "median_ms": median_ms if ok else None,
        "p20_ms": median_ms * 0.9 if ok else None, "p80_ms": median_ms * 1.25 if ok else None,
        "tflops": tflops if ok else None, "flops": FLOPS,
        "check_err": 0.01 if ok and checked else None, "device": device, "cp_size": cp_size,
        "strategy": strategy, "options": {}, "workload_key": f"{mask}/q{seqlen}",
        "mask_params": {"seed": 0}, "git_commit": COMMIT, "run_id": "run-1",
        "timestamp": f"{DATE}T10:00:00+00:00", **more,
    })


def write(folder: pathlib.Path, rows, name: str = "kernel_test.jsonl") -> pathlib.Path:
    """The rows as one JSONL file in `folder`; the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    writer = results.Writer(folder / name)
    for one in rows:
        writer.write(one)
    return folder


def loaded(folder: pathlib.Path, rows) -> pd.DataFrame:
    """The rows as lcab.results.load returns them (JSON columns as text),
    written to `folder` first."""
    return results.load([write(folder, rows)])


def test_synthetic_rows_read_back_without_a_warning(tmp_path):
    folder = write(tmp_path, [row("jax.a"), row("torch.b", status="UNSUPPORTED")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = results.load([folder])
    assert list(frame["status"]) == ["OK", "UNSUPPORTED"]
    assert frame.loc[0, "median_ms"] == 20.0  # 2e12 FLOPs at 100 TFLOP/s
