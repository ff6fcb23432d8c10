"""Damaged result files: every malformed line is skipped with a warning that
names the file, the line and the problem, and the rest of the file is read
by read_rows, load, done_keys (--resume), the summary and the report CLI.

The good rows are hand-made test rows (tests/data/sample_results.jsonl,
device "synthetic-test-device") and one comm row from lcab.comm.comm_row.
"""

import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

from lcab import results
from lcab.comm import comm_row
from lcab.report import tables
from lcab.report.summary import summary_text

ROOT = pathlib.Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "data" / "sample_results.jsonl"
BAD_LINE = 3  # every damaged file: good, good, BAD, good, good comm row
DROP = object()  # a column the damaged row lacks


def _sample_rows() -> list[dict]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines()]


def _good_attention_rows() -> list[dict]:
    """Three OK kernel rows of distinct cells (fwd, seqlen 4096)."""
    chosen, cells = [], set()
    for row in _sample_rows():
        cell = (row["backend"], row["mask"])
        if (row["suite"], row["status"], row["direction"], row["seqlen"]) == (
                "kernel", "OK", "fwd", 4096) and cell not in cells:
            chosen.append(row)
            cells.add(cell)
    return chosen[:3]


GOOD = _good_attention_rows()
GOOD_COMM = comm_row(framework="jax", op="all_gather", nbytes=1 << 20, ranks=2,
                     samples_ms=[0.10, 0.11, 0.12], device="synthetic-test-device",
                     versions={"synthetic": "0"}, git_commit="synthetic",
                     run_id="synthetic-run", flags="--synthetic")


def _line(row: dict) -> bytes:
    return json.dumps(row).encode()


def _attention(**changes) -> bytes:
    """GOOD[0] (its cell shared with the good row, so a leak shows as a
    second line, column or value) with columns changed or DROPped."""
    row = {**GOOD[0], **changes}
    return _line({k: v for k, v in row.items() if v is not DROP})


def _latin1(row: dict) -> bytes:
    """The row as a Latin-1 editor saves it: not UTF-8."""
    return json.dumps(row, ensure_ascii=False).encode("latin-1")


def _comm(**changes) -> bytes:
    row = {**GOOD_COMM, **changes}
    return _line({k: v for k, v in row.items() if v is not DROP})


# id -> (the damaged line, what the warning must say)
DAMAGE = {
    # JSON that is not an object
    "json_list": (b"[1, 2, 3]", "not a row: a JSON list"),
    "json_number": (b"42", "not a row: a JSON number"),
    "json_null": (b"null", "not a row: a JSON null"),
    "json_string": (b'"text"', "not a row: a JSON string"),
    "json_boolean": (b"true", "not a row: a JSON boolean"),
    # text that is not JSON
    "torn_line": (_line(GOOD[0])[:-25], "truncated or corrupt"),
    "garbage_text": (b"@@ this is no JSON @@", "truncated or corrupt"),
    "nul_bytes": (b"\x00" * 16, "truncated or corrupt"),
    "nested_too_deep": (b"[" * 100_000, "truncated or corrupt"),
    # bytes that are not UTF-8
    "latin1_row": (_latin1(GOOD[0] | {"notes": "d\u00e9j\u00e0 vu"}), "not UTF-8 text (byte 0xe9"),
    "lone_ff_byte": (b"\xff" + _line(GOOD[0]), "not UTF-8 text (byte 0xff at column 1)"),
    # columns that place the row
    "empty_object": (b"{}", "missing or null column(s) suite, framework, backend"),
    **{f"no_{column}": (_attention(**{column: DROP}), f"missing or null column(s) {column}")
       for column in results.ATTENTION_REQUIRED},
    "null_backend": (_attention(backend=None), "missing or null column(s) backend"),
    "ok_without_tflops": (_attention(tflops=DROP), "missing or null column(s) tflops"),
    # values of the wrong type
    "seqlen_as_text": (_attention(seqlen="4096"), "seqlen='4096' is not a positive integer"),
    "seqlen_as_bool": (_attention(seqlen=True), "seqlen=True is not a positive integer"),
    "seqlen_fraction": (_attention(seqlen=4096.5), "seqlen=4096.5 is not a positive integer"),
    "zero_heads": (_attention(heads_q=0), "heads_q=0 is not a positive integer"),
    "seqlen_past_int64": (_attention(seqlen=2**64), f"seqlen={2**64} is not a positive integer"),
    "tflops_past_any_float": (_attention(tflops=10**400), "is not a finite number"),
    "cp_size_as_text": (_attention(cp_size="1"), "cp_size='1' is not a positive integer"),
    "tflops_as_text": (_attention(tflops="fast"), "tflops='fast' is not a finite number"),
    "tflops_nan": (_attention(tflops=float("nan")), "tflops=nan is not a finite number"),
    "median_as_bool": (_attention(median_ms=True), "median_ms=True is not a finite number"),
    "samples_with_text": (_attention(samples_ms=[1.0, "x"]),
                          "samples_ms=[1.0, 'x'] is not a list of finite numbers"),
    "samples_as_text": (_attention(samples_ms="1,2"), "samples_ms='1,2' is not a list"),
    "unknown_status": (_attention(status="DONE"), "status='DONE' is not one of OK, OOM"),
    "lower_case_status": (_attention(status="ok"), "status='ok' is not one of"),
    "unknown_direction": (_attention(direction="fwd_bwd"),
                          "direction='fwd_bwd' is not one of fwd, bwd"),
    "options_not_json": (_attention(options="not json"),
                         "options='not json' is not a JSON object"),
    "mask_params_list": (_attention(mask_params=[1]), "mask_params=[1] is not a JSON object"),
    "keep_as_text": (_attention(mask_params={"seed": 0, "keep": "x", "block_size": 128}),
                     "mask_params keep='x' is not a finite number"),
    "bad_timestamp": (_attention(timestamp="yesterday"), "timestamp='yesterday' is not an ISO"),
    "device_as_list": (_attention(device=["gpu"]), "device=['gpu'] is not a string"),
    "strategy_as_object": (_attention(strategy={"a": 1}), "strategy={'a': 1} is not a string"),
    "empty_backend": (_attention(backend=""), "backend='' is not a non-empty string"),
    # comm rows
    **{f"comm_no_{column}": (_comm(**{column: DROP}), f"missing or null column(s) {column}")
       for column in results.COMM_REQUIRED},
    "comm_ok_without_busbw": (_comm(busbw_gbps=None), "missing or null column(s) busbw_gbps"),
    "comm_ranks_as_text": (_comm(ranks="2"), "ranks='2' is not a positive integer"),
    "comm_zero_bytes": (_comm(bytes=0), "bytes=0 is not a positive integer"),
    "comm_unknown_status": (_comm(status="DONE"), "status='DONE' is not one of"),
}


