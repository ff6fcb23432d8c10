"""lcab.report.pages, why, line_figures, styles, measure: the result pages.

Synthetic rows (tests/test_report_rows.py): made-up numbers.
"""

import itertools
import subprocess
import sys

import matplotlib.image
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg

from lcab import results
from lcab.report import line_figures, measure, pages, styles, tables, why
from lcab.report.summary import summary_text
from tests.test_report_rows import COMMIT, DATE, GPU, loaded, row, write

NOT_EXPRESSIBLE = "causal is not expressible exactly through jax.b"
TOO_BIG = "out of memory: needs <more> than the device has"


def _lined(folder, rows):
    return tables.with_line(tables.latest(loaded(folder, rows)))


def _kernel_rows():
    """Three backends at two lengths; jax.b is X everywhere with one reason,
    torch.c runs out of memory at 16k, jax.never never measured anything."""
    rows = []
    for seqlen in (8192, 16384):
        for direction in ("fwd", "bwd"):
            rows += [
                row("jax.a", seqlen=seqlen, direction=direction, tflops=300.0 + seqlen / 1024),
                row("jax.b", seqlen=seqlen, direction=direction, status="UNSUPPORTED",
                    reason=NOT_EXPRESSIBLE),
                row("jax.never", seqlen=seqlen, direction=direction, status="UNSUPPORTED",
                    reason=NOT_EXPRESSIBLE.replace("jax.b", "jax.never")),
                row("torch.c", seqlen=seqlen, direction=direction, status="OOM",
                    reason=TOO_BIG) if seqlen == 16384 else
                row("torch.c", seqlen=seqlen, direction=direction, tflops=200.0),
                row("torch.gone", seqlen=seqlen, direction=direction, status="UNAVAILABLE",
                    reason="torch.gone is not installed"),
            ]
    return rows


def test_every_distinct_reason_is_listed_once_and_each_code_points_to_it(tmp_path):
    table, notes = why.noted_table(_lined(tmp_path, _kernel_rows()), ["seqlen"])
    # Unavailable everywhere: not a column; X everywhere is (its reason says why).
    assert list(table.columns) == ["jax.a", "jax.b", "jax.never", "torch.c"]
    assert table.loc[(8192,), "jax.b"] == "X¹ / X¹"
    assert table.loc[(16384,), "jax.b"] == "X¹ / X¹"  # the same reason: the same number
    assert table.loc[(8192,), "jax.never"] == "X² / X²"
    assert table.loc[(16384,), "torch.c"] == "E³ / E³"
    assert table.loc[(8192,), "torch.c"] == "200 / 200"
    assert table.loc[(8192,), "jax.a"] == "308 / 308"
    assert list(notes.numbers.items()) == [
        (NOT_EXPRESSIBLE, 1), (NOT_EXPRESSIBLE.replace("jax.b", "jax.never"), 2), (TOO_BIG, 3)]
    text = notes.markdown()
    assert text.count(NOT_EXPRESSIBLE) == 1
    assert "1. " + NOT_EXPRESSIBLE in text
    assert "3. out of memory: needs &lt;more> than" in text  # not an HTML tag


def test_a_long_reason_is_cut_and_kept_on_one_line():
    reason = "Traceback\n  line 1\n" + "x" * 1000
    cleaned = why.clean_reason(reason)
    assert cleaned.startswith("Traceback line 1 x") and len(cleaned) == why.REASON_CHARS
    assert why.clean_reason(None) == ""


def test_a_backend_that_never_produced_a_number_is_not_in_the_figure(tmp_path):
    rows = _lined(tmp_path, _kernel_rows())
    looks = styles.styles(tables.line_order(rows))
    fig = line_figures.scaling_figure(rows, "causal", "setting", looks)
    assert line_figures.legend_labels(fig) == ["jax.a", "torch.c"]
    # The legend lies under the panels, clear of the titles above them.
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    legend_box = fig.legends[0].get_window_extent(canvas.get_renderer())
    assert all(legend_box.y1 <= ax.get_window_extent().y0 for ax in fig.axes)


def test_the_cp_figure_draws_the_one_gpu_kernel_as_a_reference(tmp_path):
    kernel = [row("jax.k", seqlen=16384, direction=d, tflops=400.0) for d in ("fwd", "bwd")]
    cp = [row("jax.cp_ring", suite="cp", strategy="ring", seqlen=16384, direction=d,
              cp_size=size, tflops=300.0 / size ** 0.1, inner="jax.k",
              options={"cp_size": str(size)})
          for d in ("fwd", "bwd") for size in (2, 4)]
    cp += [row("jax.cp_bad", suite="cp", strategy="bad", seqlen=16384, direction=d, cp_size=2,
               status="ERROR", inner="jax.k") for d in ("fwd", "bwd")]
    frame = _lined(tmp_path, kernel + cp)
    rows = frame[frame["suite"] == "cp"]
    fig = line_figures.cp_figure(rows, frame[frame["suite"] == "kernel"], "t", "s",
                                 styles.styles(tables.line_order(frame)))
    assert line_figures.legend_labels(fig) == ["ring/jax.cp_ring", "1 GPU jax.k"]
    reference = [line for line in fig.axes[0].get_lines() if line.get_label() == "1 GPU jax.k"]
    assert list(reference[0].get_ydata()) == [400.0, 400.0]


def test_any_two_lines_of_a_crowded_figure_look_different():
    looks = list(styles.styles([f"backend{i}" for i in range(18)]).values())
    for first, second in itertools.combinations(looks, 2):
        assert (first.color, first.marker) != (second.color, second.marker)
    assert len({look.color for look in looks[:10]}) == 10  # ten colours before any repeats


def _canonical_folder(tmp_path, rows, name=f"{DATE}-h100-blog"):
    return write(tmp_path / "results" / name, rows)


def test_a_page_names_its_rows_and_explains_its_codes(tmp_path):
    folder = _canonical_folder(tmp_path, _kernel_rows())
    out = tmp_path / "docs"
    written = pages.write_pages([folder], out)
    names = {path.relative_to(out).as_posix() for path in written}
    assert {"blog.md", "index.md", "results.csv", "export.md",
            "figures/blog/kernel_causal.png"} <= names
    page = (out / "blog.md").read_text()
    assert str(folder) in page or "results/2026-11-28-h100-blog" in page
    assert f"Commit: {COMMIT}" in page and f"Device: {GPU}" in page and DATE in page
    assert "X¹ / X¹" in page and f"1. {NOT_EXPRESSIBLE}" in page
    assert page.count(f"1. {NOT_EXPRESSIBLE}") == 1
    assert "![causal](figures/blog/kernel_causal.png)" in page
    assert "## Legend" in page and "| `MM` | MISMATCH |" in page
    index = (out / "index.md").read_text()
    assert "[blog](blog.md)" in index and "[results.csv](results.csv)" in index
    image = matplotlib.image.imread(out / "figures/blog/kernel_causal.png")
    assert image[..., :3].std() > 0.05
    tidy = pd.read_csv(out / "results.csv")
    assert set(tidy["sweep"]) == {"blog"} and len(tidy) == 20
    # torch.gone is absent from the tables, and the page says why
    assert ("Unavailable where these rows ran, so absent from the tables below:\n\n"
            "- `torch.gone`: torch.gone is not installed\n") in page
    assert "| torch.gone" not in page and "torch.gone |" not in page


def test_cpu_rows_show_median_milliseconds(tmp_path):
    rows = [row("jax.a", device="cpu", tflops=0.001, median_ms=5.0, direction=d)
            for d in ("fwd", "bwd")]
    frame = loaded(tmp_path / "cpu", rows)
    assert tables.format_row(rows[0]) == "5"  # not "0.001"
    assert measure.of_rows(frame) is measure.MEDIAN_MS
    summary = tables.short_table(frame)
    assert "**Kernels, median ms fwd / bwd" in summary and "| 5 / 5" in summary
    table, _ = why.noted_table(tables.with_line(frame), ["seqlen"])
    assert table.loc[(8192,), "jax.a"] == "5 / 5"
    assert "**Kernels, median ms fwd / bwd" in summary_text([tmp_path / "cpu"])
    page = (pages.write_pages([tmp_path / "cpu"], tmp_path / "out")[0]).read_text()
    assert "Kernels: median ms" in page and "median milliseconds" in page
    # GPU rows keep TFLOP/s.
    assert tables.format_row(row("jax.a", tflops=612.4)) == "612"


def test_the_cli_writes_pages_and_prints_the_headline(tmp_path):
    folder = _canonical_folder(tmp_path, _kernel_rows())
    out = tmp_path / "pages"
    result = subprocess.run(
        [sys.executable, "-m", "lcab.report", "--pages", "--headline", "--results", str(folder),
         "--out", str(out)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    # At the longest length torch.c ran out of memory: no torch figure to head the table.
    assert "| causal | 16k    | 316 / 316 a |       |" in result.stdout
    assert (out / "blog.md").exists() and (out / "index.md").exists()


def test_the_loaded_rows_keep_their_files(tmp_path):
    folder = write(tmp_path / "f", [row("jax.a")], name="a.jsonl")
    write(folder, [row("jax.b"), row("jax.c")], name="b.jsonl")
    frame = pages.sources.load([folder])
    assert [s.rsplit("/", 1)[-1] for s in frame["source"]] == ["a.jsonl", "b.jsonl", "b.jsonl"]
    assert list(frame["backend"]) == list(results.load([folder])["backend"])


def test_each_cards_current_run_has_a_page_and_the_index_names_superseded_runs(
        tmp_path, monkeypatch):
    """Runs of the blog sweep on two cards each get a page (numbers of two
    cards never share a table); an older run on one card is superseded, and
    the index names it so no committed run is hidden."""
    import json

    from lcab import canonical

    monkeypatch.setattr(canonical, "RESULTS", tmp_path / "results")
    h100 = _canonical_folder(tmp_path, _kernel_rows(), name=f"{DATE}-h100-blog")
    (h100 / canonical.STATE_NAME).write_text(json.dumps(
        {"sweep": "blog", "parts": {"jax-1k-8k-full": {"status": canonical.DONE}}}))
    _canonical_folder(tmp_path, _kernel_rows()[:2], name=f"{DATE}-h200-blog")
    _canonical_folder(tmp_path, _kernel_rows()[:2], name="2026-01-01-h100-blog")
    docs = tmp_path / "docs"
    (docs / "figures" / "blog").mkdir(parents=True)  # a page an earlier call wrote
    (docs / "blog.md").write_text("# blog\n")
    (docs / "index.md").write_text("| [blog](blog.md) | ... |\n")
    pages.write_pages(None, docs)
    assert not (docs / "blog.md").exists() and not (docs / "figures" / "blog").exists()
    index = (tmp_path / "docs" / "index.md").read_text()
    table = index.split("Other")[0]
    # The more complete run first; each page named by sweep and card.
    assert (table.index("| [blog-h100](blog-h100.md) |")
            < table.index("| [blog-h200](blog-h200.md) |"))
    assert "the seed blog's kernel benchmark" in table
    page = (tmp_path / "docs" / "blog-h200.md").read_text()
    assert page.startswith("# blog-h200\n\nthe seed blog's kernel benchmark")
    assert (f"Other committed runs, not on the pages: [{tmp_path}/results/2026-01-01-h100-blog]"
            "(../results/2026-01-01-h100-blog) (h100).") in index
