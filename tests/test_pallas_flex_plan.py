"""jax.pallas_flex's host-side tile plan: it visits exactly the mask, full
tiles come as runs, work follows the area, heavy blocks launch first."""

import numpy as np
import pytest

from jax_backends.pallas_flex import ops, schedule
from jax_backends.pallas_flex.plan import Geometry, make_plan, stack_plans
from lcab.masks import MASK_NAMES, AttnMask, AttnSlice, make_mask, small_mask
from lcab.masks import slices as slices_lib


def tile_mask(plan, program, j, row0, col0):
    """The element mask the kernel computes for partial visit j, in numpy."""
    lo, hi = plan.by_q.lo[program, j], plan.by_q.hi[program, j]
    rows = row0 + np.arange(plan.block_q)[:, None]
    cols = col0 + np.arange(plan.block_k)[None, :]
    seen = np.zeros((plan.block_q, plan.block_k), bool)
    for sid in plan.slice_ids[lo:hi]:
        q0, q1, k0, k1, kind = plan.slices[5 * sid: 5 * sid + 5]
        r, c = rows - q0, cols - k0
        inside = (r >= 0) & (rows < q1) & (c >= 0) & (cols < k1)
        if kind in (slices_lib.CAUSAL, slices_lib.BI_CAUSAL):
            inside &= c <= r + (k1 - k0) - (q1 - q0)
        if kind in (slices_lib.INV_CAUSAL, slices_lib.BI_CAUSAL):
            inside &= c >= r
        seen |= inside
    return seen


def visits(walk, program):
    """[(inner block, partial visit index or None)] of one program."""
    full = [(b, None) for r in range(walk.runs[program])
            for b in range(walk.run_start[program, r], walk.run_stop[program, r])]
    return full + [(walk.block[program, j], j) for j in range(walk.partials[program])]


def plan_to_dense(plan):
    bq, bk = plan.block_q, plan.block_k
    dense = np.zeros((plan.padded_q, plan.padded_k), bool)
    for i in range(plan.num_q_blocks):
        for kb, j in visits(plan.by_q, i):
            tile = np.ones((bq, bk), bool) if j is None else tile_mask(plan, i, j, i * bq, kb * bk)
            assert tile.any(), "a visited tile must hold a visible pair"
            assert not dense[i * bq:(i + 1) * bq, kb * bk:(kb + 1) * bk].any(), "visited twice"
            dense[i * bq:(i + 1) * bq, kb * bk:(kb + 1) * bk] = tile
    return dense[: plan.seqlen_q, : plan.seqlen_k]


@pytest.mark.parametrize("name", MASK_NAMES)
@pytest.mark.parametrize("blocks", [(16, 16), (32, 16), (16, 64)])
def test_the_plan_visits_exactly_the_mask(name, blocks):
    mask = small_mask(name, 200)  # 200: no block size divides it
    plan = make_plan(mask, *blocks)
    assert np.array_equal(plan_to_dense(plan), mask.to_dense())
    sched = mask.block_schedule(*blocks)
    assert plan.tiles() == len(sched.state)  # every non-empty tile, nothing else
    # dK/dV walks the same tiles, kv-block major.
    by_q = {(i, kb, j is None) for i in range(plan.num_q_blocks) for kb, j in visits(plan.by_q, i)}
    by_k = {(qb, kb, j is None) for kb in range(plan.num_k_blocks)
            for qb, j in visits(plan.by_k, kb)}
    assert by_q == by_k


@pytest.mark.parametrize("name", MASK_NAMES)
def test_the_wide_forward_key_block_visits_exactly_the_mask(name):
    """The Mosaic forward's 192-key block (v26), which divides neither the
    length nor the families' own sizes: the plan still covers the mask
    exactly, tiles past the end partial."""
    mask = small_mask(name, 1000)
    plan = make_plan(mask, 128, 192)
    assert (plan.padded_k, plan.num_k_blocks) == (1152, 6)
    assert np.array_equal(plan_to_dense(plan), mask.to_dense())
    assert plan.tiles() == len(mask.block_schedule(128, 192).state)


def test_full_tiles_come_as_runs():
    plan = make_plan(make_mask("causal", 4096), 128, 64)
    assert plan.by_q.runs.tolist() == [0] + [1] * 31  # blocks 0..2i-1 in one run
    assert plan.by_q.run_stop[5, 0] == 10 and plan.by_q.partials[5] == 2


def test_work_follows_the_area():
    full = make_plan(make_mask("full", 4096), 128, 64)
    docs = make_plan(make_mask("causal_document", 4096, doc_lens=[1024] * 4), 128, 64)
    window = make_plan(make_mask("sliding_window_causal", 4096, window=256), 128, 64)
    assert full.tiles() == 32 * 64 and full.partial_tiles() == 0
    # Four causal 1024-token documents: q block i of each sees kv blocks 0..2i+1.
    assert docs.tiles() == 4 * sum(2 * i + 2 for i in range(8))
    assert window.tiles() < full.tiles() / 8
    tables = [*docs.by_q.arrays(), *docs.by_k.arrays(), docs.slices, docs.slice_ids]
    tables = [t for t in tables if t.ndim == 2] + [docs.slices, docs.slice_ids]
    assert all(t.shape[-1] & (t.shape[-1] - 1) == 0 for t in tables)  # Triton-friendly


