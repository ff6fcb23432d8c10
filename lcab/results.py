"""Result rows: append-only JSONL on disk, one pandas DataFrame in memory.

Each (backend, workload, direction) is one row, written and flushed as soon
as it is measured, so a killed run loses nothing already measured and
`--resume` skips what is there. Files from separate processes, machines or
days merge by concatenation. The comm suite's rows (one per collective, rank
count and message size) have a schema of their own, COMM_COLUMNS.
"""

from __future__ import annotations

import json
import math
import pathlib
import warnings
from collections.abc import Iterable, Mapping

# The schema: column -> meaning. Order is the DataFrame's column order.
COLUMNS: dict[str, str] = {
    "framework": "jax, torch (or numpy for host-only plugins)",
    "backend": "full backend name, e.g. jax.cudnn",
    "suite": "kernel or cp",
    "mask": "mask family name",
    "mask_params": "resolved mask parameters (JSON): seed, doc_lens, window, ...",
    "mask_fingerprint": "digest of the exact visible set (AttnMask.fingerprint)",
    "mask_area": "exact number of visible (q, k) pairs",
    "density": "mask_area / (seqlen * seqlen_k)",
    "seqlen": "total query length (for CP rows, the whole sequence)",
    "seqlen_k": "total key length",
    "batch": "batch size",
    "heads_q": "query heads",
    "heads_kv": "key/value heads",
    "head_dim": "head dimension",
    "dtype": "bfloat16, float16 or float32",
    "direction": "fwd or bwd (bwd = time(fwd+bwd) - time(fwd))",
    "status": "OK, OOM, UNSUPPORTED, UNAVAILABLE, ERROR or MISMATCH",
    "reason": "why the status is not OK (empty when OK)",
    "median_ms": "median time of the timed repeats, ms",
    "p20_ms": "20th percentile, ms",
    "p80_ms": "80th percentile, ms",
    "samples_ms": "every timed repeat, ms (bwd: fwd+bwd samples minus the fwd median)",
    "flops": "exact FLOPs of this direction (lcab.flops)",
    "tflops": "flops / median seconds / 1e12, per GPU for CP rows",
    "peak_mem_bytes": "peak device memory of the case (None where unknown)",
    "max_err": "normalised max error of the correctness probe (max over out, dq, dk, dv)",
    "probe": "the correctness probe's workload (lcab.validation): mask, length, batch, heads, "
             "dtype",
    "spread": "p80_ms / p20_ms of the timed samples (tables flag a cell above "
              "lcab.runtime.SPREAD_LIMIT)",
    "check_err": "normalised max error of the full-size check at this very workload "
                 "(lcab.fullcheck; fwd: out, bwd: max over out, dq, dk, dv; None: not checked)",
    "check_errors": "the full-size check's error per tensor (JSON: out, dq, dk, dv)",
    "check_heads": "what the full-size check recomputed: batch rows, K/V heads, query heads",
    "check_len": "tokens the full-size check ran at (the row's own seqlen)",
    "check_s": "seconds the full-size check took (backend run and reference), untimed",
    "golden_err": "normalised max difference from --golden_dir's data of this workload "
                  "(None: not compared, or this run saved it)",
    "compile_s": "JAX: lower+compile seconds; torch: first-call seconds",
    "setup_s": "seconds of the backend's host-side build (masks, BlockMasks, cu_seqlens), untimed",
    "device": "device name, e.g. NVIDIA H200, or cpu",
    "n_devices": "devices visible to the process",
    "cp_size": "context-parallel size (1 for kernel rows)",
    "strategy": "CP strategy (None for kernel rows)",
    "inner": "registry name of the kernel a CP strategy or module runs inside "
             "(Backend.inner(); None for kernels, and for rows written before the column, "
             "whose notes name it as 'inner NAME')",
    "inner_options": "that inner kernel's constructor options (JSON, as `options`; None where "
                     "`inner` is)",
    "options": "the backend's constructor options in this run (JSON: --backend_options, "
               "--cp_size, --dispatch); part of what makes two rows the same measurement",
    "notes": "how the backend expressed the mask and shape",
    "versions": "framework and library versions, and JAX's XLA_FLAGS when set (JSON)",
    "git_commit": "commit of the LCAB checkout (+dirty when modified)",
    "timestamp": "UTC time the row was written, ISO 8601",
    "workload_key": "Workload.key(): identifies the workload for --resume",
    "run_id": "identifies the run that wrote the row",
    "flags": "the command line settings of the run",
    "warmup": "untimed calls before timing",
    "iters": "timed repeats",
}
JSON_COLUMNS = ("mask_params", "versions", "options", "inner_options", "check_errors")

