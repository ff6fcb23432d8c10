"""Figures measured before a later change to their kernel are marked (†
and the changes' numbers) wherever they are shown, and each change is
named once under them, under its number
(lcab.registry.Change, lcab.report.changes)."""

import datetime
import json
import re

import pandas as pd
import pytest

from lcab import canonical, registry
from lcab.flops import TIMED_DIRECTIONS
from lcab.report import changes, export, headline, legend, tables
from lcab.report import sources as loading

(PALLAS_FLEX_V9, PALLAS_FLEX_V13, PALLAS_FLEX_V15, PALLAS_FLEX_V22,
 PALLAS_FLEX_V23, PALLAS_FLEX_V25, PALLAS_FLEX_V26, PALLAS_FLEX_V26_CUT,
 PALLAS_FLEX_V28) = registry.all_backends()[
    "jax.pallas_flex"].changes
RING_FLEX_FIX = registry.all_backends()["torch.cp_ring_flex"].changes[-1]
GROUPCAST_PADDING = registry.all_backends()["jax.cp_groupcast"].changes[-1]
BEFORE = "2026-11-28T11:27:32+00:00"  # a second before that commit
AFTER = "2026-11-28T11:27:34+00:00"
LATEST = "2026-11-29T14:30:00+00:00"  # after every change declared
LATER_THAN_V23 = "2026-12-03T18:16:30+00:00"
AFTER_EVERY_CHANGE = "2026-12-31T00:00:00+00:00"


def row(**fields):
    return {"backend": "jax.pallas_flex", "inner": None, "direction": "bwd", "status": "OK",
            "tflops": 400.0, "device": "NVIDIA H100 80GB HBM3", "check_err": 0.001,
            "spread": 1.01, "timestamp": BEFORE, **fields}


def test_every_declared_change_names_its_time_commit_and_directions():
    for name, entry in registry.all_backends().items():
        times = [datetime.datetime.fromisoformat(c.when) for c in entry.changes]
        assert times == sorted(times), f"{name}: changes newest last"
        for change in entry.changes:
            assert times and all(t.tzinfo is not None for t in times), change
            assert re.fullmatch(r"[0-9a-f]{7,40}", change.commit), change
            assert change.directions and set(change.directions) <= set(TIMED_DIRECTIONS)
            assert change.what and not re.search(r"\bv\d+b?\b", change.what), (
                "no version numbers: the README shows this text")


def test_a_row_predates_the_changes_made_after_it_in_its_direction():
    assert registry.changes_since(row()) == [PALLAS_FLEX_V9, PALLAS_FLEX_V15, PALLAS_FLEX_V28]
    assert registry.changes_since(row(timestamp=AFTER)) == [PALLAS_FLEX_V15, PALLAS_FLEX_V28]
    assert registry.changes_since(row(timestamp=LATEST)) == [PALLAS_FLEX_V28]
    assert registry.changes_since(row(timestamp=AFTER_EVERY_CHANGE)) == []
    # Each change moves its own directions only.
    assert registry.changes_since(row(direction="fwd")) == [PALLAS_FLEX_V13]
    assert registry.changes_since(row(direction="fwd", timestamp=AFTER)) == [PALLAS_FLEX_V13]
    assert registry.changes_since(row(direction="fwd", timestamp=LATEST)) == []
    # A CP row takes its inner kernel's changes; another inner, none.
    assert registry.changes_since(row(backend="jax.cp_ring", inner="jax.pallas_flex")) == [
        PALLAS_FLEX_V9, PALLAS_FLEX_V15, PALLAS_FLEX_V28]
    assert registry.changes_since(row(backend="jax.cp_ring", inner="jax.cudnn")) == []
    # A row written before the `inner` column names its kernel in the notes.
    assert registry.changes_since(row(backend="jax.cp_ring", inner=None,
                                      notes="ring; dispatch=zigzag; inner jax.pallas_flex (x)")
                                  ) == [PALLAS_FLEX_V9, PALLAS_FLEX_V15, PALLAS_FLEX_V28]
    # A time without an offset is UTC; no time or an unknown backend: nothing to say.
    assert registry.changes_since(row(timestamp="2026-11-28T11:27:32")) == [
        PALLAS_FLEX_V9, PALLAS_FLEX_V15, PALLAS_FLEX_V28]
    assert registry.changes_since(row(timestamp=None)) == []
    assert registry.changes_since(row(timestamp=float("nan"))) == []
    assert registry.changes_since(row(backend="jax.plugin")) == []


