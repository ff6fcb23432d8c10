"""lcab.report.sparsity: TFLOP/s against keep for block-sparse rows, their
figure, and the kernel tables' labels for a family run at several settings.

The rows are synthetic: one sample row (tests/data/sample_results.jsonl)
recast as block-sparse runs with made-up TFLOP/s.
"""

import json
import warnings

import pandas as pd
import pytest

from lcab import results
from lcab.report import figures, sparsity, tables
from tests.test_report import SAMPLE, report_of

KEEPS = (0.2, 0.5, 1.0)
BLOCKS = (64, 128)


def _tflops(backend, mask, block, keep, direction):
    """Distinct made-up numbers, so a cell shows which row it came from."""
    base = {"jax.cudnn": 300.0, "torch.flex": 200.0}[backend]
    return base * keep + block / 10 + (1.5 if direction == "bwd" else 0.0) + len(mask)


@pytest.fixture(scope="module")
def sparse():
    sample = results.load([SAMPLE])
    base = sample[(sample["suite"] == "kernel") & (sample["status"] == "OK")].iloc[0].to_dict()
    rows = [
        base | {
            "backend": backend, "framework": backend.split(".")[0], "mask": mask,
            "seqlen": 8192, "direction": direction,
            "mask_params": json.dumps({"seed": 0, "block_size": block, "keep": keep}),
            "workload_key": f"{mask}@{block}-{keep}/q8192",
            "tflops": _tflops(backend, mask, block, keep, direction),
        }
        for mask in ("block_sparse", "var_block_sparse")
        for backend in ("jax.cudnn", "torch.flex")
        for direction in ("fwd", "bwd")
        for block in BLOCKS
        for keep in KEEPS
    ]
    return pd.DataFrame(rows)


def test_the_cell_at_keep_half_is_the_rows_tflops(sparse):
    table = sparsity.sparsity_table(sparse)
    assert table.index.names == list(sparsity.SPARSITY_INDEX)
    assert list(table.columns) == ["jax.cudnn", "torch.flex"]
    for backend in table.columns:
        for direction in ("fwd", "bwd"):
            expected = _tflops(backend, "block_sparse", 128, 0.5, direction)
            assert table.loc[("block_sparse", 8192, 128, direction, 0.5), backend] == \
                f"{expected:.0f}"
    # Each (mask, seqlen, block_size, direction) group lists keep ascending.
    group = [key[-1] for key in table.index if key[:-1] == ("var_block_sparse", 8192, 64, "bwd")]
    assert group == list(KEEPS)


def test_a_failed_row_shows_its_code(sparse):
    oom = (sparse["backend"] == "torch.flex") & (sparse["mask_params"].str.contains('"keep": 1.0'))
    table = sparsity.sparsity_table(sparse.assign(status=sparse["status"].where(~oom, "OOM")))
    assert table.loc[("block_sparse", 8192, 64, "fwd", 1.0), "torch.flex"] == "E"
    expected = _tflops("jax.cudnn", "block_sparse", 64, 1.0, "fwd")
    assert table.loc[("block_sparse", 8192, 64, "fwd", 1.0), "jax.cudnn"] == f"{expected:.0f}"


def test_other_masks_give_no_sparsity_table():
    assert sparsity.sparsity_table(results.load([SAMPLE])).empty


def test_kernel_tables_keep_each_sparsity_setting_apart(sparse):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no row may be hidden behind a newer one
        paired = tables.paired_kernel_table(sparse)
    assert len(paired) == 2 * len(BLOCKS) * len(KEEPS)
    fwd = _tflops("torch.flex", "block_sparse", 128, 0.2, "fwd")
    bwd = _tflops("torch.flex", "block_sparse", 128, 0.2, "bwd")
    cell = paired.loc[("block_sparse(keep=0.2, block=128)", 8192), "torch.flex"]
    assert cell == f"{fwd:.0f} / {bwd:.0f}"
    assert ("block_sparse(keep=1, block=64)", 8192) in paired.index