COMM_SUITE = "comm"
# The comm suite's schema (lcab.comm.comm_row): column -> meaning.
COMM_COLUMNS: dict[str, str] = {
    "framework": "jax or torch",
    "suite": "comm",
    "op": "the collective: ppermute, all_gather or all_to_all (lcab.comm.COMM_OPS)",
    "bytes": "bytes per rank (all_gather: its output), rounded to whole pieces per rank",
    "ranks": "devices (processes for torch) the collective runs over",
    "status": "OK, OOM, UNSUPPORTED, UNAVAILABLE, ERROR or MISMATCH (moved the wrong values)",
    "reason": "why the status is not OK (empty when OK)",
    "median_ms": "median time of one collective over the timed samples, ms",
    "p20_ms": "20th percentile, ms",
    "p80_ms": "80th percentile, ms",
    "samples_ms": "every timed sample, ms per collective (the slowest rank's)",
    "algbw_gbps": "bytes / median seconds / 1e9",
    "busbw_gbps": "algbw x the op's bus factor (nccl-tests' convention, lcab.comm.bus_factor)",
    "device": "device name, e.g. NVIDIA H100 80GB HBM3, or cpu",
    "notes": "how it was timed (collectives chained per timed loop, dtype, process group)",
    "versions": "framework and library versions (JSON)",
    "git_commit": "commit of the LCAB checkout (+dirty when modified)",
    "timestamp": "UTC time the row was written, ISO 8601",
    "run_id": "identifies the run that wrote the row",
    "flags": "the command line settings of the run (JSON: argv, ops, sizes, ranks)",
}


def json_field(value) -> dict:
    """A JSON column's value as a dict: a frame from load() holds JSON
    strings, raw rows hold dicts; {} for none (None, "", or a missing
    value, NaN, in a frame)."""
    if isinstance(value, str):
        value = json.loads(value) if value else {}
    return dict(value) if isinstance(value, Mapping) else {}


def options_key(options) -> str:
    """Backend options as compared between rows: sorted compact JSON ("{}"
    for none, also for rows written before the column existed)."""
    return json.dumps(json_field(options), sort_keys=True)


def default_options(options) -> bool:
    """Whether a row ran its backend with no options set (its defaults)."""
    return options_key(options) == "{}"


def make_row(**fields) -> dict:
    """A complete row: every schema column present, unknown ones refused."""
    return _complete(fields, COLUMNS, "COLUMNS")


def make_comm_row(**fields) -> dict:
    """A complete comm-suite row (COMM_COLUMNS)."""
    return _complete({**fields, "suite": COMM_SUITE}, COMM_COLUMNS, "COMM_COLUMNS")


def _complete(fields: Mapping, columns: Mapping[str, str], name: str) -> dict:
    unknown = sorted(set(fields) - set(columns))
    if unknown:
        raise ValueError(f"unknown result columns {unknown}; the schema is lcab.results.{name}")
    return {column: fields.get(column) for column in columns}


# Rows that measure the same thing: reruns and merged files repeat them, and
# the newest timestamp wins. Strategy and device are part of it so that two
# strategies of one backend, or two GPUs, are never collapsed into one row.
MEASUREMENT_KEY = (
    "suite", "backend", "workload_key", "direction", "cp_size", "strategy", "device", "options",
)


def newest_rows(rows: Iterable[Mapping]) -> list[Mapping]:
    """The newest row (by timestamp) of each measurement (MEASUREMENT_KEY),
    for readers of raw rows that must not count a rerun twice."""
    newest = {}
    for row in sorted(rows, key=lambda row: str(row.get("timestamp") or "")):
        newest[tuple(options_key(row.get(column)) if column == "options" else row.get(column)
                     for column in MEASUREMENT_KEY)] = row
    return list(newest.values())


def row_key(row: Mapping) -> tuple:
    """What --resume compares: one measurement of one backend, with its
    options, on one workload; for a comm row, one collective at one size
    over one rank count."""
    if row.get("suite") == COMM_SUITE:
        return comm_key(row["framework"], row["op"], row["ranks"], row["bytes"])
    return (row["suite"], row["backend"], row["workload_key"], row["direction"],
            options_key(row.get("options")))


def comm_key(framework: str, op: str, ranks: int, nbytes: int) -> tuple:
    return (COMM_SUITE, framework, op, int(ranks), int(nbytes))


