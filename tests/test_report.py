"""lcab.report: tables, figures and the CLI, on a small synthetic sample.

tests/data/sample_results.jsonl is hand-made test data (device
"synthetic-test-device"), not measurements. Its TFLOP/s follow
base[backend] * mask factor * seqlen factor * direction factor, e.g.
jax.cudnn full 4096 fwd = 402.4, bwd = 402.4 * 0.8 = 321.92.
"""

import pathlib
import subprocess
import sys

import matplotlib.image
import pandas as pd
import pytest

from lcab import results
from lcab.report import (
    cp_table,
    cross_framework_table,
    export,
    figures,
    kernel_table,
    latest,
    legend,
    paired_kernel_table,
    setting_groups,
    short_table,
    tables,
    to_markdown,
)
from tests import experiment_scripts

ROOT = pathlib.Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "data" / "sample_results.jsonl"
DEVICE = "synthetic-test-device"
SETTING = f"batch 1, heads 64:8, head_dim 128, bfloat16 on {DEVICE}"
BACKENDS = ["jax.cudnn", "jax.xla", "torch.flex", "torch.sdpa_math"]


@pytest.fixture(scope="module")
def frame():
    return results.load([SAMPLE])


def test_sample_rows_have_the_schema_and_are_marked_synthetic(frame):
    assert list(frame.columns) == list(results.COLUMNS)
    assert 30 <= len(frame) <= 70
    assert set(frame["device"]) == {DEVICE}
    assert {"OOM", "UNSUPPORTED", "OK"} <= set(frame["status"])


def test_kernel_table_shows_rounded_tflops_and_status_codes(frame):
    fwd, bwd = kernel_table(frame, "fwd"), kernel_table(frame, "bwd")
    assert list(fwd.columns) == BACKENDS  # jax first, then torch, alphabetical inside
    assert list(fwd.index) == [
        ("full", 4096), ("full", 8192), ("causal", 4096), ("causal", 8192),
        ("causal_document", 4096), ("causal_document", 8192),
    ]
    assert fwd.loc[("full", 4096), "jax.cudnn"] == "402"  # 402.4
    assert bwd.loc[("full", 4096), "jax.cudnn"] == "322"  # 321.92
    assert fwd.loc[("full", 8192), "jax.cudnn"] == "443"  # 442.64
    assert bwd.loc[("full", 8192), "torch.sdpa_math"] == "E"  # OOM
    assert fwd.loc[("causal_document", 4096), "jax.cudnn"] == "X"  # UNSUPPORTED
    assert bwd.loc[("causal_document", 8192), "jax.xla"] == "ERR"
    assert bwd.loc[("full", 4096), "torch.flex"] == "MM"


def test_kernel_table_leaves_unmeasured_cells_empty(frame):
    without = frame[~((frame["backend"] == "jax.xla") & (frame["mask"] == "causal"))]
    table = kernel_table(without, "fwd")
    assert table.loc[("causal", 4096), "jax.xla"] == ""
    assert table.loc[("full", 4096), "jax.xla"] == "101"


def test_the_paired_table_shows_fwd_and_bwd_and_drops_backends_never_installed(frame):
    paired = paired_kernel_table(frame)
    assert paired.loc[("full", 4096), "jax.cudnn"] == "402 / 322"
    assert paired.loc[("full", 8192), "torch.sdpa_math"].endswith(" / E")
    assert paired.loc[("causal_document", 4096), "jax.cudnn"] == "X / X"
    forward_only = paired_kernel_table(frame[frame["direction"] == "fwd"])
    assert forward_only.loc[("full", 4096), "jax.cudnn"] == "402 /"
    absent = frame.assign(status=frame["status"].where(
        frame["backend"] != "jax.cudnn", "UNAVAILABLE"))
    assert "jax.cudnn" not in paired_kernel_table(absent).columns
    assert list(paired_kernel_table(absent).columns) == [b for b in BACKENDS if b != "jax.cudnn"]


def test_kernel_table_rejects_a_bad_direction(frame):
    with pytest.raises(ValueError, match="direction='fwd_bwd'"):
        kernel_table(frame, "fwd_bwd")