def _write_damaged(folder: pathlib.Path, bad_line: bytes) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rows.jsonl"
    lines = [_line(GOOD[0]), _line(GOOD[1]), bad_line, _line(GOOD[2]), _line(GOOD_COMM)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _read_with_warnings(read, *args):
    """What `read` returns and the messages of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = read(*args)
    return value, [str(w.message) for w in caught]


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def assert_clean_tables(text: str) -> None:
    """No column or setting named nan, no line twice (a row whose value
    differs only in type would give "full | 4096" twice)."""
    lines = _table_lines(text)
    assert lines, text
    for line in lines:
        assert "nan" not in [cell.strip() for cell in line.split("|")], text
    bodies = [line for line in lines if not set(line) <= set("|:- ")]
    headers = {line for line in bodies if "mask" in line or "framework" in line}
    rows = [line for line in bodies if line not in headers]
    assert len(rows) == len(set(rows)), text
    assert " on nan" not in text and " on None" not in text, text


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lcab.report", *args], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                          check=False)


@pytest.fixture(scope="module")
def damaged_tree(tmp_path_factory):
    """One folder per damage, and one report CLI run over them all, with
    the summary and the written report (one process keeps the suite fast;
    each warning names its own file)."""
    root = tmp_path_factory.mktemp("damaged")
    paths = {name: _write_damaged(root / name, line) for name, (line, _) in DAMAGE.items()}
    out = tmp_path_factory.mktemp("report")
    return paths, _report(f"--results={root}", "--summary", f"--out={out}"), out


def _good_cells() -> list[str]:
    return [tables.format_cell("OK", row["tflops"], checked=row.get("check_err") is not None)
            for row in GOOD]


@pytest.mark.parametrize("name", DAMAGE)
def test_a_damaged_line_is_skipped_with_a_warning_and_the_rest_is_read(name, damaged_tree):
    paths, _, _ = damaged_tree
    path, (_, problem) = paths[name], DAMAGE[name]

    rows, messages = _read_with_warnings(results.read_rows, [path])
    assert [row["timestamp"] for row in rows] == [
        row["timestamp"] for row in [*GOOD, GOOD_COMM]]
    assert [row["backend"] for row in rows[:3]] == [row["backend"] for row in GOOD]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{path}:{BAD_LINE}: skipping the row: "), messages
    assert problem in messages[0], messages

    frame, _ = _read_with_warnings(results.load, [path])
    assert len(frame) == 3 and list(frame["backend"]) == [row["backend"] for row in GOOD]
    keys, _ = _read_with_warnings(results.done_keys, [path])
    assert keys == {results.row_key(row) for row in rows}
    assert len(keys) == 4

    summary, _ = _read_with_warnings(summary_text, [path.parent])
    assert_clean_tables(summary)
    for cell in _good_cells():
        assert cell in summary
    assert "all_gather" in summary  # the comm row after the damaged line


@pytest.mark.parametrize("name", DAMAGE)
def test_the_report_cli_reads_past_a_damaged_line(name, damaged_tree):
    paths, run, out = damaged_tree
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    for table in ("kernel.md", "kernel_fwd.md", "comm.md", "README.md"):
        assert_clean_tables((out / table).read_text())
    warned = [line for line in run.stderr.splitlines()
              if f"{paths[name]}:{BAD_LINE}: skipping the row: " in line]
    assert len(warned) == 1 and DAMAGE[name][1] in warned[0], run.stderr
    assert_clean_tables(run.stdout)


# ---------------------------------------------------------------- what still reads


def test_what_already_read_still_reads_without_a_warning(tmp_path):
    # A byte order mark, CRLF line ends, blank lines, a column outside the
    # schema, an integral float, JSON columns as text, a row from before
    # the options column: all read, none warned about.
    legacy = {k: v for k, v in GOOD[1].items() if k != "options"}
    lines = [
        b"\xef\xbb\xbf" + _line(GOOD[0]),
        b"",
        _line(legacy | {"flags": json.dumps({"backend_options": [[GOOD[1]["backend"], "b", 1]]})}),
        _line(GOOD[2] | {"seqlen": 4096.0, "a_column_from_the_future": [1, 2],
                         "mask_params": json.dumps(GOOD[2]["mask_params"]), "versions": "NaN"}),
        _line(GOOD_COMM),
    ]
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\r\n".join(lines) + b"\r\n")
    rows, messages = _read_with_warnings(results.read_rows, [path])
    assert messages == []
    assert len(rows) == 4
    assert rows[1]["options"] == {"b": "1"}
    assert rows[2]["seqlen"] == 4096 and isinstance(rows[2]["seqlen"], int)
    assert rows[2]["a_column_from_the_future"] == [1, 2]
    frame, _ = _read_with_warnings(results.load, [path])
    assert len(frame) == 3 and frame["versions"].isna().tolist() == [False, False, True]


def test_the_committed_rows_read_without_a_warning():
    rows, messages = _read_with_warnings(results.read_rows, [ROOT / "results"])
    assert messages == []
    assert len(rows) > 4000


def test_settled_studies_keep_their_rows_compressed():
    """results/gpu/ holds lab studies no run appends to: their row files
    are *.jsonl.gz (the repository travels whole to the GPU machine); only
    other tools' logs (no result rows) stay plain there."""
    plain = [path for path in (ROOT / "results" / "gpu").rglob("*.jsonl")
             if _read_with_warnings(results.read_rows, [path])[0]]
    assert plain == [], "gzip -9n these"
    assert results.row_files_under(ROOT / "results" / "gpu")


def test_another_tools_log_beside_the_results_is_passed_over_quietly(tmp_path):
    # results/ holds the conformance gate's conformance.jsonl: no result rows.
    (tmp_path / "conformance.jsonl").write_text(
        json.dumps({"backend": "jax.xla", "mask": "full", "seqlen": 2048, "ok": {"fwd": True}})
        + "\n")
    _write_damaged(tmp_path / "run", _line(GOOD[0]))
    rows, messages = _read_with_warnings(results.read_rows, [tmp_path])
    assert messages == [] and len(rows) == 5


def test_a_file_of_damage_alone_is_warned_about_line_by_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"[1]\n{}\n\xff\n")
    rows, messages = _read_with_warnings(results.read_rows, [path])
    assert rows == []
    assert [m.split(": skipping")[0] for m in messages] == [f"{path}:{n}" for n in (1, 2, 3)]