MOSAIC_NOTES = "block plan from the mask's slices; compiled; forward Mosaic GPU, backward Mosaic GPU"


def short(**fields):
    """A one-GPU Mosaic backward at 1k, 64:8 heads: the dK/dV split's
    default reaches it."""
    return row(**{"mask": "causal", "seqlen": 1024, "mask_params": "{}", "heads_q": 64,
                  "heads_kv": 8, "batch": 1, "notes": MOSAIC_NOTES, "options": "{}",
                  "timestamp": LATEST, **fields})


def test_a_scoped_change_marks_only_the_rows_it_can_move():
    """The dK/dV split reaches the Mosaic backward of a short or lopsided
    one-GPU workload; a long causal pass, the Triton backward, a row that
    set its split and a CP row (whose inner keeps whole programs) are
    left unmarked, and so is every forward. The statistics read early
    (v28) mark every backward that may have run the Mosaic kernels."""
    from jax_backends.pallas_flex import changed_rows, mosaic_bwd_sm90

    assert changed_rows.MOSAIC_BACKWARD_BLOCK == mosaic_bwd_sm90.BLOCK
    v28 = [PALLAS_FLEX_V28]
    assert registry.changes_since(short()) == [PALLAS_FLEX_V22, *v28]
    assert registry.changes_since(short(mask="full")) == [PALLAS_FLEX_V22, *v28]
    assert registry.changes_since(short(seqlen=32768)) == v28
    assert registry.changes_since(short(direction="fwd")) == [PALLAS_FLEX_V23]
    assert registry.changes_since(short(notes=MOSAIC_NOTES.replace("backward Mosaic",
                                                                   "backward Triton"))) == []
    assert registry.changes_since(short(options='{"dkv_split": "1"}')) == v28
    assert registry.changes_since(short(heads_q=8, heads_kv=8)) == v28  # no query heads to split
    ring = short(backend="jax.cp_ring", inner="jax.pallas_flex", cp_size=2, suite="cp")
    assert registry.changes_since(ring) == v28
    assert registry.changes_since({**ring, "direction": "fwd"}) == []
    # A workload it cannot rebuild is marked: unsure says it may have moved.
    assert registry.changes_since(short(mask="no_such_mask")) == [PALLAS_FLEX_V22, *v28]
    unsure = registry.Change(LATEST, "abc1234", ("bwd",), "x", scope="no.such.module:f")
    assert unsure.can_move(short())


def test_the_persistent_grid_marks_forward_rows_whose_programs_walk_few_keys():
    """The persistent forward reaches the Mosaic forward of a one-GPU
    workload whose programs walk at most 16k keys on average at a head_dim
    its tiles fit: not full or causal at 32k, not a row that set its grid,
    the Triton forward, head_dim 256, a CP row or any backward."""
    from jax_backends.pallas_flex import backend, changed_rows, mosaic_fwd_sm90

    assert changed_rows.FORWARD_BLOCK == backend.FORWARD_BLOCKS[1]
    assert changed_rows.WIDE_BLOCK_K == mosaic_fwd_sm90.WIDE_BLOCK_K
    fits = mosaic_fwd_sm90.Config(persistent=True)
    largest = changed_rows.PERSISTENT_MAX_HEAD_DIM
    assert mosaic_fwd_sm90.problem(128, 64, "bfloat16", largest, fits) is None
    assert mosaic_fwd_sm90.problem(128, 64, "bfloat16", largest + 64, fits)
    widest = changed_rows.PERSISTENT_MAX_BLOCK_K
    assert mosaic_fwd_sm90.problem(128, widest, "bfloat16", 128, fits) is None
    assert mosaic_fwd_sm90.problem(128, mosaic_fwd_sm90.WIDE_BLOCK_K, "bfloat16", 128, fits)

    def forward(**fields):
        return short(**{"direction": "fwd", "head_dim": 128, **fields})

    for mask, seqlen in (("causal", 1024), ("causal", 16384), ("sliding_window_causal", 32768)):
        assert registry.changes_since(forward(mask=mask, seqlen=seqlen)) == [PALLAS_FLEX_V23]
    # Full at 16k: the persistent grid and its rows head after head.
    assert registry.changes_since(forward(mask="full", seqlen=16384)) == [PALLAS_FLEX_V23,
                                                                          PALLAS_FLEX_V25]
    for mask, seqlen in (("full", 32768), ("causal", 32768), ("full", 65536)):
        assert registry.changes_since(forward(mask=mask, seqlen=seqlen)) == [PALLAS_FLEX_V25,
                                                                             PALLAS_FLEX_V26]
    assert registry.changes_since(forward(options='{"forward_grid": "per_item"}')) == []
    assert registry.changes_since(forward(head_dim=256)) == []
    # 192-key blocks run one program per item: the grid's change cannot reach them.
    assert registry.changes_since(forward(mask="causal", seqlen=16384,
                                          options='{"block_k": 192}')) == []
    assert registry.changes_since(forward(notes=MOSAIC_NOTES.replace("forward Mosaic",
                                                                     "forward Triton"))) == []
    module = forward(backend="jax.module", inner="jax.pallas_flex", suite="module",
                     inner_options="{}")
    assert registry.changes_since(module) == [PALLAS_FLEX_V23]
    assert registry.changes_since(forward(timestamp=datetime.datetime.now(
        datetime.UTC).isoformat())) == []


