"""Result rows: append-only JSONL on disk, one pandas DataFrame in memory.

Each (backend, workload, direction) is one row, written and flushed as soon
as it is measured, so a killed run loses nothing already measured and
`--resume` skips what is there. Files from separate processes, machines or
days merge by concatenation. The comm suite's rows (one per collective, rank
count and message size) have a schema of their own, COMM_COLUMNS.

Reading (read_rows, and so load, done_keys, the report and the summaries):
a line that is not a row is skipped with a warning (SkippedRow) naming the
file, the 1-based line and the problem; the rest of the file is read, and
nothing malformed reaches a table. Files are read as bytes, line by line:

- A line that is not UTF-8, or not JSON (the torn tail of a killed run, NUL
  bytes), or JSON that is not an object ([1, 2], 42, null, "text") is
  skipped. A byte order mark before a line and a CR before its LF are not
  part of it; blank lines are passed over.
- An attention row (suite != "comm") needs, present and not null, the
  columns that place it (ATTENTION_REQUIRED): its measurement key and table
  cell (suite, framework, backend, mask, seqlen, direction, status,
  workload_key, cp_size) and its setting group (batch, heads_q, heads_kv,
  head_dim, dtype). A comm row needs COMM_REQUIRED: framework, op, ranks,
  bytes, device (the comm table groups by it) and status. An OK row also
  needs the figure its cell shows (OK_REQUIRED): tflops; for a comm row
  busbw_gbps and median_ms. Other columns may be missing or null (device and
  strategy of attention rows, timestamp, every timing of a row not OK), and
  columns outside the schema are kept.
- Types, for each column present and not null: NAME_COLUMNS are non-empty
  strings; TEXT_COLUMNS (device, strategy, inner, run_id) strings;
  COUNT_COLUMNS (seqlen, seqlen_k, batch, heads_q, heads_kv, head_dim,
  cp_size, ranks, bytes) positive integers, never bools or text ("512"); an
  integral float (4096.0) is read as that int; NUMBER_COLUMNS (timings,
  tflops, flops, errors, memory, ...) finite numbers, never bools; samples_ms
  a list of finite numbers; JSON_COLUMNS an object, or text holding one (as
  a frame from load() written back holds; "", "null", "NaN" for none);
  timestamp an ISO 8601 time; status one of lcab.status.Status; direction of
  an attention row one of lcab.flops.TIMED_DIRECTIONS; mask_params' keep and
  block_size, where given, finite numbers (the sparsity table's axes).
- A file none of whose rows carries any of RESULT_MARKS (suite, status,
  workload_key, run_id, timestamp, git_commit) is another tool's log stored
  beside the results (results/ holds conformance.jsonl and kernels.jsonl
  files): passed over without a warning.

Files are `*.jsonl`, or `*.jsonl.gz` (gzip): a settled folder that no run
appends to any more (the studies of results/gpu/) is kept compressed so
that the repository, which travels whole to the GPU machine, stays small;
writers always write plain JSONL.

Every row committed under results/ reads without a warning. Rows written
before a column existed stay readable: a row without `options` takes them
from its flags (_options_from_flags), a mask under an earlier name is read
as today's (lcab.masks.earlier).

Measurements (load, newest_rows): rows of one MEASUREMENT_KEY are reruns,
the newest timestamp (the instant, not the text) wins, whatever its status:
a rerun that failed shows as the failure, not as the older number. A row
written without its device (a run that failed before its runtime named one)
takes the device, cp_size and strategy of the measurement it repeats
(with_known_context) so that this holds for it too.
"""

from __future__ import annotations

import contextlib
import datetime
import gzip
import json
import math
import pathlib
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping

from lcab.flops import TIMED_DIRECTIONS
from lcab.status import Status

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
    "check_heads": "what the full-size check recomputed: batch rows, K/V heads and query heads "
                   "at every row, then every batch row and head at the sampled query rows",
    "check_len": "tokens the full-size check ran at (the row's own seqlen)",
    "check_s": "seconds the full-size check took (backend run and reference), untimed",
    "golden_err": "normalised max difference from --golden_dir's data of this workload "
                  "(None: not compared, or this run saved it)",
    "clocks": "the GPUs' SM clock (sm_mhz median, sm_mhz_min, sm_mhz_max the card's top), "
              "board power (power_w median, power_limit_w) and temp_c_max over nvidia-smi's "
              "busy polls while the samples ran (JSON, lcab.gpu_poll; None: no nvidia-smi)",
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
    "git_commit": "commit of the LCAB checkout (+dirty when its code differs from it; results/ and docs/ are not code)",
    "timestamp": "UTC time the row was written, ISO 8601",
    "workload_key": "Workload.key(): identifies the workload for --resume",
    "run_id": "identifies the run that wrote the row",
    "flags": "the command line settings of the run",
    "warmup": "untimed calls before timing",
    "iters": "timed repeats",
}
JSON_COLUMNS = ("mask_params", "versions", "options", "inner_options", "check_errors",
                "clocks")

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
    "git_commit": "commit of the LCAB checkout (+dirty when its code differs from it; results/ and docs/ are not code)",
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