def test_latest_keeps_the_newest_rerun(frame):
    assert len(frame) == 63 and len(latest(frame)) == 62
    rerun = latest(frame).query(
        "backend == 'torch.flex' and mask == 'causal' and seqlen == 8192 and direction == 'fwd'"
    )
    # The older row (250.2, a day earlier) comes later in the file: order must not matter.
    assert rerun["tflops"].tolist() == [pytest.approx(298.68)]
    assert kernel_table(frame, "fwd").loc[("causal", 8192), "torch.flex"] == "299"


def test_cross_framework_picks_the_best_ok_backend_of_each_side(frame):
    table = cross_framework_table(frame)
    row = table.loc[("full", 4096, "bwd")]
    # torch.flex is MISMATCH there, so the best torch backend is sdpa_math.
    assert row["best jax"] == "jax.cudnn" and row["jax TFLOP/s"] == "322"
    assert row["best torch"] == "torch.sdpa_math" and row["torch TFLOP/s"] == "65"
    assert row["jax/torch"] == f"{321.92 / 64.96:.2f}" == "4.96"
    # jax.xla errored and jax.cudnn is unsupported: no JAX side, no ratio.
    empty = table.loc[("causal_document", 8192, "bwd")]
    assert empty["best jax"] == "" and empty["jax/torch"] == ""
    assert empty["best torch"] == "torch.flex"


def test_cp_table(frame):
    table = cp_table(frame)
    assert list(table.columns) == ["ring/jax.cp_ring", "usp/torch.cp_usp"]
    assert table.index.names == ["mask", "seqlen", "direction", "cp_size"]
    assert table.loc[("causal", 8192, "fwd", 1), "ring/jax.cp_ring"] == "380"
    assert table.loc[("causal", 8192, "fwd", 1), "usp/torch.cp_usp"] == ""  # never run
    assert table.loc[("causal", 8192, "bwd", 8), "usp/torch.cp_usp"] == "E"
    assert [key[3] for key in table.index[:4]] == [1, 2, 4, 8]


def test_short_table(frame):
    text = short_table(frame)
    assert SETTING in text
    assert "| full            | 4096   | 402 / 322 |" in text
    assert "X / X" in text and "67 / ERR" in text and "302 / MM" in text
    assert "271 / E" in text  # the CP table
    assert legend.one_line() in text
    assert text.rstrip().endswith(f"Device: {DEVICE}")


def test_tables_are_split_by_setting(frame):
    mixed = frame.copy()
    mixed.loc[mixed["backend"] == "torch.flex", "head_dim"] = 64
    labels = [label for label, _ in setting_groups(mixed)]
    assert labels == [SETTING, SETTING.replace("head_dim 128", "head_dim 64")]
    with pytest.raises(ValueError, match="setting_groups"):
        kernel_table(mixed, "fwd")
    assert short_table(mixed).count("**Kernels") == 2


def test_to_markdown_needs_no_tabulate(monkeypatch):
    monkeypatch.setitem(sys.modules, "tabulate", None)  # importing it would fail
    table = pd.DataFrame(
        {"a|b": ["1", "x|y"], "n": ["10", "E"]},
        index=pd.Index(["r1", "r2"], name="row"),
    )
    lines = to_markdown(table).splitlines()
    assert len(lines) == 4
    assert [cell.strip() for cell in lines[0].strip("|").split(" | ")] == ["row", "a\\|b", "n"]
    assert lines[1].startswith("|:") and lines[1].endswith(":|")  # index left, numbers right
    assert "x\\|y" in lines[3]


def test_unknown_status_is_named_in_the_error():
    with pytest.raises(ValueError, match="status='CRASHED'"):
        tables.format_cell("CRASHED", float("nan"))


def test_figure_for_a_mask_without_rows_says_which_masks_exist(frame, tmp_path):
    with pytest.raises(ValueError, match="mask='sliding_window'.*causal_document"):
        figures.kernel_figure(frame, "sliding_window", tmp_path / "x.png")


def test_importing_lcab_report_does_not_import_matplotlib():
    code = "import sys, lcab.report; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def _report(*args):
    return subprocess.run(
        [sys.executable, "-m", "lcab.report", *args], capture_output=True, text=True, cwd=ROOT
    )


def report_of(frame, tmp_path):
    """`python -m lcab.report --out` on the frame's rows; the output folder."""
    rows = tmp_path / "rows.jsonl"
    writer = results.Writer(rows)
    for row in frame.to_dict("records"):
        writer.write(row)
    out = tmp_path / "report"
    result = _report("--results", str(rows), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def test_cli_writes_every_table_figure_and_the_index(tmp_path):
    # Repeated and comma-separated paths both work; the duplicates collapse in latest().
    result = _report("--results", f"{SAMPLE},{SAMPLE.parent}", "--results", str(SAMPLE),
                     "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    expected = {
        "kernel_fwd.md", "kernel_fwd.csv", "kernel_bwd.md", "kernel_bwd.csv",
        "kernel.md", "kernel.csv", "cross_framework.md", "cross_framework.csv", "cp.md", "cp.csv",
        "cp_cross_framework.md", "cp_cross_framework.csv", "README.md",
        "cp_beside_single_jax.md", "cp_beside_single_jax.csv",
        "cp_beside_single_torch.md", "cp_beside_single_torch.csv",
        "figures/kernel_full.png", "figures/kernel_causal.png",
        "figures/kernel_causal_document.png", "figures/cp_causal.png",
        "results.csv", "export.md",  # the tidy export (lcab.report.export) and its columns
    } | ({"results.parquet"} if export.parquet_available() else set())
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    written = {path.relative_to(tmp_path).as_posix() for path in files}
    assert written == expected
    printed = {
        pathlib.Path(line).relative_to(tmp_path).as_posix() for line in result.stdout.split()
    }
    assert printed == expected

    for name in expected - {"README.md", "results.csv", "export.md", "results.parquet"}:
        if name.endswith(".png"):
            image = matplotlib.image.imread(tmp_path / name)
            assert image.shape[0] >= 400 and image.shape[1] >= 800, (name, image.shape)
            assert image[..., :3].std() > 0.05, f"{name} looks blank"

    fwd = pd.read_csv(tmp_path / "kernel_fwd.csv", dtype=str, keep_default_na=False)
    assert list(fwd.columns) == ["setting", "mask", "seqlen", *BACKENDS]
    assert fwd.loc[0, "jax.cudnn"] == "402" and (fwd["setting"] == SETTING).all()
    assert "| causal_document | 4096   |         X |" in (tmp_path / "kernel_fwd.md").read_text()

    index = (tmp_path / "README.md").read_text()
    assert DEVICE in index and "2026-01-05" in index and legend.one_line() in index
    assert "![kernel_causal_document](figures/kernel_causal_document.png)" in index
    assert "| full            | 4096   | fwd       | jax.cudnn |" in index  # cross-framework


@pytest.mark.parametrize(
    "args, message",
    [
        (["--out", "OUT"], "--results must have a value"),
        (["--results", "nope.jsonl", "--out", "OUT"], "no such file or directory: nope.jsonl"),
        (["--results", f"{SAMPLE},missing2.jsonl", "--out", "OUT"], "missing2.jsonl"),
        (["--results", str(SAMPLE)], "--out must have a value (or give --summary"),
    ],
)
def test_cli_rejects_bad_flags(tmp_path, args, message):
    result = _report(*(str(tmp_path / "out") if arg == "OUT" else arg for arg in args))
    assert result.returncode != 0
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


def test_cli_prints_the_short_summary_table(tmp_path):
    result = _report("--results", str(SAMPLE), "--summary")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == short_table(results.load([SAMPLE]))
    both = _report("--results", str(SAMPLE), "--summary", "--out", str(tmp_path))
    assert both.returncode == 0 and "Legend:" in both.stdout
    assert (tmp_path / "README.md").exists()


def _cp_sample():
    """Two CP rows per framework and the single-GPU rows of their inner
    kernels, on one workload (synthetic numbers, measured after every
    registered kernel change: no figure is marked)."""
    frame = results.load([SAMPLE]).assign(timestamp="2099-01-01T00:00:00+00:00")
    kernel = frame[(frame["suite"] == "kernel") & (frame["mask"] == "causal")
                   & (frame["seqlen"] == 8192) & (frame["status"] == "OK")]
    key = kernel["workload_key"].iloc[0]
    rows = []
    for backend, tflops in (("jax.pallas_flex", 400.0), ("torch.flex", 300.0)):
        for direction in ("fwd", "bwd"):
            base = kernel[kernel["direction"] == direction].iloc[0].copy()
            rows.append(base.to_dict() | {
                "backend": backend, "framework": backend.split(".")[0], "tflops": tflops,
                "direction": direction})
    for backend, strategy, inner, tflops in (
            ("jax.cp_ring", "ring", "jax.pallas_flex", 380.0),
            ("jax.cp_allgather", "allgather", "jax.pallas_flex", 390.0),
            ("torch.cp_ring_flex", "ring", "torch.flex", 240.0),
            ("torch.cp_native", "native", None, 330.0)):
        for direction in ("fwd", "bwd"):
            base = kernel[kernel["direction"] == direction].iloc[0].copy()
            notes = f"{strategy}; dispatch=zigzag; " + (f"inner {inner} (x)" if inner else "SDPA")
            rows.append(base.to_dict() | {
                "backend": backend, "framework": backend.split(".")[0], "suite": "cp",
                "strategy": strategy, "cp_size": 2, "tflops": tflops, "notes": notes,
                "workload_key": key, "direction": direction})
    return pd.DataFrame(rows)


def test_cp_cross_framework_table_pairs_the_best_strategies_per_cp_size():
    table = cross_framework_table(_cp_sample(), suite="cp")
    assert table.index.names == ["mask", "seqlen", "direction", "cp_size"]
    row = table.loc[("causal", 8192, "fwd", 2)]
    assert list(row) == ["jax.cp_allgather", "390", "torch.cp_native", "330", "1.18"]


def test_runs_with_other_options_are_other_lines_not_hidden_rows():
    frame = _cp_sample()
    ring = frame["backend"] == "jax.cp_ring"
    frame.loc[ring, "options"] = '{"cp_size": "2", "dispatch": "zigzag"}'
    contiguous = frame[ring].assign(options='{"cp_size": "2", "dispatch": "contiguous"}',
                                    tflops=100.0)
    both = pd.concat([frame, contiguous], ignore_index=True)
    assert len(latest(both)) == len(both)  # two measurements, not a rerun
    table = tables.cp_table(both)
    row = table.loc[("causal", 8192, "fwd", 2)]
    assert row["ring/jax.cp_ring [dispatch=contiguous]"] == "100"
    assert row["ring/jax.cp_ring [dispatch=zigzag]"] == "380"
    assert row["allgather/jax.cp_allgather"] == "390"  # one option set: no suffix
    # The cp size is a table column already: another cp size is not another line.
    cp4 = frame[ring].assign(options='{"cp_size": "4", "dispatch": "zigzag"}', cp_size=4)
    assert "ring/jax.cp_ring" in tables.cp_table(pd.concat([frame, cp4], ignore_index=True))


def test_a_kernel_run_with_other_options_is_another_column(frame):
    xla = frame["backend"] == "jax.xla"
    tuned = frame[xla].assign(options='{"block": "64"}', tflops=frame[xla]["tflops"] * 2)
    both = pd.concat([frame.assign(options=frame["options"].where(~xla, '{"block": "128"}')),
                      tuned], ignore_index=True)
    table = kernel_table(both, "fwd")
    assert list(table.columns) == ["jax.cudnn", "jax.xla [block=128]", "jax.xla [block=64]",
                                   "torch.flex", "torch.sdpa_math"]
    assert table.loc[("full", 4096), "jax.xla [block=128]"] == "101"
    assert table.loc[("full", 4096), "jax.xla [block=64]"] == "203"  # 2 x 101.4
    assert list(kernel_table(frame, "fwd").columns) == BACKENDS  # one set: plain names


def test_cp_over_single_gpu_uses_each_strategys_own_inner_kernel():
    table = tables.cp_vs_single_table(_cp_sample())
    cell = table.loc[("causal", 8192, "fwd", 2)]
    assert cell["ring/jax.cp_ring"] == "380 / 400 = 0.95"
    assert cell["ring/torch.cp_ring_flex"] == "240 / 300 = 0.80"
    assert "native/torch.cp_native" not in table.columns  # names no inner kernel


def test_the_inner_column_names_the_inner_kernel_and_its_options():
    frame = _cp_sample().astype({"inner": object, "inner_options": object})
    ring = frame["backend"] == "jax.cp_ring"
    # A row with the columns: its notes need not name the inner kernel.
    frame.loc[ring, "notes"] = "ring; dispatch=zigzag"
    frame.loc[ring, "inner"] = "jax.pallas_flex"
    frame.loc[ring, "inner_options"] = '{"fused_backward": "true"}'
    variant = frame[frame["backend"] == "jax.pallas_flex"].assign(
        options='{"fused_backward": "true"}', tflops=190.0)
    table = tables.cp_vs_single_table(pd.concat([frame, variant], ignore_index=True))
    cell = table.loc[("causal", 8192, "fwd", 2)]
    assert cell["ring/jax.cp_ring"] == "380 / 190 = 2.00"  # the variant it ran inside
    assert cell["allgather/jax.cp_allgather"] == "390 / 400 = 0.97"  # an older row: its notes
    assert tables.inner_kernel({"inner": None, "notes": "x; inner torch.flex (y)"}) == "torch.flex"
    assert tables.inner_kernel({"inner": "jax.xla", "notes": "inner jax.fa3"}) == "jax.xla"
    assert tables.inner_kernel({"notes": "SDPA"}) is None


def test_cp_over_single_gpu_compares_with_the_inner_kernel_the_cp_run_ran():
    frame = _cp_sample()
    flex = frame[frame["backend"] == "jax.pallas_flex"]
    # A newer single-GPU run of a variant (an option the CP rows lack) is not the baseline...
    variant = flex.assign(options='{"fused_backward": "true"}', tflops=57.0,
                          timestamp="2099-01-01T00:00:00+00:00")
    table = tables.cp_vs_single_table(pd.concat([frame, variant], ignore_index=True))
    assert table.loc[("causal", 8192, "bwd", 2), "ring/jax.cp_ring"] == "380 / 400 = 0.95"
    # ...but it is for a CP run that handed the same option to its inner kernel.
    ring = frame[frame["backend"] == "jax.cp_ring"].assign(
        options='{"cp_size": "2", "fused_backward": "true"}', tflops=114.0)
    table = tables.cp_vs_single_table(pd.concat([flex, variant, ring], ignore_index=True))
    assert table.loc[("causal", 8192, "bwd", 2), "ring/jax.cp_ring"] == "114 / 57 = 2.00"


def test_cp_beside_single_puts_each_frameworks_lines_after_its_inner_kernels():
    frame = _cp_sample()
    variant = frame[frame["backend"] == "jax.pallas_flex"].assign(
        options='{"fused_backward": "true"}', tflops=57.0)
    jax = tables.cp_beside_single_table(pd.concat([frame, variant], ignore_index=True), "jax")
    assert jax.index.names == ["mask", "seqlen", "cp_size"]
    assert list(jax.columns) == ["1 GPU jax.pallas_flex", "allgather/jax.cp_allgather",
                                 "ring/jax.cp_ring"]
    assert list(jax.loc[("causal", 8192, 2)]) == ["400 / 400", "390 / 390", "380 / 380"]
    torch = tables.cp_beside_single_table(frame, "torch")
    # cp_native names no inner kernel: no single-GPU column of its own.
    assert list(torch.columns) == ["1 GPU torch.flex", "native/torch.cp_native",
                                   "ring/torch.cp_ring_flex"]
    assert torch.loc[("causal", 8192, 2), "ring/torch.cp_ring_flex"] == "240 / 240"
    assert tables.cp_beside_single_table(frame[frame["suite"] == "kernel"], "jax").empty


def test_the_cp_figure_shows_median_ms_for_cpu_rows_as_the_tables_do():
    frame = _cp_sample()
    cpu = frame.assign(device="cpu", median_ms=1000.0 / frame["tflops"])
    fig = figures.draw_cp(cpu, "causal")
    ax = fig.axes[0]
    assert [axes.get_ylabel() for axes in fig.axes] == ["median ms", "median ms"]
    curves = {c.get_label(): list(c.lines[0].get_ydata()) for c in ax.containers}
    assert curves["ring/jax.cp_ring"] == [pytest.approx(1000.0 / 380.0)]
    # The single-GPU inner kernel's line, in the same measure.
    references = {line.get_label(): line.get_ydata()[0] for line in ax.get_lines()}
    assert references["1 GPU jax.pallas_flex"] == pytest.approx(1000.0 / 400.0)
    # The same rows on a GPU: per-GPU TFLOP/s.
    gpu = figures.draw_cp(frame, "causal").axes[0]
    assert gpu.get_ylabel() == "TFLOP/s per GPU"
    assert {c.get_label(): list(c.lines[0].get_ydata()) for c in gpu.containers}[
        "ring/jax.cp_ring"] == [pytest.approx(380.0)]


def test_the_report_writes_the_cp_comparisons(tmp_path):
    path = tmp_path / "rows.jsonl"
    writer = results.Writer(path)
    for row in _cp_sample().to_dict("records"):
        writer.write(row)
    result = _report("--results", str(path), "--out", str(tmp_path / "report"))
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "report" / "cp_vs_single.md").read_text()
    assert "380 / 400 = 0.95" in text
    assert (tmp_path / "report" / "cp_cross_framework.csv").exists()


def test_the_readme_cp_targets_come_from_the_committed_h100_rows():
    """README, the CP targets: the JAX ring at cp 2 over jax.pallas_flex
    on one GPU (4 x H100, three sessions, 2026-11-26), under the balanced
    and the ring_balanced dispatch. Every figure carries † on both sides:
    pallas_flex's backward and its forward changed since (the marks are
    per kernel and direction, not per lowering)."""
    frame = results.load([ROOT / "results/gpu/2026-11-26-h100x4-cp",
                          ROOT / "results/gpu/2026-11-26-h100x4-cp2",
                          ROOT / "results/gpu/2026-11-26-h100x4-cp3"])
    table = tables.cp_vs_single_table(frame)
    ring = table["ring/jax.cp_ring [dispatch=balanced]"]
    even = table["ring/jax.cp_ring [dispatch=ring_balanced]"]
    assert ring.loc[("full", 131072, "fwd", 2)] == "394†4 / 397†4 = 0.99"
    assert ring.loc[("full", 131072, "bwd", 2)] == "144†2,5,11 / 145†2,5,11 = 0.99"
    assert ring.loc[("causal_document", 131072, "fwd", 2)] == "395†4 / 425†4 = 0.93"
    assert ring.loc[("causal_document", 131072, "bwd", 2)] == "127†2,5,11 / 161†2,5,11 = 0.79"
    assert ring.loc[("causal_document", 65536, "bwd", 2)] == "143†2,5,11 / 165†2,5,11 = 0.87"
    assert ring.loc[("causal_document", 16384, "fwd", 2)] == "141†4 / 200†4 = 0.70"
    assert even.loc[("causal_document", 65536, "fwd", 2)] == "412†4 / 435†4 = 0.95"
    assert even.loc[("causal_document", 65536, "bwd", 2)] == "159†2,5,11 / 165†2,5,11 = 0.96"
    assert even.loc[("causal_document", 131072, "fwd", 2)] == "412†4 / 425†4 = 0.97"
    assert even.loc[("causal_document", 131072, "bwd", 2)] == "159†2,5,11 / 161†2,5,11 = 0.99"
    assert even.loc[("causal_document", 16384, "fwd", 2)] == "140†4 / 200†4 = 0.70"
    assert even.loc[("causal_document", 16384, "bwd", 2)] == "84†2,5,11 / 106†2,5,11 = 0.79"
    # The fused-backward single-GPU rows of the third session are not the baseline.
    assert ring.loc[("full", 16384, "bwd", 2)] == "154†2,5,11 / 156†2,5,11 = 0.99"


def test_the_readme_ring_at_8k_per_gpu_comes_from_the_committed_2_gpu_rows():
    """README, the ring at 8k tokens per GPU (2 x H100, 2026-11-26): the
    ring's merges in the kernels measured (v3), then the ring with
    jax.pallas_flex v4, each against the one-GPU kernel of the same call
    (every figure predates pallas_flex's later changes: †)."""
    folder = ROOT / "results/gpu/2026-11-26-h100x2-cp4"
    merges = tables.cp_vs_single_table(results.load([folder / "call1"]))
    separate = merges["ring/jax.cp_ring [dispatch=ring_balanced, merge=-]"]
    in_kernel = merges["ring/jax.cp_ring [dispatch=ring_balanced, merge=in_kernel]"]
    assert separate.loc[("causal_document", 16384, "fwd", 2)] == "141†4 / 202†4 = 0.70"
    assert separate.loc[("causal_document", 16384, "bwd", 2)] == "132†2,5,11 / 188†2,5,11 = 0.71"
    assert in_kernel.loc[("causal_document", 16384, "fwd", 2)] == "133†4 / 202†4 = 0.66"
    assert in_kernel.loc[("causal_document", 16384, "bwd", 2)] == "109†2,5,11 / 188†2,5,11 = 0.58"
    v4 = tables.cp_vs_single_table(results.load([folder / "call6"]))
    ring = v4["ring/jax.cp_ring [dispatch=ring_balanced]"]
    assert ring.loc[("causal_document", 16384, "fwd", 2)] == "142†4 / 201†4 = 0.70"
    assert ring.loc[("causal_document", 16384, "bwd", 2)] == "152†2,5,11 / 225†2,5,11 = 0.67"
    assert ring.loc[("causal_document", 65536, "fwd", 2)] == "405†4 / 422†4 = 0.96"
    assert ring.loc[("causal_document", 65536, "bwd", 2)] == "334†2,5,11 / 325†2,5,11 = 1.03"
    allgather = v4["allgather/jax.cp_allgather"]
    assert allgather.loc[("causal_document", 16384, "fwd", 2)] == "163†4 / 201†4 = 0.81"
    assert allgather.loc[("causal_document", 16384, "bwd", 2)] == "167†2,5,11 / 225†2,5,11 = 0.74"


def _earlier_section(heading: str) -> str:
    """A section of docs/earlier_measurements.md (where the README's earlier
    tables live), up to the next heading of its level or above."""
    text = (ROOT / "docs" / "earlier_measurements.md").read_text()
    start = text.index(heading)
    level = len(heading.split(" ")[0])  # "###": 3
    ends = [text.find("\n" + "#" * n + " ", start + 1) for n in range(1, level + 1)]
    return text[start:min([end for end in ends if end != -1], default=len(text))]


_TABLE_ROWS = ROOT / "results/gpu/2026-11-27-full-size-gate/table"
_H100_ROWS = ROOT / "results/gpu/2026-11-27-pallas-flex-table"


def test_the_readme_pallas_flex_tables_are_the_full_size_gate_rows():
    """docs/earlier_measurements.md, jax.pallas_flex: the tables of masks
    that draw nothing (the seed blog's at 16k-64k, the paper's at 32k) are
    experiments/pallas_flex_table.py's output on the full-size gate's rows,
    every timed figure from one host of four H200s (09:36-09:50 UTC,
    2026-11-27) and checked at its own size; the rows of masks whose
    workloads changed since (documents, global window, variable blocks) are
    not among them."""
    script = experiment_scripts.load("pallas_flex_table")
    seed, paper = script.tables([_TABLE_ROWS])
    section = _earlier_section("### Our own kernel: jax.pallas_flex (v6b")
    assert seed in section and paper in section
    assert len(seed.splitlines()) == 2 + 9 and len(paper.splitlines()) == 2 + 7
    assert "document" not in seed and "var_block_sparse" not in paper
    frame = results.load([_TABLE_ROWS])
    timed = frame[frame["status"] == "OK"]
    assert set(frame["device"]) == {"NVIDIA H200"}
    assert set(frame["git_commit"]) == {"5741afc", "8eb124b"}
    assert timed["check_err"].notna().all() and (timed["check_err"] < 0.04).all()
    assert (timed["check_len"] == timed["seqlen"]).all()
    stamps = pd.to_datetime(timed["timestamp"])
    assert stamps.min() >= pd.Timestamp("2026-11-27T09:36:00+00:00")
    assert stamps.max() <= pd.Timestamp("2026-11-27T09:50:00+00:00")
    flex = timed[timed["backend"] == "jax.pallas_flex"]
    assert flex["notes"].str.contains("forward Mosaic GPU, backward Mosaic GPU").all()
    assert not flex["notes"].str.contains("short of the timed pipelines").any()
    # The README's prose: causal 32k forward over FA3's, backward over FA3's.
    causal = next(line for line in seed.splitlines() if line.startswith("| causal | 32k"))
    assert causal.split(" | ")[2:4] == ["573 / 437", "595 / 589"]
    assert causal.split(" | ")[6] == "0.96 / 0.74"