def test_rows_head_after_head_mark_forward_rows_whose_programs_walk_many_keys():
    """The default rows order moves the Mosaic forward of a one-GPU
    workload whose programs walk 16k keys or more: full from 16k, causal
    from 32k; not the windows, not a row that set its order, not a CP row
    or any backward. Of the committed H200 blog rows, it marks exactly
    full at 16k-64k and causal at 32k-64k."""
    def forward(**fields):
        return short(**{"direction": "fwd", "head_dim": 128, "timestamp": LATER_THAN_V23,
                        **fields})

    for mask, seqlen in (("full", 16384), ("causal", 32768), ("full", 65536)):
        assert registry.changes_since(forward(mask=mask, seqlen=seqlen))[0] == PALLAS_FLEX_V25
    for mask, seqlen in (("causal", 16384), ("sliding_window_causal", 65536)):
        assert registry.changes_since(forward(mask=mask, seqlen=seqlen)) == []
    assert registry.changes_since(forward(mask="full", seqlen=32768,
                                          options='{"rows_launch": "heads_together"}')) == [
        PALLAS_FLEX_V26]
    assert registry.changes_since(forward(mask="full", seqlen=32768, cp_size=2)) == []
    assert registry.changes_since(forward(mask="full", seqlen=32768, direction="bwd")) == [
        PALLAS_FLEX_V28]

    rows = loading.load([canonical.ROOT / "results" / "2026-11-27-h200-blog"])
    rows = rows[(rows["backend"] == "jax.pallas_flex") & (rows["direction"] == "fwd")
                & (rows["status"] == "OK")]
    marked = rows[[PALLAS_FLEX_V25.can_move(r) for _, r in rows.iterrows()]]
    assert set(zip(marked["mask"], marked["seqlen"])) == {
        ("full", 16384), ("full", 24576), ("full", 32768), ("full", 65536),
        ("causal", 32768), ("causal", 65536)}


def test_wide_key_steps_mark_forward_rows_whose_programs_walk_long_rows():
    """192-key steps move the Mosaic forward of a one-GPU workload whose
    programs walk more than 16k keys at head_dim 128: full from 24k, causal
    from 32k; not full at 16k (16,384 keys: the persistent grid), not the
    windows, not a row that set its key block or its grid persistent, not
    head_dim 64, a CP row or any backward. Of the committed H200 blog rows,
    it marks exactly full at 24k-64k and causal at 32k-64k. Nor a mask that
    cuts more than 1 % of the tiles (longca_global_window)."""
    def forward(**fields):
        return short(**{"direction": "fwd", "head_dim": 128, "timestamp": LATER_THAN_V23,
                        **fields})

    for mask, seqlen in (("full", 24576), ("causal", 32768), ("full", 65536)):
        assert PALLAS_FLEX_V26 in registry.changes_since(forward(mask=mask, seqlen=seqlen))
    for fields in ({"mask": "full", "seqlen": 16384}, {"mask": "causal", "seqlen": 24576},
                   {"mask": "sliding_window_causal", "seqlen": 65536},
                   {"mask": "longca_global_window", "seqlen": 32768},  # 2.8 % of tiles cut
                   {"mask": "full", "seqlen": 32768, "options": '{"block_k": 128}'},
                   {"mask": "full", "seqlen": 32768, "options": '{"forward_grid": "persistent"}'},
                   {"mask": "full", "seqlen": 32768, "head_dim": 64},
                   {"mask": "full", "seqlen": 32768, "cp_size": 2},
                   {"mask": "full", "seqlen": 32768, "direction": "bwd"}):
        assert PALLAS_FLEX_V26 not in registry.changes_since(forward(**fields)), fields

    rows = loading.load([canonical.ROOT / "results" / "2026-11-27-h200-blog"])
    rows = rows[(rows["backend"] == "jax.pallas_flex") & (rows["direction"] == "fwd")
                & (rows["status"] == "OK")]
    marked = rows[[PALLAS_FLEX_V26.can_move(r) for _, r in rows.iterrows()]]
    assert set(zip(marked["mask"], marked["seqlen"])) == {
        ("full", 24576), ("full", 32768), ("full", 65536), ("causal", 32768), ("causal", 65536)}


