"""lcab.report.memory: the peak-memory table, its figure and its CLI files.

Rows are tests/data/sample_results.jsonl (synthetic) given synthetic
peak_mem_bytes; GiB = 2**30 bytes throughout.
"""


import pandas as pd
import pytest

from lcab import results
from lcab.report import figures, memory, tables
from tests.test_report import SAMPLE, report_of

GIB = 2**30


@pytest.fixture(scope="module")
def frame():
    """The sample rows, every one with its own peak: (position + 1) * 0.3 GiB."""
    sample = results.load([SAMPLE])
    return sample.assign(peak_mem_bytes=[int((i + 1) * 0.3 * GIB) for i in range(len(sample))])


def _row(frame, backend, mask, seqlen, direction):
    newest = tables.latest(frame)
    found = newest[(newest["backend"] == backend) & (newest["mask"] == mask)
                   & (newest["seqlen"] == seqlen) & (newest["direction"] == direction)
                   & (newest["suite"] == "kernel")]
    assert len(found) == 1
    return found.iloc[0]


def test_a_cell_is_the_peak_in_gib_fwd_then_bwd(frame):
    table = memory.memory_table(frame)
    assert table.index.names == ["mask", "seqlen"]
    fwd = _row(frame, "jax.cudnn", "full", 4096, "fwd")["peak_mem_bytes"]
    bwd = _row(frame, "jax.cudnn", "full", 4096, "bwd")["peak_mem_bytes"]
    assert table.loc[("full", 4096), "jax.cudnn"] == f"{fwd / GIB:.2f} / {bwd / GIB:.2f}"
    assert memory.format_gib(3 * GIB) == "3.00"
    assert memory.format_gib(0.25 * GIB) == "0.25"
    assert memory.format_gib(0.0123 * GIB) == "0.012"  # small: two significant digits


def test_a_row_that_is_not_ok_gives_an_empty_side(frame):
    table = memory.memory_table(frame)
    # The sample's torch.flex full 4096 bwd is MISMATCH, jax.cudnn's causal_document UNSUPPORTED.
    assert _row(frame, "torch.flex", "full", 4096, "bwd")["status"] == "MISMATCH"
    fwd = _row(frame, "torch.flex", "full", 4096, "fwd")["peak_mem_bytes"]
    assert table.loc[("full", 4096), "torch.flex"] == f"{fwd / GIB:.2f} /"
    assert _row(frame, "jax.cudnn", "causal_document", 4096, "fwd")["status"] == "UNSUPPORTED"
    assert table.loc[("causal_document", 4096), "jax.cudnn"] == ""


def test_a_row_without_a_peak_gives_an_empty_cell_and_none_gives_no_table(frame):
    cudnn = frame["backend"] == "jax.cudnn"
    unknown = frame.assign(peak_mem_bytes=frame["peak_mem_bytes"].astype(object).where(
        ~cudnn, None))
    assert "jax.cudnn" not in memory.memory_table(unknown).columns
    assert memory.memory_table(results.load([SAMPLE])).empty  # the sample has no peaks


def test_columns_follow_the_kernel_tables_and_settings_stay_apart(frame):
    kernel = frame[frame["suite"] == "kernel"]
    assert list(memory.memory_table(kernel).columns) == list(tables.kernel_table(kernel, "fwd"))
    mixed = frame.assign(head_dim=frame["head_dim"].where(frame["backend"] != "jax.xla", 64))
    with pytest.raises(ValueError, match="setting_groups"):
        memory.memory_table(mixed)
    assert len([1 for _, group in tables.setting_groups(mixed)
                if len(memory.memory_table(group))]) == 2


def test_the_memory_figure_is_written(frame, tmp_path):
    path = figures.memory_figure(frame, "causal", tmp_path / "memory_causal.png")
    assert path.exists() and path.stat().st_size > 10_000


def test_the_cli_writes_the_memory_files_and_indexes_them(frame, tmp_path):
    out = report_of(frame, tmp_path)
    for name in ("memory.md", "memory.csv", "figures/memory_full.png",
                 "figures/memory_causal.png", "figures/memory_causal_document.png"):
        assert (out / name).exists(), name
    text = (out / "memory.md").read_text()
    assert "GiB (2^30 bytes)" in text
    fwd = _row(frame, "jax.cudnn", "full", 4096, "fwd")["peak_mem_bytes"]
    csv = pd.read_csv(out / "memory.csv", dtype=str, keep_default_na=False)
    assert list(csv.columns[:3]) == ["setting", "mask", "seqlen"]
    assert csv.loc[0, "jax.cudnn"].startswith(f"{fwd / GIB:.2f} / ")
    index = (out / "README.md").read_text()
    assert "[memory.md](memory.md)" in index
    assert "![memory_full](figures/memory_full.png)" in index