# The columns of MEASUREMENT_KEY that only a run which reached its runtime
# and backend knows (lcab.runner writes them from both).
RUN_CONTEXT = ("device", "cp_size", "strategy")


def with_known_context(rows: Iterable[Mapping]) -> list[Mapping]:
    """The rows, each one without a device (its run failed before its
    runtime named one: lcab.runner's ERROR rows for a framework process that
    was lost, an isolated child that died) given the RUN_CONTEXT of the
    newest row of the same measurement (suite, backend, workload_key,
    direction, options) that names a device.

    So a rerun that failed that way and the older row it repeats are one
    measurement, of which the newer is shown; without this the older
    number would still be shown as the newest, and the failure beside it
    under a device of its own ("nan"). A row with no such peer is left as
    it is. Rows are copied, never changed.
    """
    rows = list(rows)
    known = {}  # measurement -> its newest row that names a device
    for row in sorted(rows, key=_time_order):
        key = _attention_key(row)
        if key is not None and row.get("device") is not None:
            known[key] = row
    return [_in_context(row, known) for row in rows]


def _in_context(row: Mapping, known: Mapping[tuple, Mapping]) -> Mapping:
    peer = known.get(_attention_key(row)) if row.get("device") is None else None
    return row if peer is None else {**row, **{column: peer.get(column) for column in RUN_CONTEXT}}


def _attention_key(row: Mapping) -> tuple | None:
    """row_key of an attention row; None for a comm row (its device is
    always known)."""
    return None if row.get("suite") == COMM_SUITE else row_key(row)


def newest_rows(rows: Iterable[Mapping]) -> list[Mapping]:
    """The newest row (by timestamp) of each measurement (MEASUREMENT_KEY),
    for readers of raw rows that must not count a rerun twice; a row
    without a device counts as the measurement it repeats
    (with_known_context)."""
    newest = {}
    for row in sorted(with_known_context(rows), key=_time_order):
        newest[_measurement(row)] = row
    return list(newest.values())


def _measurement(row: Mapping) -> tuple:
    """What makes two rows one measurement: MEASUREMENT_KEY for attention
    rows; for a comm row (which has none of its columns), its collective,
    size and rank count on its device."""
    if row.get("suite") == COMM_SUITE:
        return (*row_key(row), row.get("device"))
    return key_of(row, MEASUREMENT_KEY)


def key_of(row: Mapping, columns: Iterable[str]) -> tuple:
    """The row's values of these columns, options compared as options_key."""
    return tuple(options_key(row.get(column)) if column == "options" else row.get(column)
                 for column in columns)


def _time_order(row: Mapping) -> tuple:
    """Sort key of a row's time, as tables.latest orders them: by the
    instant (not the text: "+02:00" and "Z" sort right), rows without a
    readable time first."""
    time = parsed_time(row.get("timestamp"))
    return (0, _EARLIEST) if time is None else (1, time)


_EARLIEST = datetime.datetime.min.replace(tzinfo=datetime.UTC)


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


# Row files: plain, or gzip-compressed where a settled folder is kept small.
ROW_FILE_SUFFIXES = (".jsonl", ".jsonl.gz")


def row_files_under(folder: pathlib.Path) -> list[pathlib.Path]:
    """The row files (*.jsonl, *.jsonl.gz) in `folder` and below, sorted by
    path; a directory that happens to end in .jsonl is no file to read."""
    return sorted(p for p in folder.rglob("*.jsonl*")
                  if p.name.endswith(ROW_FILE_SUFFIXES) and p.is_file())