def test_narrower_key_steps_mark_rows_that_ran_192_keys_on_cut_masks():
    """Back to 128 keys where the mask cuts more than 1 % of the tiles:
    the change marks a forward row whose note says it ran 192-key steps by
    default on such a mask, and no other: not one at 128 (notes without the
    steps), not full or causal at 192, not a row that set its key block.
    Of the lab's H200 rows at the default (block_k unset) on the paper's
    masks, it marks exactly the four cells the rule now leaves at 128."""
    wide_notes = MOSAIC_NOTES.replace("forward Mosaic GPU", "forward Mosaic GPU (192-key steps)")
    assert wide_notes != MOSAIC_NOTES

    def forward(**fields):
        return short(**{"direction": "fwd", "head_dim": 128, "notes": wide_notes,
                        "timestamp": "2026-12-05T07:24:35+00:00", **fields})

    assert registry.changes_since(forward(mask="longca_global_window", seqlen=32768)) == [
        PALLAS_FLEX_V26_CUT]
    for fields in ({"mask": "full", "seqlen": 32768}, {"mask": "causal", "seqlen": 65536},
                   {"mask": "longca_global_window", "seqlen": 32768, "notes": MOSAIC_NOTES},
                   {"mask": "longca_global_window", "seqlen": 32768,
                    "options": '{"block_k": 192}'}):
        assert PALLAS_FLEX_V26_CUT not in registry.changes_since(forward(**fields)), fields

    folder = canonical.ROOT / "results" / "gpu" / "2026-12-05-h200-key-step" / "paper"
    rows = loading.load([folder / "default-1"])
    marked = rows[[PALLAS_FLEX_V26_CUT.can_move(r) for _, r in rows.iterrows()]]
    assert set(zip(marked["mask"], marked["seqlen"])) == {
        ("longca_global_window", 32768), ("longca_global_window", 40960),
        ("causal_blockwise", 40960), ("full_document", 40960)}


def test_the_split_marks_the_committed_short_rows_and_no_long_ones():
    """Of the committed H200 blog rows of pallas_flex's backward, the split
    reaches 1k-4k only (full at 1k; causal and the documents at 1k-2k;
    full_document and varlen_block_causal also at 4k), never 8k on."""
    rows = loading.load([canonical.ROOT / "results" / "2026-11-27-h200-blog"])
    rows = rows[(rows["backend"] == "jax.pallas_flex") & (rows["direction"] == "bwd")
                & (rows["status"] == "OK")]
    marked = rows[[PALLAS_FLEX_V22 in registry.changes_since(r) for _, r in rows.iterrows()]]
    assert set(marked["seqlen"]) == {1024, 2048, 4096}  # the sweep runs 1k-64k
    assert set(marked[marked["seqlen"] == 4096]["mask"]) == {"full_document",
                                                              "varlen_block_causal"}
    assert set(marked[marked["mask"] == "full"]["seqlen"]) == {1024}


def test_every_change_has_one_number_by_date_the_same_everywhere():
    numbers = changes.numbers()
    declared = {change for entry in registry.all_backends().values() for change in entry.changes}
    assert set(numbers) == declared and sorted(numbers.values()) == list(
        range(1, len(declared) + 1))
    by_number = sorted(numbers, key=numbers.get)
    times = [datetime.datetime.fromisoformat(change.when) for change in by_number]
    assert times == sorted(times)
    # The oldest change of all is the torch ring's fix; pallas_flex's
    # newest backward change (the statistics read early) is the last.
    assert numbers[RING_FLEX_FIX] == 1 and numbers[PALLAS_FLEX_V28] == len(declared)