def test_blocks_launch_heaviest_first():
    # One long document after short ones: in row order its q blocks, the
    # heaviest, would start last; the launch order puts them first.
    mask = make_mask("causal_document", 4096, doc_lens=[256] * 8 + [2048])
    plan = make_plan(mask, 128, 64)
    for walk in (plan.by_q, plan.by_k):
        assert sorted(walk.order.tolist()) == list(range(len(walk.runs)))
        tiles = (walk.run_stop - walk.run_start).sum(1) + walk.partials
        assert np.all(np.diff(tiles[walk.order]) <= 1)  # partial tiles weigh a little more
    assert plan.by_q.order[0] == 31  # the long document's last q block: 32 kv blocks
    assert plan.by_k.order[0] == 32  # its first kv block: seen by all of its 16 q blocks


def test_dkv_launches_heads_together_only_where_a_heavy_program_would_trail():
    def together(name, seqlen, programs_per_block=8):
        params = {"distribution": "chatqa2_long_sft"} if "document" in name else {}
        plan = make_plan(make_mask(name, seqlen, **params), 64, 64)
        return schedule.dkv_launch(plan.geometry, programs_per_block,
                                   "auto") == "heads_together"

    assert not together("full", 16384)  # equal programs: no tail to cut
    assert together("causal_document", 16384)  # measured 19 % faster so
    assert not together("causal_document", 65536)  # measured even
    assert not together("causal", 32768)
    assert not together("causal_document", 16384, programs_per_block=64)  # more programs hide it
    plans = [make_plan(make_mask(name, 4096), 64, 64) for name in ("full", "causal")]
    geometry, _ = stack_plans(plans)
    assert geometry.dkv_tail == plans[1].geometry.dkv_tail > plans[0].geometry.dkv_tail
    with pytest.raises(ValueError, match="head_major, heads_together"):
        ops.Lowering(dkv_launch="heads")


def test_the_forward_grid_follows_the_keys_a_program_walks():
    """Geometry.row_keys is the mean keys a forward program walks (q blocks
    that walk nothing left out); "auto" runs the persistent grid up to
    schedule.PERSISTENT_ROW_KEYS of them where its tiles fit, and a stack
    of plans keeps the longest walk."""
    def keys(mask):
        return make_plan(mask, 128, 128).geometry.row_keys

    assert keys(make_mask("full", 4096)) == 4096
    assert keys(make_mask("causal", 4096)) == 128 * (1 + 32) / 2  # 1..32 tiles
    # Rows 0-255 see nothing: the two q blocks that walk count alone.
    seen_late = AttnMask(512, 512, [AttnSlice(256, 512, 0, 384)])
    assert keys(seen_late) == 384
    assert keys(AttnMask(256, 256, [])) == 0
    plans = [make_plan(make_mask(name, 4096), 128, 128) for name in ("full", "causal")]
    assert stack_plans(plans)[0].row_keys == 4096

    def grid(row_keys, asked="auto", fits=True):
        return schedule.forward_grid(Geometry(8192, 8192, 128, 128, row_keys=row_keys),
                                     asked, fits)

    limit = schedule.PERSISTENT_ROW_KEYS
    assert grid(limit) == "persistent" and grid(limit + 64) == "per_item"
    assert grid(1024, fits=False) == "per_item"
    assert grid(1024, "per_item") == "per_item" and grid(10 * limit, "persistent") == "persistent"
    with pytest.raises(ValueError, match="auto, per_item, persistent"):
        ops.Lowering(forward_grid="sm")


def test_the_cut_share_counts_the_tiles_the_mask_cuts():
    """Geometry.cut_share is the share of the forward's visited tiles that
    are partial (the mask's edge inside, or the sequence's end); a stack of
    plans keeps the largest; forward_key_block widens only up to
    schedule.WIDE_MAX_CUT_SHARE of them."""
    def share(mask, block=128):
        return make_plan(mask, block, block).geometry.cut_share

    assert share(make_mask("full", 4096)) == 0
    assert share(make_mask("causal", 4096)) == 32 / (32 * 33 / 2)  # the diagonal's 32
    assert share(make_mask("full", 4000)) == (32 + 31) / 32**2  # the last row and column
    assert share(AttnMask(256, 256, [])) == 0
    plans = [make_plan(make_mask(name, 4096), 128, 128) for name in ("full", "causal")]
    assert stack_plans(plans)[0].cut_share == 32 / (32 * 33 / 2)

    def key_block(cut_share, row_keys=32768.0, head_dim=128):
        geometry = Geometry(32768, 32768, 128, 128, row_keys=row_keys, cut_share=cut_share)
        return schedule.forward_key_block(geometry, head_dim, 192)

    limit = schedule.WIDE_MAX_CUT_SHARE
    assert key_block(limit) == 192 and key_block(limit + 1e-3) == 128
    assert key_block(0.0, row_keys=schedule.WIDE_ROW_KEYS) == 128
    assert key_block(0.0, head_dim=64) == 128


def test_rows_launch_auto_starts_long_rows_head_after_head():
    """rows_launch "auto" (the default) starts the Mosaic forward's rows
    head after head where a program walks 16k keys or more on average (the
    L2 gain measured on full and causal), every head of a q block together
    elsewhere; a forced order stays as asked."""
    def rows(mask, asked="auto"):
        return schedule.rows_launch(make_plan(mask, 128, 128).geometry, asked)

    assert rows(make_mask("full", 16384)) == "head_major"  # 16,384 keys a program
    assert rows(make_mask("causal", 16384)) == "heads_together"  # 8,256 on average
    assert rows(make_mask("causal", 32768)) == "head_major"  # 16,448
    assert rows(make_mask("sliding_window_causal", 32768)) == "heads_together"
    assert rows(make_mask("full", 4096), "head_major") == "head_major"
    assert rows(make_mask("full", 32768), "heads_together") == "heads_together"
    with pytest.raises(ValueError, match="auto, heads_together, head_major"):
        ops.Lowering(rows_launch="sideways")