def test_a_family_with_one_setting_keeps_its_plain_name(sparse):
    one = sparse[sparse["mask_params"].str.contains('"keep": 0.5')
                 & sparse["mask_params"].str.contains('"block_size": 128')]
    assert set(tables.kernel_table(one, "fwd").index) == {
        ("block_sparse", 8192), ("var_block_sparse", 8192)}
    labelled = tables.label_mask_settings(sparse)
    assert tables.label_mask_settings(labelled)["mask"].tolist() == labelled["mask"].tolist()


def test_the_sparsity_figure_is_written(sparse, tmp_path):
    path = figures.sparsity_figure(sparse, "block_sparse", tmp_path / "sparsity.png")
    assert path.exists() and path.stat().st_size > 10_000


def _curves(ax) -> dict[str, list[float]]:
    """Each drawn line's label and y values (one error-bar container a line)."""
    return {c.get_label(): [float(y) for y in c.lines[0].get_ydata()] for c in ax.containers}


def test_the_sparsity_figure_shows_median_ms_for_cpu_rows_as_the_tables_do(sparse):
    cpu = sparse.assign(device="cpu", median_ms=1000.0 / sparse["tflops"])
    cpu = cpu.assign(p20_ms=cpu["median_ms"] * 0.9, p80_ms=cpu["median_ms"] * 1.2)
    fig = figures.draw_sparsity(cpu, "block_sparse")
    ax = fig.axes[0]
    assert ax.get_title() == "8k, block 64: forward"
    assert all(axes.get_ylabel() == "median ms" for axes in fig.axes)
    assert _curves(ax)["torch.flex"] == pytest.approx(
        [1000.0 / _tflops("torch.flex", "block_sparse", 64, keep, "fwd") for keep in KEEPS])
    assert "median ms against keep" in fig.get_suptitle()
    # The same rows on a GPU: TFLOP/s.
    gpu = figures.draw_sparsity(sparse, "block_sparse").axes[0]
    assert gpu.get_ylabel() == "TFLOP/s"
    assert _curves(gpu)["torch.flex"] == pytest.approx(
        [_tflops("torch.flex", "block_sparse", 64, keep, "fwd") for keep in KEEPS])


def test_a_mask_whose_rows_all_failed_still_gets_a_figure_that_says_so(sparse, tmp_path):
    failed = sparse.assign(status="OOM", tflops=None, median_ms=None)
    fig = figures.draw_sparsity(failed, "block_sparse")
    assert any("nothing measured" in text.get_text() for text in fig.texts)
    assert figures.sparsity_figure(failed, "block_sparse", tmp_path / "failed.png").exists()


def test_the_cli_writes_the_sparsity_files_and_indexes_them(sparse, tmp_path):
    out = report_of(sparse, tmp_path)
    for name in ("sparsity.md", "sparsity.csv", "figures/sparsity_block_sparse.png",
                 "figures/sparsity_var_block_sparse.png"):
        assert (out / name).exists(), name
    # A swept mask is one point per setting in the kernel and memory
    # figures: the sparsity figure draws it, they do not.
    assert not list((out / "figures").glob("kernel_block_sparse_keep_*"))
    assert not (out / "memory.md").exists()  # the rows have no peak memory
    csv = pd.read_csv(out / "sparsity.csv", dtype=str, keep_default_na=False)
    assert list(csv.columns) == ["setting", *sparsity.SPARSITY_INDEX, "jax.cudnn", "torch.flex"]
    half = csv[(csv["mask"] == "block_sparse") & (csv["block_size"] == "128")
               & (csv["direction"] == "fwd") & (csv["keep"] == "0.5")]
    expected = _tflops("jax.cudnn", "block_sparse", 128, 0.5, "fwd")
    assert half["jax.cudnn"].tolist() == [f"{expected:.0f}"]
    index = (out / "README.md").read_text()
    assert "[sparsity.md](sparsity.md)" in index
    assert "![sparsity_block_sparse](figures/sparsity_block_sparse.png)" in index