def test_a_marked_figure_carries_the_numbers_of_its_changes_after_its_other_flags():
    numbers = changes.numbers()
    flag = legend.FLAG_CHANGED + ",".join(
        str(numbers[change]) for change in (PALLAS_FLEX_V9, PALLAS_FLEX_V15, PALLAS_FLEX_V28))
    assert flag == "†2,5,11"  # as the README prints them today
    assert tables.format_row(row()) == "400" + flag
    assert tables.format_row(row(timestamp=LATEST)) == f"400†{numbers[PALLAS_FLEX_V28]}"
    assert tables.format_row(row(timestamp=AFTER_EVERY_CHANGE)) == "400"
    assert tables.format_row(row(check_err=None, spread=2.0)) == "400~?" + flag
    # A dated record of one version leaves it out; a failed row shows its code alone.
    assert tables.format_row(row(), mark_changes=False) == "400"
    assert tables.format_row(row(status="OOM")) == "E"
    assert any(entry.code.startswith(legend.FLAG_CHANGED) for entry in legend.ENTRIES)


def test_a_page_names_each_change_once_with_the_figures_it_marks():
    rows = pd.DataFrame([row(timestamp=AFTER), row(direction="fwd", timestamp=LATEST),
                         row(timestamp=AFTER_EVERY_CHANGE),
                         row(backend="jax.cp_ring", inner="jax.pallas_flex", timestamp=AFTER),
                         row(backend="jax.cp_ring", inner="jax.pallas_flex", status="OOM")])
    numbers = changes.numbers()
    lines = changes.markdown(rows)
    assert len(lines) == 3 and lines[0].startswith("A figure marked †5,11 was measured before")
    for line, change in zip(lines[1:], (PALLAS_FLEX_V15, PALLAS_FLEX_V28)):
        assert line.startswith(f"- †{numbers[change]} `jax.pallas_flex` changed at {change.commit}")
        assert "2 bwd figures here predate it (`jax.cp_ring`, `jax.pallas_flex`" in line
    headline_lines = [f"†{numbers[change]} measured before `jax.pallas_flex` changed at {change.commit} "
                      f"({change.when[:10]}): {change.what}."
                      for change in (PALLAS_FLEX_V15, PALLAS_FLEX_V28)]
    assert changes.markdown(rows, count=False) == headline_lines
    assert changes.markdown(rows.iloc[[1, 2]]) == []
    # Four changes: each named once, oldest first, with the figures it marks.
    four = changes.markdown(pd.DataFrame([row(), row(direction="fwd")]))
    assert len(four) == 5
    assert [change.commit in line for change, line in zip(
        (PALLAS_FLEX_V9, PALLAS_FLEX_V13, PALLAS_FLEX_V15, PALLAS_FLEX_V28), four[1:])] == [
        True] * 4
    assert "1 fwd figures here predate it" in four[2]
    assert "1 bwd figures here predate it" in four[3] and "1 bwd figures" in four[4]