def test_a_compressed_rows_file_reads_as_its_plain_self(tmp_path):
    """A settled folder is kept as *.jsonl.gz: a folder's search finds it,
    its rows (damaged lines too) read as the plain file's; a file that is
    not gzip, or cut short, is one warning and no rows."""
    import gzip

    plain = _write_damaged(tmp_path / "plain", b"{torn")
    packed = tmp_path / "packed" / "rows.jsonl.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    (tmp_path / "packed" / "notes.gz").write_bytes(gzip.compress(b"not rows"))  # not searched
    want, told = _read_with_warnings(results.read_rows, [plain])
    got, said = _read_with_warnings(results.read_rows, [tmp_path / "packed"])
    assert got == want and len(got) == 4
    assert [m.split(":", 1)[1] for m in said] == [m.split(":", 1)[1] for m in told]
    assert results.row_files_under(tmp_path) == [packed, plain]
    for name, data in (("bad.jsonl.gz", b"{}\n"), ("cut.jsonl.gz", gzip.compress(b"{}")[:-9])):
        rows, messages = _read_with_warnings(results.read_rows, [_bytes(tmp_path, name, data)])
        assert rows == [] and len(messages) == 1 and "cannot read it" in messages[0], messages


def _bytes(folder: pathlib.Path, name: str, data: bytes) -> pathlib.Path:
    (path := folder / name).write_bytes(data)
    return path


# ---------------------------------------------------------------- done_keys(run_id=)


def test_done_keys_of_one_run_leave_out_an_older_runs_rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    older = [row | {"run_id": "older"} for row in GOOD]
    mine = [GOOD[0] | {"run_id": "mine", "status": "ERROR", "tflops": None}]
    path.write_text("".join(json.dumps(row) + "\n" for row in [*older, *mine]))
    assert results.done_keys([path], run_id="mine") == {results.row_key(mine[0])}
    assert results.done_keys([path], run_id="mine", settled_only=True) == set()
    assert results.done_keys([path], run_id="nobody") == set()
    assert results.done_keys([path]) == {results.row_key(row) for row in older}


# ---------------------------------------------------------------- the report CLI's flags


def test_results_takes_a_path_with_a_comma_whole(tmp_path):
    folder = tmp_path / "h100,h200 runs"
    _write_damaged(folder, _line(GOOD[0]))
    run = _report(f"--results={folder}", "--summary")
    assert run.returncode == 0, run.stderr
    assert GOOD[0]["backend"] in run.stdout
    # Not a path: split on commas, and each part must exist.
    missing = _report(f"--results={folder},{tmp_path / 'nope'}", "--summary")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "no such file or directory: " in missing.stderr
    assert str(tmp_path / "nope") in missing.stderr


def _bad_out(out: pathlib.Path) -> subprocess.CompletedProcess:
    run = _report(f"--results={SAMPLE}", f"--out={out}")
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    return run


def test_out_that_cannot_be_created_is_a_one_line_usage_error():
    run = _bad_out(pathlib.Path("/proc/lcab_nope/out"))
    error = [line for line in run.stderr.splitlines() if "--out=" in line]
    assert error == [("FATAL Flags parsing error: flag --out=/proc/lcab_nope/out: cannot write "
                      "the report there: [Errno 2] No such file or directory: '/proc/lcab_nope'")]


def test_out_under_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "a_file").write_text("")
    run = _bad_out(tmp_path / "a_file" / "out")
    assert f"flag --out={tmp_path / 'a_file' / 'out'}: cannot write the report there: " \
           "[Errno 20] Not a directory" in run.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_out_in_a_read_only_folder_is_a_usage_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        run = _bad_out(locked / "out")
    finally:
        locked.chmod(0o700)
    assert "Permission denied" in run.stderr


def test_the_out_check_leaves_nothing_behind_when_the_command_is_refused(tmp_path):
    run = _report(f"--results={tmp_path / 'nope.jsonl'}", f"--out={tmp_path / 'a' / 'b'}")
    assert run.returncode != 0 and "no such file or directory" in run.stderr
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- a newer run that failed


def _older_ok_and_newer_error(tmp_path, **error_columns) -> pathlib.Path:
    """GOOD[0] measured OK, then ERROR a day later by another run (written
    first: file order must not matter), and the other good rows."""
    older = GOOD[0] | {"timestamp": "2026-01-05T09:00:00+00:00", "run_id": "older"}
    newer = GOOD[0] | {"timestamp": "2026-01-06T09:00:00+00:00", "run_id": "newer",
                       "status": "ERROR", "reason": "harness: boom", "tflops": None,
                       "median_ms": None, "p20_ms": None, "p80_ms": None, "samples_ms": None,
                       **error_columns}
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in [newer, older, *GOOD[1:]]))
    return path


def _cell(table_text: str, mask: str, seqlen: int, column: int) -> str:
    for line in _table_lines(table_text):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[:2] == [mask, str(seqlen)]:
            return cells[column]
    raise AssertionError(f"no line {mask} {seqlen} in\n{table_text}")


def test_a_newer_error_hides_the_older_number_of_the_same_measurement(tmp_path):
    path = _older_ok_and_newer_error(tmp_path)
    frame = results.load([path])
    older_number = tables.format_cell("OK", GOOD[0]["tflops"])
    table = tables.kernel_table(frame, "fwd")
    assert table.loc[(GOOD[0]["mask"], 4096), GOOD[0]["backend"]] == "ERR"
    paired = tables.paired_kernel_table(frame)
    assert paired.loc[(GOOD[0]["mask"], 4096), GOOD[0]["backend"]] == "ERR /"
    cross = tables.cross_framework_table(frame)
    assert older_number not in cross.to_string()
    summary = summary_text([path])
    column = 2 + tables.backend_order(tables.latest(frame)).index(GOOD[0]["backend"])
    assert _cell(summary, GOOD[0]["mask"], 4096, column) == "ERR"
    assert_clean_tables(summary)
    assert _cell(summary_text([path], run_id="newer"), GOOD[0]["mask"], 4096, 2) == "ERR"
    newest = [r for r in results.newest_rows(results.read_rows([path]))
              if r["backend"] == GOOD[0]["backend"] and r["mask"] == GOOD[0]["mask"]]
    assert [r["status"] for r in newest] == ["ERROR"]


