"""lcab.report.export: the tidy CSV, one number per column, read back by pandas.

Synthetic rows (tests/test_report_rows.py): made-up numbers.
"""

import pandas as pd
import pytest

from lcab.report import export, sources
from tests.test_report_rows import COMMIT, DATE, row, write


@pytest.fixture()
def folder(tmp_path):
    sparse = {"seed": 0, "keep": 0.2, "block_size": 128}
    return write(tmp_path / "rows", [
        # median 10 ms, so p20 = 9 and p80 = 12.5 (row(): 0.9 and 1.25 of it)
        row("jax.a", tflops=200.0, median_ms=10.0, peak_mem_bytes=3 * 2**30,
            clocks={"polls": 40, "sm_mhz": 1755.0, "power_w": 690.5}),
        row("torch.b", status="UNSUPPORTED", reason="no such mask, torch.b says"),
        row("jax.a", mask="block_sparse", mask_params=sparse, tflops=50.0, checked=False),
        # An older run of jax.a's first measurement: the newer row wins.
        row("jax.a", tflops=1.0, timestamp="2026-11-27T10:00:00+00:00"),
    ])


def test_the_csv_reads_back_as_numbers(folder, tmp_path):
    tidy = export.tidy(sources.load([folder]), sweep="demo")
    csv = export.write(tidy, tmp_path / "out")[0]
    back = pd.read_csv(csv)
    assert list(back.columns) == list(export.COLUMNS)
    assert len(back) == 3  # the newest row of each measurement
    for column in export.NUMBER_COLUMNS:
        assert pd.api.types.is_numeric_dtype(back[column]), column

    ok = back[(back["backend"] == "jax.a") & (back["mask"] == "causal")].iloc[0]
    assert ok["tflops"] == 200.0 and ok["median_ms"] == 10.0
    assert ok["p20_ms"] == pytest.approx(9.0) and ok["p80_ms"] == pytest.approx(12.5)
    # TFLOP/s at the p20 time is the upper end: the same FLOPs in less time.
    assert ok["tflops_at_p20_ms"] == pytest.approx(200.0 * 10 / 9)
    assert ok["tflops_at_p80_ms"] == pytest.approx(160.0)
    assert ok["peak_mem_bytes"] == 3 * 2**30 and ok["check_err"] == 0.01
    assert (ok["seqlen"], ok["heads_q"], ok["head_dim"], ok["cp_size"]) == (8192, 8, 128, 1)
    assert (ok["status"], ok["sweep"], ok["commit"], ok["date"]) == ("OK", "demo", COMMIT, DATE)
    assert ok["source"].endswith("rows/kernel_test.jsonl")
    assert pd.isna(ok["reason"])
    # The clocks the samples ran at; a row without them (older, or no
    # nvidia-smi) leaves both empty.
    assert (ok["sm_mhz"], ok["power_w"]) == (1755.0, 690.5)
    sparse = back[back["mask"] == "block_sparse"].iloc[0]
    assert pd.isna(sparse["sm_mhz"]) and pd.isna(sparse["power_w"])

    failed = back[back["backend"] == "torch.b"].iloc[0]
    assert failed["status"] == "UNSUPPORTED" and failed["reason"] == "no such mask, torch.b says"
    assert failed[["median_ms", "tflops", "tflops_at_p20_ms"]].isna().all()

    sparse = back[back["mask"] == "block_sparse"].iloc[0]
    assert (sparse["keep"], sparse["block_size"]) == (0.2, 128)
    assert pd.isna(sparse["check_err"])  # not checked: empty, not a code
    assert pd.isna(ok["keep"])


def test_without_pyarrow_only_the_csv_is_written(folder, tmp_path, monkeypatch):
    monkeypatch.setattr(export, "parquet_available", lambda: False)
    tidy = export.tidy(sources.load([folder]))
    assert [p.name for p in export.write(tidy, tmp_path)] == ["results.csv"]


def test_with_pyarrow_the_parquet_holds_the_same_rows(folder, tmp_path):
    pytest.importorskip("pyarrow")
    tidy = export.tidy(sources.load([folder]))
    written = export.write(tidy, tmp_path)
    back = pd.read_parquet(written[1])
    assert back["tflops"].tolist() == pytest.approx(tidy["tflops"].tolist(), nan_ok=True)


def test_every_column_is_documented():
    page = export.columns_markdown()
    assert 'pandas.read_csv("results.csv")' in page
    assert all(f"| `{column}` |" in page for column in export.COLUMNS)