def test_the_committed_h200_cp_run_is_marked_where_it_predates_the_change():
    """Every backward figure of pallas_flex, and of the JAX strategies
    running it, was measured before its latest backward change (the
    statistics read early), most before the one of 2026-11-29 too (the older
    ones before the launch-order change too; group-cast's cp-2 rows at 32k
    also before its own); forward figures before the forward's change bar
    those measured again since; torch figures were touched by none (the
    torch ring's rows from before its fix were measured again). The
    headline, the pages' rows and the export agree."""
    folder = canonical.ROOT / "results" / "2026-11-27-h200x4-cp"
    _, frame = loading.load_sweeps({"cp": folder})["cp"]
    tidy = export.tidy(frame, "cp-h200")
    marked = tidy[tidy["changed_since"] != ""]
    jax_marked = marked[marked["framework"] == "jax"]
    backward = jax_marked[jax_marked["direction"] == "bwd"]
    marks = backward["changed_since"].str.split()
    # Every backward predates the statistics read early (2026-12-06); those
    # measured before 2026-11-29 predate older changes too.
    assert all(commits[-1] == PALLAS_FLEX_V28.commit for commits in marks)
    older = [commits[:-1] for commits in marks if len(commits) > 1]
    assert all(PALLAS_FLEX_V15.commit in commits for commits in older)
    assert {len(commits) for commits in older} == {1, 2, 3}
    own = marks.apply(lambda commits: GROUPCAST_PADDING.commit in commits)
    assert set(backward.loc[own, "backend"]) == {"jax.cp_groupcast"}
    assert all(PALLAS_FLEX_V9.commit in commits for commits in marks[own])
    # Every CP forward there predates the later, forward-only change.
    forward = jax_marked[jax_marked["direction"] == "fwd"]
    cp = forward["suite"] == "cp"
    assert set(forward.loc[cp, "changed_since"]) == {PALLAS_FLEX_V13.commit}
    assert set(jax_marked["direction"]) == {"bwd", "fwd"}
    # The one-GPU parts were measured again after every change to 2026-11-29,
    # and at 16k-32k once more after the rows order (2026-12-04); at 64k
    # and 128k the persistent forward grid (2026-12-03) marks the documents'
    # forwards, whose programs walk few keys, and the rows head after head
    # (2026-12-04) full's and causal's, whose programs walk many.
    # The statistics read early (2026-12-06) mark every one-GPU backward.
    one_gpu = jax_marked[jax_marked["suite"] != "cp"]
    assert set(one_gpu["backend"]) == {"jax.pallas_flex"}
    assert set(one_gpu.loc[one_gpu["direction"] == "bwd", "changed_since"]) == {
        PALLAS_FLEX_V28.commit}
    one_gpu = one_gpu[one_gpu["direction"] == "fwd"]
    # (192-key steps, 2026-12-05, mark the last two as well).
    v23, v25, v26 = (PALLAS_FLEX_V23.commit, PALLAS_FLEX_V25.commit, PALLAS_FLEX_V26.commit)
    assert set(one_gpu["changed_since"]) == {v23, f"{v25} {v26}", v26}
    assert set(one_gpu["seqlen"]) == {65536, 131072} | set(
        one_gpu.loc[one_gpu["changed_since"] == v26, "seqlen"])
    grid = one_gpu[one_gpu["changed_since"] == v23]
    assert set(grid["mask"]) == {"full_document", "causal_document"}
    rows = one_gpu[one_gpu["changed_since"] == f"{v25} {v26}"]
    assert set(rows["mask"]) == {"full", "causal"}
    assert set(one_gpu.loc[one_gpu["changed_since"] == v26, "mask"]) <= {"full", "causal"}
    assert (marked["framework"] == "jax").all()
    text = headline.markdown({"cp": folder})
    assert legend.FLAG_CHANGED in text and f"changed at {PALLAS_FLEX_V9.commit}" in text
    lines = [line for line in text.splitlines() if line.startswith("| causal_document | 64k")]
    assert lines
    for line in lines:
        jax_single, jax_cp2 = line.split("|")[3:5]
        # the one-GPU forward predates the persistent grid, its backward the
        # statistics read early
        assert re.search(r"\d+†[\d,]+ / \d+†[\d,]+ pallas_flex", jax_single), line
        assert re.search(r"\d+†[\d,]+ \w+ / \d+†[\d,]+ \w+", jax_cp2), line


def test_a_ratio_to_one_gpu_marks_the_figure_that_predates_the_change(tmp_path):
    """On the committed H200 run the one-GPU kernel was measured again after
    every change and the cp-2 ring rows at 8k tokens per GPU were not, while
    its forward rows at 32k tokens per GPU were: a ratio sets two versions
    side by side, and its cell says which figure is the older one (rows
    made up for the other way round: the one-GPU figure the older)."""
    from tests.test_report_rows import loaded, row

    folder = canonical.ROOT / "results" / "2026-11-27-h200x4-cp"
    _, frame = loading.load_sweeps({"cp": folder})["cp"]
    table = tables.cp_vs_single_table(frame)
    forward = table.loc[("causal", 16384, "fwd", 2)]  # the ring's: a forward change
    assert re.fullmatch(r"\d+†[\d,]+ / \d+ = \d\.\d\d", forward["ring/jax.cp_ring"])
    forward = table.loc[("full", 65536, "fwd", 2)]  # the one-GPU forward: its rows order
    assert re.fullmatch(r"\d+ / \d+†[\d,]+ = \d\.\d\d", forward["ring/jax.cp_ring"])
    backward = table.loc[("causal", 16384, "bwd", 2)]  # both before the statistics read early
    assert re.fullmatch(r"\d+†[\d,]+ / \d+†[\d,]+ = \d\.\d\d", backward["ring/jax.cp_ring"])
    before, after = "2026-11-27T10:00:00+00:00", "2099-01-01T00:00:00+00:00"
    made_up = tables.cp_vs_single_table(loaded(tmp_path, [
        row("jax.pallas_flex", mask="full", timestamp=before),
        row("jax.cp_ring", mask="full", suite="cp", cp_size=2, strategy="ring",
            inner="jax.pallas_flex", timestamp=after)]))
    assert re.fullmatch(r"\d+ / \d+†[\d,]+ = \d\.\d\d",
                        made_up.loc[("full", 8192, "fwd", 2)]["ring/jax.cp_ring"])