class Writer:
    """Appends rows to a JSONL file, flushing each one."""

    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A run killed mid-line leaves no newline; start on a fresh line.
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as f:
                f.seek(-1, 2)
                needs_newline = f.read(1) != b"\n"
            if needs_newline:
                with open(self.path, "a") as f:
                    f.write("\n")

    def write(self, row: Mapping) -> None:
        line = json.dumps(_finite(dict(row)), default=str, allow_nan=False)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()


class DiscardingWriter(Writer):
    """For the processes of a multi-process run that are not rank 0: the
    rows are rank 0's to write (its times are the maximum over ranks)."""

    def __init__(self):
        self.path = None

    def write(self, row: Mapping) -> None:
        pass


def _finite(value):
    """JSON has no NaN or infinity: such numbers are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _files(paths: Iterable[str | pathlib.Path]) -> list[pathlib.Path]:
    found = []
    for path in map(pathlib.Path, paths):
        if path.is_dir():
            found += sorted(path.rglob("*.jsonl"))
        elif path.exists():
            found.append(path)
        else:
            raise FileNotFoundError(f"no results at {path}")
    return found


def read_rows(paths: Iterable[str | pathlib.Path]) -> list[dict]:
    """Every row in the files (directories are searched for *.jsonl).

    A line that does not parse (the tail of a killed run) is skipped with a
    warning naming it.
    """
    rows = []
    for path in _files(paths):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                warnings.warn(f"{path}:{number}: skipping a truncated or corrupt row")
                continue
            if isinstance(row, dict) and "options" not in row and row.get("suite") != COMM_SUITE:
                row["options"] = _options_from_flags(row)
            if isinstance(row, dict) and row.get("suite") != COMM_SUITE:
                _name_legacy_mask(row)
            rows.append(row)
    return rows


def _name_legacy_mask(row: dict) -> None:
    """A mask named as rows written before 2026-11-27 name it, read as
    today's (lcab.masks.earlier), so that the row rebuilds its own mask."""
    from lcab.masks import earlier  # the masks package, only where rows are read

    params = json_field(row.get("mask_params"))
    mask, today = earlier.as_today(row.get("mask"), row.get("seqlen") or 0, params,
                                   row.get("mask_fingerprint"))
    row["mask"] = mask
    if today != params:
        row["mask_params"] = today


def _options_from_flags(row: Mapping) -> dict[str, str]:
    """A row written before the options column existed: its backend's
    options are the run's --backend_options for that backend, which the
    row's flags record holds, so old and new rows of one measurement share
    a key."""
    flags = row.get("flags")
    if isinstance(flags, str):
        try:
            flags = json.loads(flags)
        except json.JSONDecodeError:
            return {}
    if not isinstance(flags, Mapping):
        return {}
    return {key: str(value) for name, key, value in flags.get("backend_options") or ()
            if name == row.get("backend")}


# Statuses that depend on this machine's state rather than on the kernel:
# a resumed run measures them again (the report keeps the newest row).
RETRIED_ON_RESUME = ("ERROR", "UNAVAILABLE")


def done_keys(paths: Iterable[str | pathlib.Path], *, settled_only: bool = False) -> set[tuple]:
    """Keys of the rows in the files; with settled_only, not of ERROR or
    UNAVAILABLE rows, which --resume retries."""
    existing = [p for p in map(pathlib.Path, paths) if p.exists()]
    return {
        row_key(row)
        for row in read_rows(existing)
        if not (settled_only and row.get("status") in RETRIED_ON_RESUME)
    }


def load(paths):
    """All rows of the given files or directories as one DataFrame.

    Columns are COLUMNS in order (missing ones filled with None); the JSON
    columns (mask_params, versions, options, inner_options) are compact JSON
    strings so that rows can be grouped and compared.
    """
    import pandas as pd

    if isinstance(paths, (str, pathlib.Path)):
        paths = [paths]
    # The comm suite's rows have their own schema (COMM_COLUMNS).
    rows = [row for row in read_rows(paths) if row.get("suite") != COMM_SUITE]
    frame = pd.DataFrame(rows or None, columns=list(COLUMNS))
    for column in JSON_COLUMNS:
        frame[column] = frame[column].map(
            lambda value: value if isinstance(value, str) or value is None
            else json.dumps(value, sort_keys=True)
        )
    frame["options"] = frame["options"].map(options_key)
    for column in ("median_ms", "p20_ms", "p80_ms", "tflops", "max_err", "golden_err",
                   "compile_s", "spread", "check_err", "check_len", "check_s"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame
