"""lcab.report.headline: the README's best-of tables, on synthetic rows.

Every number is made up (tests/test_report_rows.py).
"""

import pytest

from lcab import canonical, results
from lcab.report import headline, tables
from tests.test_report_rows import COMMIT, DATE, GPU, row, write


def _kernel_rows():
    rows = [row("jax.slow", seqlen=4096, tflops=999.0)]  # a shorter length: not the headline's
    for direction, scale in (("fwd", 1.0), ("bwd", 0.5)):
        rows += [
            row("jax.a", direction=direction, tflops=300.0 * scale),
            row("jax.b", direction=direction, tflops=350.0 * scale),
            # Faster, but no full-size check, a mismatch or an error: never the best.
            row("jax.unchecked", direction=direction, tflops=900.0, checked=False),
            row("jax.wrong", direction=direction, status="MISMATCH"),
            row("torch.x", direction=direction, tflops=250.0 * scale),
            row("torch.y", direction=direction, status="ERROR"),
        ]
    # In the backward, jax.a is the faster one.
    rows.append(row("jax.a", direction="bwd", tflops=500.0,
                    timestamp=f"{DATE}T11:00:00+00:00"))
    return rows


def _cp_rows():
    """As the cp sweep runs them: 16k tokens per GPU, so cp 2 at 32k and cp 4
    at 64k, and the kernel alone on one GPU at both lengths."""
    rows = []
    for size, ring, ulysses in ((2, 400.0, 380.0), (4, 300.0, 310.0)):
        options = {"cp_size": str(size)}
        seqlen = 16384 * size
        rows += [row("jax.cp_ring", suite="cp", strategy="ring", cp_size=size, tflops=ring,
                     seqlen=seqlen, options=options),
                 row("jax.cp_ulysses", suite="cp", strategy="ulysses", cp_size=size,
                     tflops=ulysses, seqlen=seqlen, options=options),
                 row("torch.cp_native", suite="cp", strategy="native", cp_size=size,
                     tflops=ring - 50, seqlen=seqlen, options=options)]
    return rows + [row("jax.a", seqlen=65536, tflops=450.0),  # the one-GPU references
                   row("jax.a", seqlen=32768, tflops=440.0)]


@pytest.fixture()
def folders(tmp_path):
    results_dir = tmp_path / "results"
    return {"blog": write(results_dir / f"{DATE}-h100-blog", _kernel_rows()),
            "cp": write(results_dir / f"{DATE}-h100x4-cp", _cp_rows())}


def test_the_best_checked_ok_backend_of_each_framework_heads_its_cell(folders):
    rows = tables.with_line(tables.suite_rows(results.load([folders["blog"]]), "kernel"))
    table = headline.best_table(headline.counted(rows), ["jax", "torch"])
    assert list(table.columns) == ["jax", "torch"]
    assert list(table.index) == [("causal", "8k")]  # the longest length only
    # fwd / bwd; one name where one backend is best in both directions.
    assert list(table.loc[("causal", "8k")]) == ["350 b / 500 a", "250 / 125 x"]


def test_unchecked_rows_count_only_when_asked(folders):
    rows = tables.with_line(tables.suite_rows(results.load([folders["blog"]]), "kernel"))
    everything = headline.best_table(headline.counted(rows, require_check=False), ["jax"])
    assert everything.loc[("causal", "8k"), "jax"] == "900 / 900 unchecked"


def test_the_markdown_has_a_kernel_and_a_cp_table_with_their_sources(folders):
    text = headline.markdown(folders)
    assert "| causal | 8k     | 350 b / 500 a | 250 / 125 x |" in text
    # Forward rows only: one figure a cell.
    assert ("best CP strategy (per-GPU) and the best kernel on one GPU of each framework, "
            "TFLOP/s fwd, at each length") in text
    # Each framework's one-GPU kernel (the cp folder's kernel rows), then its cp sizes,
    # each cp size at the length it ran.
    assert ("| mask   | length | jax, 1 GPU | jax, cp 2   | jax, cp 4      | torch, 1 GPU | "
            "torch, cp 2   | torch, cp 4   |") in text
    assert ("| causal | 32k    | 440 a      | 400 cp_ring |                |              | "
            "350 cp_native |               |") in text
    assert ("| causal | 64k    | 450 a      |             | 310 cp_ulysses |              | "
            "              | 250 cp_native |") in text
    assert f"at {COMMIT}, {GPU}, {DATE}" in text
    assert "jax.a" not in text.split("**cp**")[1]  # short names: "a", not "jax.a"
    assert len(text.splitlines()) <= 30
    assert headline.markdown(folders) == text  # deterministic