_SEED_WORKLOAD_ROWS = [ROOT / "results/gpu/2026-11-27-seed-workloads" / part
                       for part in ("blog", "paper")]


def test_the_readme_seed_workload_tables_are_the_h100_rows():
    """docs/earlier_measurements.md, jax.pallas_flex: the seeds' document
    and sparse workloads (magi_pack documents and varlen_block_causal at 16k-64k; the paper's
    longca documents, global window and block-sparse generators at 32k) are
    the script's output on one H100's rows, each checked at its own size."""
    script = experiment_scripts.load("pallas_flex_table")
    seed, paper = script.tables(_SEED_WORKLOAD_ROWS)
    section = _earlier_section("### Our own kernel: jax.pallas_flex (v6b")
    assert seed in section and paper in section
    assert len(seed.splitlines()) == 2 + 9 and len(paper.splitlines()) == 2 + 8
    frame = results.load(_SEED_WORKLOAD_ROWS)
    assert set(frame["device"]) == {"NVIDIA H100 80GB HBM3"}
    timed = frame[frame["status"] == "OK"]
    assert (timed["check_err"] < 0.04).all() and (timed["check_len"] == timed["seqlen"]).all()
    params = timed["mask_params"].map(results.json_field)
    drawn = params[params.map(lambda p: "distribution" in p)]
    assert {(p["sampler"], p["distribution"]) for p in drawn} == {
        ("magi_pack", "chatqa2_long_sft"), ("longca", "prolong64k")}
    blog = drawn[drawn.map(lambda p: p["sampler"] == "magi_pack")]
    assert all(max(p["doc_lens"]) <= sum(p["doc_lens"]) // 4 for p in blog)


def test_the_pallas_flex_table_never_picks_between_two_measurements():
    """A cell measured twice (the same rows read twice) is an error, and an
    OK or X row wins over an UNAVAILABLE one (call 1's tokamax rows, which
    could not import it, lose to the later calls' figures and verdicts)."""
    script = experiment_scripts.load("pallas_flex_table")
    frame = results.load([_H100_ROWS])
    with pytest.raises(ValueError, match="two OK rows for one cell"):
        script.cells(pd.concat([frame, frame]))
    # Measured again later (a canonical run's --measure_again keeps the
    # rows it set aside): the newer row of the measurement stands.
    again = frame.copy()
    again["timestamp"] = (pd.to_datetime(again["timestamp"]) + pd.Timedelta(hours=1)).map(
        lambda stamp: stamp.isoformat())
    again["tflops"] = again["tflops"] + 1.0
    chosen = script.cells(pd.concat([frame, again]))
    ok = [row for row in chosen.values() if row["status"] == "OK"]
    assert ok and all(row["timestamp"] in set(again["timestamp"]) for row in ok)
    # Other options for the same cell are two measurements: never picked between.
    other = again.assign(options='{"stages": "3"}')
    with pytest.raises(ValueError, match="two OK rows for one cell"):
        script.cells(pd.concat([frame, other]))
    table = script.Table(frame, ("uncapped", "chatqa2_long_sft"))
    unavailable = frame[(frame["backend"] == "jax.tokamax_mosaic_heuristic")
                        & (frame["status"] == "UNAVAILABLE")]
    assert len(unavailable) == 24  # call 1: six masks x 16k, 32k x fwd, bwd
    # Rows written before the full-size check: marked unchecked.
    assert table.shown("jax.tokamax_mosaic_heuristic", "full", 32768) == "653? / 467?"
    assert table.shown("jax.tokamax_mosaic_heuristic", "causal_document", 32768) == "X / X"