def test_newest_rows_orders_by_the_instant_not_the_text():
    row = {"suite": "kernel", "backend": "b", "workload_key": "w", "direction": "fwd",
           "cp_size": 1, "strategy": None, "device": "gpu", "options": {}}
    # 10:30 UTC, written in another zone, is newer than 10:00 UTC.
    newer = row | {"timestamp": "2026-01-05T12:30:00+02:00", "status": "ERROR"}
    older = row | {"timestamp": "2026-01-05T10:00:00+00:00", "status": "OK"}
    assert [r["status"] for r in results.newest_rows([newer, older])] == ["ERROR"]


def test_a_newer_error_written_without_a_device_hides_the_older_number(tmp_path):
    # lcab.runner writes such rows when a framework process or an isolated
    # child dies before its runtime names the device (cp_size 1, no strategy).
    path = _older_ok_and_newer_error(tmp_path, device=None, n_devices=None)
    summary = summary_text([path])
    assert tables.format_cell("OK", GOOD[0]["tflops"]) not in summary
    assert_clean_tables(summary)
    frame = results.load([path])
    assert tables.kernel_table(frame, "fwd").loc[
        (GOOD[0]["mask"], 4096), GOOD[0]["backend"]] == "ERR"
    assert tables.devices(frame) == [GOOD[0]["device"]]
    newest = [r for r in results.newest_rows(results.read_rows([path]))
              if r["backend"] == GOOD[0]["backend"] and r["mask"] == GOOD[0]["mask"]]
    assert [(r["status"], r["device"]) for r in newest] == [("ERROR", GOOD[0]["device"])]


def test_an_older_error_without_a_device_gives_way_to_a_newer_number(tmp_path):
    older = GOOD[0] | {"timestamp": "2026-01-04T09:00:00+00:00", "status": "ERROR",
                       "tflops": None, "device": None, "reason": "lost"}
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in [GOOD[0], older]))
    summary = summary_text([path])
    assert tables.format_cell("OK", GOOD[0]["tflops"], checked=True) in summary
    assert "ERR" not in summary.split("Legend")[0]
    assert_clean_tables(summary)


def test_a_cp_error_without_its_context_takes_the_cp_size_and_strategy_it_repeats():
    cp = GOOD[0] | {"suite": "cp", "backend": "jax.cp_ring", "cp_size": 2, "strategy": "ring",
                    "options": {"cp_size": "2"}, "timestamp": "2026-01-05T09:00:00+00:00"}
    lost = cp | {"cp_size": 1, "strategy": None, "device": None, "status": "ERROR",
                 "tflops": None, "timestamp": "2026-01-06T09:00:00+00:00"}
    (kept,) = results.newest_rows([cp, lost])
    assert (kept["status"], kept["cp_size"], kept["strategy"]) == ("ERROR", 2, "ring")
    assert lost["device"] is None  # the rows read are not changed


def test_newest_rows_keeps_each_collective_size_and_rank_count_apart():
    def comm(op, nbytes, ranks, ms, when):
        return results.make_comm_row(
            framework="jax", op=op, bytes=nbytes, ranks=ranks, status="OK", median_ms=ms,
            device="gpu", timestamp=f"2026-11-27T10:00:0{when}+00:00")
    rows = [comm("ppermute", 1024, 2, 1.0, 0), comm("ppermute", 2048, 2, 2.0, 1),
            comm("ppermute", 1024, 4, 3.0, 2), comm("all_gather", 1024, 2, 4.0, 3),
            comm("ppermute", 1024, 2, 5.0, 4)]  # a rerun of the first
    kept = sorted(r["median_ms"] for r in results.newest_rows(rows))
    assert kept == [2.0, 3.0, 4.0, 5.0]