def row_files(paths: Iterable[str | pathlib.Path],
              passed_over=lambda file, folder: False) -> list[pathlib.Path]:
    """The row files the paths name: a file as given, a directory's row
    files (row_files_under) but those `passed_over(file, directory)` says
    to leave out; a path that does not exist raises FileNotFoundError."""
    found = []
    for path in map(pathlib.Path, paths):
        if path.is_dir():
            found += [file for file in row_files_under(path) if not passed_over(file, path)]
        elif path.exists():
            found.append(path)
        else:
            raise FileNotFoundError(f"no results at {path}")
    return found


# ---------------------------------------------------------------- reading

class SkippedRow(UserWarning):
    """A line of a result file that read_rows left out, and why."""


@contextlib.contextmanager
def skipped_rows_told_once() -> Iterator[None]:
    """Within it, each SkippedRow message is shown once, however often the
    files are read (a report reads them for its frame and again for its comm
    rows). Python's own once-filter cannot do this: any change to the
    warning filters (an import, a catch_warnings) makes it forget."""
    told: set[str] = set()
    show = warnings.showwarning

    def show_new(message, category, *args, **kwargs):
        if issubclass(category, SkippedRow):
            if str(message) in told:
                return
            told.add(str(message))
        show(message, category, *args, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("always", SkippedRow)
        warnings.showwarning = show_new  # catch_warnings restores it
        yield


# Columns only result rows carry. A JSONL file none of whose rows has any of
# them is another tool's log kept beside the results (the conformance gate's
# conformance.jsonl, the kernel studies' kernels.jsonl): not read, and not
# warned about.
RESULT_MARKS = frozenset({"suite", "status", "workload_key", "run_id", "timestamp", "git_commit"})

# What a row cannot be placed without (present and not null): the columns of
# its measurement key and table cell, and of its setting group.
ATTENTION_REQUIRED = (
    "suite", "framework", "backend", "mask", "seqlen", "direction", "status", "workload_key",
    "batch", "heads_q", "heads_kv", "head_dim", "dtype", "cp_size",
)
COMM_REQUIRED = ("framework", "op", "ranks", "bytes", "device", "status")
# What an OK row's table cell shows.
OK_REQUIRED = {"attention": ("tflops",), COMM_SUITE: ("busbw_gbps", "median_ms")}

# Type rules, each for the columns present and not null.
NAME_COLUMNS = ("suite", "framework", "backend", "mask", "dtype", "workload_key", "op")
TEXT_COLUMNS = ("device", "strategy", "inner", "run_id")
COUNT_COLUMNS = ("seqlen", "seqlen_k", "batch", "heads_q", "heads_kv", "head_dim", "cp_size",
                 "ranks", "bytes")
NUMBER_COLUMNS = (
    "median_ms", "p20_ms", "p80_ms", "tflops", "flops", "max_err", "check_err", "spread",
    "check_s", "check_len", "golden_err", "compile_s", "setup_s", "density", "mask_area",
    "peak_mem_bytes", "n_devices", "warmup", "iters", "algbw_gbps", "busbw_gbps",
)
STATUSES = tuple(status.value for status in Status)
# Text a JSON column may hold for "none": pandas writes a missing one as NaN.
_NO_JSON = ("", "null", "NaN")


def _is_name(value) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _is_number(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float: a frame could not hold it
        return False


def _is_count(value) -> bool:
    # An integral float (4096.0, as pandas writes an integer column with
    # gaps) is the same count; read_rows stores it as an int. Counts fit a
    # frame's int64 column.
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return _is_number(value) and whole and 0 < value < 2**63


def _is_number_list(value) -> bool:
    return isinstance(value, list) and all(map(_is_number, value))


def _is_json_object(value) -> bool:
    """A dict, or text holding one (a frame from load() written back holds
    JSON text)."""
    if isinstance(value, dict):
        return True
    if not isinstance(value, str):
        return False
    if value in _NO_JSON:
        return True
    try:
        return isinstance(json.loads(value), dict)
    except (ValueError, RecursionError):
        return False


def _is_iso_time(value) -> bool:
    return isinstance(value, str) and parsed_time(value) is not None


# How rows written before the `inner` column name their inner kernel.
_INNER_IN_NOTES = re.compile(r"\binner ((?:jax|torch)\.\w+)")


def inner_kernel(row: Mapping) -> str | None:
    """The kernel a CP row runs inside: its `inner` column; for rows written
    before that column, the registered name its notes give ("inner NAME")."""
    inner = row.get("inner")
    if isinstance(inner, str) and inner:
        return inner
    notes = row.get("notes")
    found = _INNER_IN_NOTES.search(notes if isinstance(notes, str) else "")
    return found.group(1) if found else None


def short_commit(commit) -> str:
    """A row's commit as seven hex digits: rows carry what --git_commit was
    given, short or full."""
    return str(commit)[:7]


def parsed_time(value) -> datetime.datetime | None:
    """An ISO 8601 time as an aware datetime (UTC where it names no zone);
    None where it is not one."""
    try:
        time = datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return time if time.tzinfo else time.replace(tzinfo=datetime.UTC)


# column -> (test, what the value must be)
_TYPE_RULES: dict[str, tuple[Callable[[object], bool], str]] = {
    **{column: (_is_name, "a non-empty string") for column in NAME_COLUMNS},
    **{column: (lambda v: isinstance(v, str), "a string") for column in TEXT_COLUMNS},
    **{column: (_is_count, "a positive integer") for column in COUNT_COLUMNS},
    **{column: (_is_number, "a finite number") for column in NUMBER_COLUMNS},
    "samples_ms": (_is_number_list, "a list of finite numbers"),
    **{column: (_is_json_object, "a JSON object") for column in JSON_COLUMNS},
    "timestamp": (_is_iso_time, "an ISO 8601 time"),
    "status": (lambda v: v in STATUSES, f"one of {', '.join(STATUSES)}"),
}
_ATTENTION_TYPE_RULES = {
    **_TYPE_RULES,
    "direction": (lambda v: v in TIMED_DIRECTIONS, f"one of {', '.join(TIMED_DIRECTIONS)}"),
}
# The sparsity table reads these two mask parameters as numbers.
_SWEPT_PARAMS = ("keep", "block_size")


def _json_kind(value) -> str:
    kinds = ((bool, "boolean"), (list, "list"), ((int, float), "number"), (str, "string"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "null")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def row_problem(row) -> str | None:
    """Why a parsed line is not a row that read_rows returns (None: it is
    one). The rules are the module docstring's, "Reading"."""
    if not isinstance(row, dict):
        return f"not a row: a JSON {_json_kind(row)}"
    kind = COMM_SUITE if row.get("suite") == COMM_SUITE else "attention"
    required = COMM_REQUIRED if kind == COMM_SUITE else ATTENTION_REQUIRED
    if row.get("status") == Status.OK.value:
        required += OK_REQUIRED[kind]
    missing = [column for column in required if row.get(column) is None]
    if missing:
        return f"missing or null column(s) {', '.join(missing)}"
    rules = _TYPE_RULES if kind == COMM_SUITE else _ATTENTION_TYPE_RULES
    problems = [f"{column}={_shown(row[column])} is not {what}"
                for column, (test, what) in rules.items()
                if row.get(column) is not None and not test(row[column])]
    problems += _mask_param_problems(row)
    return "; ".join(problems) or None


def _mask_param_problems(row: Mapping) -> list[str]:
    if not _is_json_object(row.get("mask_params")):
        return []  # the type rules name it
    params = json_field(row.get("mask_params"))
    return [f"mask_params {name}={_shown(params[name])} is not a finite number"
            for name in _SWEPT_PARAMS if name in params and not _is_number(params[name])]


def _warn_skipped(path: pathlib.Path, number: int, problem: str) -> None:
    warnings.warn(f"{path}:{number}: skipping the row: {problem}", SkippedRow)


def _parsed_lines(data: bytes) -> Iterator[tuple[int, object, str | None]]:
    """(1-based line number, parsed JSON, None) of each non-blank line, or
    (number, None, why) for a line that is not UTF-8 or not JSON."""
    # Split on LF only, as editors and `grep -n` count lines; a CR before it
    # (CRLF files) is JSON whitespace.
    for number, raw in enumerate(data.split(b"\n"), 1):
        try:
            # utf-8-sig: a byte order mark opens the file (or each file
            # concatenated into it); it is no part of the row.
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            yield number, None, (f"not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                                 f"at column {exc.start + 1})")
            continue
        if not text.strip():
            continue
        try:
            yield number, json.loads(text), None
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            yield number, None, f"a truncated or corrupt row ({exc})"


def _another_tools_log(lines: list[tuple[int, object, str | None]]) -> bool:
    """Whether a file's parsed lines are records with none of RESULT_MARKS."""
    records = [value for _, value, _ in lines if isinstance(value, dict) and value]
    return bool(records) and not any(RESULT_MARKS & record.keys() for record in records)


def _rows_of_file(path: pathlib.Path) -> list[dict]:
    try:
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError) as exc:  # gzip's errors: BadGzipFile (an OSError), EOFError
        warnings.warn(f"{path}: skipping the file: cannot read it ({exc})", SkippedRow)
        return []
    lines = list(_parsed_lines(data))
    if _another_tools_log(lines):
        return []
    rows = []
    for number, value, problem in lines:
        problem = problem or row_problem(value)
        if problem:
            _warn_skipped(path, number, problem)
        else:
            rows.append(_as_read(value))
    return rows


def read_rows(paths: Iterable[str | pathlib.Path]) -> list[dict]:
    """Every row in the files (directories are searched for *.jsonl and
    *.jsonl.gz).

    A line that is not a row by the module docstring's rules ("Reading": a
    torn or corrupt line, text that is not UTF-8, JSON that is not an
    object, a row without the columns that place it or with a value of the
    wrong type) is skipped with a warning (SkippedRow) naming the file, the
    line and the problem; the other lines are read. A file of another
    tool's records (no row with any of RESULT_MARKS) is passed over quietly.
    """
    rows = []
    for path in row_files(paths):
        rows += _rows_of_file(path)
    return rows


def _as_read(row: dict) -> dict:
    """A valid row as readers see it: counts as ints, and a row written
    before the options column or under a mask's earlier name as today's."""
    for column in COUNT_COLUMNS:
        if isinstance(row.get(column), float):
            row[column] = int(row[column])
    if row.get("suite") != COMM_SUITE:
        if "options" not in row:
            row["options"] = _options_from_flags(row)
        _name_legacy_mask(row)
    return row


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
        except (ValueError, RecursionError):
            return {}
    entries = flags.get("backend_options") if isinstance(flags, Mapping) else None
    if not isinstance(entries, list):
        return {}
    # Each entry is [backend, key, value]; one of another shape says nothing.
    return {str(entry[1]): str(entry[2]) for entry in entries
            if isinstance(entry, list) and len(entry) == 3 and entry[0] == row.get("backend")}


# Statuses that depend on this machine's state rather than on the kernel:
# a resumed run measures them again (the report keeps the newest row).
RETRIED_ON_RESUME = ("ERROR", "UNAVAILABLE")


def done_keys(paths: Iterable[str | pathlib.Path], *, settled_only: bool = False,
              run_id: str | None = None) -> set[tuple]:
    """Keys of the rows in the files; with settled_only, not of ERROR or
    UNAVAILABLE rows, which --resume retries; with run_id, only of the rows
    that run wrote (an older run's rows in the same files are not its own)."""
    existing = [p for p in map(pathlib.Path, paths) if p.exists()]
    return {
        row_key(row)
        for row in read_rows(existing)
        if not (settled_only and row.get("status") in RETRIED_ON_RESUME)
        and (run_id is None or row.get("run_id") == run_id)
    }


def load(paths):
    """All rows of the given files or directories as one DataFrame.

    The rows are read_rows': a malformed line is left out with a warning.
    A row without a device takes the device, cp_size and strategy of the
    measurement it repeats (with_known_context), so that tables.latest
    shows the newer of the two.
    Columns are COLUMNS in order (missing ones filled with None); the JSON
    columns (JSON_COLUMNS) are compact JSON strings, None where a row has
    none, so that rows can be grouped and compared.
    """
    import pandas as pd

    if isinstance(paths, (str, pathlib.Path)):
        paths = [paths]
    # The comm suite's rows have their own schema (COMM_COLUMNS).
    rows = [row for row in read_rows(paths) if row.get("suite") != COMM_SUITE]
    rows = with_known_context(rows)  # a failed rerun replaces what it repeats
    frame = pd.DataFrame(rows or None, columns=list(COLUMNS))
    for column in JSON_COLUMNS:
        frame[column] = frame[column].map(_json_text)
    frame["options"] = frame["options"].map(options_key)
    for column in ("median_ms", "p20_ms", "p80_ms", "tflops", "max_err", "golden_err",
                   "compile_s", "spread", "check_err", "check_len", "check_s"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame


def _json_text(value) -> str | None:
    """A JSON column's value in a frame: compact sorted JSON text; text as
    it was; None for none (a column a row lacks arrives as NaN, a frame
    written back holds it as "NaN")."""
    if isinstance(value, str):
        return None if value in _NO_JSON else value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return json.dumps(value, sort_keys=True)