@pytest.mark.parametrize("direction", TIMED_DIRECTIONS)
def test_rows_measured_after_every_change_are_never_marked(direction):
    now = datetime.datetime.now(datetime.UTC).isoformat()
    for name in registry.all_backends():
        assert registry.changes_since(row(backend=name, direction=direction,
                                          timestamp=now)) == []


def test_advice_says_which_rows_it_read_predate_a_change():
    """lcab.advise shows no † per cell (a cell may be modelled from many
    rows), so the runs it read say how many predate which change."""
    from lcab.advise import evidence

    said = evidence.load("H100").describe().splitlines()
    predating = [line for line in said if "predate a later change" in line]
    # One line per change the rows read predate, in the order the changes
    # landed, each naming its commit and its direction. Which changes appear
    # moves as canonical parts are rerun (a change counts only the rows it can move).
    landed = [(PALLAS_FLEX_V9, "bwd"), (GROUPCAST_PADDING, "bwd"), (PALLAS_FLEX_V13, "fwd"),
              (PALLAS_FLEX_V15, "bwd"), (PALLAS_FLEX_V22, "bwd"), (PALLAS_FLEX_V23, "fwd"),
              (PALLAS_FLEX_V25, "fwd"), (PALLAS_FLEX_V26, "fwd"), (PALLAS_FLEX_V28, "bwd")]
    assert predating and predating[0].count(PALLAS_FLEX_V9.commit) == 1
    remaining = iter(landed)
    for line in predating:
        direction = next((d for c, d in remaining if c.commit in line), None)
        assert direction, f"not a change, or out of order: {line}"
        assert re.match(rf"\d+ {direction} rows read here", line), line


def test_of_two_equally_complete_runs_the_headline_reads_the_one_with_fewer_marks(
        tmp_path, monkeypatch):
    committed = canonical.RESULTS / "2026-11-27-h100-blog" / "jax-64k-causal" / "kernel_jax.jsonl"
    measured = [json.loads(line) for line in committed.read_text().splitlines()
                if '"jax.pallas_flex"' in line and '"bwd"' in line][-1]
    monkeypatch.setattr(canonical, "RESULTS", tmp_path)

    def run(name, timestamp, parts_done):
        folder = tmp_path / name / "jax-64k-causal"
        folder.mkdir(parents=True)
        folder.joinpath("kernel_jax.jsonl").write_text(
            json.dumps({**measured, "timestamp": timestamp}) + "\n")
        parts = {f"part-{i}": {"status": "done"} for i in range(parts_done)}
        (tmp_path / name / canonical.STATE_NAME).write_text(
            json.dumps({"sweep": "blog", "calls": [], "parts": parts}))
        return tmp_path / name

    marked = run("2026-11-27-h200-blog", BEFORE, parts_done=3)  # h200 sorts first by name
    current = run("2026-11-27-h100-blog", AFTER_EVERY_CHANGE, parts_done=3)
    assert loading.predating_rows(marked) == 1 and loading.predating_rows(current) == 0
    assert loading.headline_folders()["blog"] == current
    # A run with more parts done stays the headline's, marks or not.
    (marked / canonical.STATE_NAME).write_text(json.dumps(
        {"sweep": "blog", "calls": [], "parts": {f"part-{i}": {"status": "done"}
                                                 for i in range(4)}}))
    assert loading.headline_folders()["blog"] == marked