def test_a_tie_goes_to_the_alphabetically_first_backend(tmp_path):
    folder = write(tmp_path / "tie", [row("jax.z", tflops=300.0), row("jax.m", tflops=300.0)])
    assert "300 m" in headline.markdown([folder])


def test_by_default_the_current_canonical_runs_are_read(folders, monkeypatch):
    monkeypatch.setattr(canonical, "RESULTS", folders["blog"].parent)
    sources = headline.provenance()
    assert list(sources) == ["blog", "cp"]
    blog = sources["blog"]
    assert blog.folder.endswith(f"{DATE}-h100-blog")
    assert (blog.commit, blog.device, blog.date) == (COMMIT, GPU, DATE)
    assert headline.caption().splitlines()[0].startswith("blog: ")
    assert headline.markdown() == headline.markdown(folders)


def test_another_cards_current_run_is_named_under_the_tables(folders, monkeypatch):
    """Runs on two cards are both current: the headline shows the more
    complete one and links the other, whose tables are on its own page."""
    import json

    root = folders["blog"].parent
    monkeypatch.setattr(canonical, "RESULTS", root)
    (folders["cp"] / canonical.STATE_NAME).write_text(json.dumps(
        {"sweep": "cp", "parts": {"a": {"status": canonical.DONE}, "b": {"status": "stopped"}}}))
    h200 = write(root / "2026-11-29-h200x2-cp", _cp_rows()[:1])  # newer, less complete
    text = headline.markdown()
    assert f"{DATE}-h100x4-cp" in text.split("Current runs on other cards")[0]
    assert text.rstrip().endswith(f"[cp on h200x2]({h200}).")
    assert headline.provenance()["cp"].folder.endswith(f"{DATE}-h100x4-cp")


def test_no_canonical_rows_yet_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(canonical, "RESULTS", tmp_path)
    assert "no canonical sweep has committed rows yet" in headline.markdown()


def test_a_run_given_its_full_commit_hash_is_named_by_its_short_one(tmp_path):
    full = "bf4c1cc0dbc803907c82356419346f4d2f9d7295"
    folder = write(tmp_path / "full-hash", [row("jax.a", git_commit=full), row("jax.b")])
    text = headline.markdown([folder])
    assert f"at {COMMIT}, bf4c1cc, {GPU}" in text  # sorted, each once
    assert full not in text


def test_a_length_only_some_backends_reached_does_not_head_the_table(tmp_path):
    # A part stopped at 8k after jax.a: jax.b's 8k cell is still to come.
    rows = [row("jax.a", seqlen=4096, tflops=300.0), row("jax.b", seqlen=4096, tflops=350.0),
            row("jax.a", seqlen=8192, tflops=320.0)]
    frame = results.load([write(tmp_path / f"{DATE}-h100-blog", rows)])
    lined = tables.with_line(tables.suite_rows(frame, "kernel"))
    assert headline.reached_lengths(lined) == {"causal": 4096}
    table = headline.best_table(headline.counted(lined), ["jax"],
                                lengths=headline.reached_lengths(lined))
    assert list(table.index) == [("causal", "4k")]
    assert table.loc[("causal", "4k"), "jax"] == "350 b"  # forward rows only
    # A row of any status counts as reached: an out-of-memory cell is measured.
    rows.append(row("jax.b", seqlen=8192, status="OOM"))
    lined = tables.with_line(tables.suite_rows(
        results.load([write(tmp_path / "again" / f"{DATE}-h100-blog", rows)]), "kernel"))
    assert headline.reached_lengths(lined) == {"causal": 8192}


def test_masks_follow_the_family_order_not_the_file_order(tmp_path):
    # Canonical parts sort by name, so causal's files come before full's.
    rows = [row("jax.a", mask="causal"), row("jax.a", mask="full"),
            row("jax.a", mask="causal_document")]
    lined = tables.with_line(tables.suite_rows(
        results.load([write(tmp_path / f"{DATE}-h100-blog", rows)]), "kernel"))
    table = headline.best_table(headline.counted(lined), ["jax"])
    assert [mask for mask, _ in table.index] == ["full", "causal", "causal_document"]
    assert tables.mask_order(["block_sparse(keep=0.2, block=128)", "mystery", "full",
                              "block_sparse(keep=0.5, block=128)"]) == [
        "full", "block_sparse(keep=0.2, block=128)", "block_sparse(keep=0.5, block=128)",
        "mystery"]
