"""jax.pallas_flex: its tile plan, its kernels against the float64 reference
on every family (Pallas interpret mode on a CPU), and its Triton lowering."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_backends import (
    flex_backward_fused_mosaic,
    flex_backward_mosaic,
    flex_kernel,
    flex_kernel_mosaic,
)
from jax_backends.flex_kernel import Lowering, block_gradients, flex_attention, flex_attention_onto
from jax_backends.flex_plan import make_plan, stack_plans
from lcab import reference, results
from lcab.cp import sub_mask
from lcab.masks import MASK_NAMES, AttnMask, AttnSlice, make_mask, small_mask
from lcab.masks import slices as slices_lib
from lcab.runner import Case, Settings, run_cases
from lcab.workloads import Workload

INTERPRET = Lowering(interpret=True)
FUSED = Lowering(interpret=True, fused_backward=True)  # dQ by atomics in the dK/dV pass
# dK/dV launched head by head and every head of a block together (either can be "auto"'s).
HEAD_MAJOR = Lowering(interpret=True, dkv_launch="head_major")
HEADS_TOGETHER = Lowering(interpret=True, dkv_launch="heads_together")


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
        return flex_kernel._heads_together(plan.geometry, programs_per_block, Lowering())

    assert not together("full", 16384)  # equal programs: no tail to cut
    assert together("causal_document", 16384)  # measured 19 % faster so
    assert not together("causal_document", 65536)  # measured even
    assert not together("causal", 32768)
    assert not together("causal_document", 16384, programs_per_block=64)  # more programs hide it
    plans = [make_plan(make_mask(name, 4096), 64, 64) for name in ("full", "causal")]
    geometry, _ = stack_plans(plans)
    assert geometry.dkv_tail == plans[1].geometry.dkv_tail > plans[0].geometry.dkv_tail
    with pytest.raises(ValueError, match="head_major, heads_together"):
        Lowering(dkv_launch="heads")


def inputs(seqlen, heads=(4, 2), head_dim=16, batch=2, seed=0):
    rng = np.random.default_rng(seed)
    hq, hk = heads
    q = rng.normal(size=(batch, seqlen, hq, head_dim)) * 2  # peaked, as the probes
    k = rng.normal(size=(batch, seqlen, hk, head_dim)) * 2
    v = rng.normal(size=(batch, seqlen, hk, head_dim))
    dout = rng.normal(size=(batch, seqlen, hq, head_dim))
    return q, k, v, dout


def run_flex(mask, q, k, v, dout, blocks=(32, 16), backward_blocks=(16, 32), dtype=jnp.float32,
             lowering=INTERPRET):
    forward_plan, backward_plan = make_plan(mask, *blocks), make_plan(mask, *backward_blocks)
    args = [jnp.asarray(x, dtype) for x in (q, k, v)]
    (out, lse), pullback = jax.vjp(
        lambda q, k, v: flex_attention(q, k, v, forward_plan, backward_plan, lowering), *args)
    grads = pullback((jnp.asarray(dout, dtype), jnp.zeros_like(lse)))
    return [np.asarray(x, np.float64) for x in (out, lse, *grads)]


def assert_matches(mask, got, q, k, v, dout, tol):
    out, lse, dq, dk, dv = got
    want_out, want_lse = reference.attention(q, k, v, mask)
    assert np.array_equal(np.isinf(lse), np.isinf(want_lse))
    finite = ~np.isinf(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], atol=tol, rtol=0)
    for got_one, want in zip((out, dq, dk, dv), (want_out, *reference.attention_grads(
            q, k, v, mask, dout))):
        scale = max(1.0, np.abs(want).max())
        np.testing.assert_allclose(got_one / scale, want / scale, atol=tol, rtol=0)


@pytest.mark.parametrize("lowering", [HEAD_MAJOR, HEADS_TOGETHER, FUSED],
                         ids=["head_major", "heads_together", "fused"])
@pytest.mark.parametrize("name", MASK_NAMES)
def test_every_family_matches_the_reference_forward_and_backward(name, lowering):
    mask = small_mask(name, 100)  # odd length, GQA 4:2, batch 2
    q, k, v, dout = inputs(100)
    assert_matches(mask, run_flex(mask, q, k, v, dout, lowering=lowering), q, k, v, dout, 1e-4)


@settings(max_examples=8, deadline=None)
@given(name=st.sampled_from(MASK_NAMES), seed=st.integers(0, 10_000),
       seqlen=st.integers(40, 160), group=st.sampled_from([1, 2, 4]),
       lowering=st.sampled_from([HEAD_MAJOR, HEADS_TOGETHER, FUSED]))
def test_random_masks_lengths_and_groups(name, seed, seqlen, group, lowering):
    mask = make_mask(name, seqlen, seed=seed) if name != "block_causal_document" else \
        small_mask(name, seqlen)
    q, k, v, dout = inputs(seqlen, heads=(4, 4 // group), batch=1, seed=seed)
    got = run_flex(mask, q, k, v, dout, blocks=(16, 32), backward_blocks=(32, 16),
                   lowering=lowering)
    assert_matches(mask, got, q, k, v, dout, 1e-4)


def test_bfloat16_inputs_accumulate_in_float32():
    mask = small_mask("causal_document", 128)
    # The reference sees the same bf16-rounded inputs as the kernel.
    q, k, v, dout = (np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64) for x in inputs(128))
    for lowering in (INTERPRET, FUSED):
        got = run_flex(mask, q, k, v, dout, dtype=jnp.bfloat16, lowering=lowering)
        assert_matches(mask, got, q, k, v, dout, 3e-2)


def test_rows_that_see_nothing_give_zero_and_minus_infinity():
    # Rows 32..47 see no key; the rest see a causal block.
    mask = AttnMask(64, 64, [AttnSlice(0, 32, 0, 32, "causal"), AttnSlice(48, 64, 0, 64)])
    q, k, v, dout = inputs(64, batch=1)
    for lowering in (INTERPRET, FUSED):
        got = run_flex(mask, q, k, v, dout, lowering=lowering)
        out, lse, dq, dk, dv = got
        assert np.all(np.isneginf(lse[:, :, 32:48])) and np.all(out[:, 32:48] == 0)
        assert all(np.isfinite(x).all() for x in (dq, dk, dv))
        assert_matches(mask, got, q, k, v, dout, 1e-4)


def test_the_lse_gradient_flows_for_context_parallel_merges():
    mask = small_mask("causal_document", 64)
    q, k, v, dout = inputs(64, batch=1)
    plan = make_plan(mask, 16, 16)
    visible = jnp.asarray(mask.to_dense())

    def dense(q, k, v):  # the same attention written densely; JAX differentiates it
        kk, vv = (jnp.repeat(x, 2, axis=2) for x in (k, v))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, kk) / np.sqrt(q.shape[-1])
        s = jnp.where(visible, s, -jnp.inf)
        lse = jax.nn.logsumexp(s, axis=-1)
        return jnp.einsum("bhqk,bkhd->bqhd", jnp.exp(s - lse[..., None]), vv), lse

    def loss(attend):
        def value(q, k, v):
            out, lse = attend(q, k, v)
            return jnp.sum(out * dout) + jnp.sum(jnp.sin(lse))
        return jax.grad(value, argnums=(0, 1, 2))(*(jnp.asarray(x, jnp.float32)
                                                    for x in (q, k, v)))

    want = loss(dense)
    for lowering in (INTERPRET, FUSED):
        got = loss(lambda q, k, v: flex_attention(q, k, v, plan, plan, lowering))
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, atol=1e-4)


def test_bad_shapes_are_refused_with_the_reason():
    plan = make_plan(make_mask("causal", 64), 16, 16)
    q = jnp.zeros((1, 64, 3, 16))
    with pytest.raises(ValueError, match="not a multiple"):
        flex_attention(q, jnp.zeros((1, 64, 2, 16)), jnp.zeros((1, 64, 2, 16)), plan)
    with pytest.raises(ValueError, match="a plan for 64 x 64"):
        flex_attention(jnp.zeros((1, 32, 2, 16)), *[jnp.zeros((1, 32, 2, 16))] * 2, plan)


@pytest.mark.parametrize("name", ["causal_document", "share_question", "full"])
def test_attention_continues_onto_more_keys_as_a_ring_step_does(name):
    """Keys in three uneven parts, each call continuing from the last one's
    (out, lse): the rows' attention over all keys, float32 out, exact lse."""
    seqlen, parts = 200, [(0, 70), (70, 71), (71, 200)]  # a one-key part
    mask = make_mask(name, seqlen, seed=2)
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, seqlen, h, 16)) for h in (4, 2, 2))
    partial = None
    for part in parts:
        step = sub_mask(mask, [(0, seqlen)], [part])
        plan = make_plan(step, 32, 32)
        tables = jax.tree.map(jnp.asarray, plan.tables())
        keys = slice(*part)
        partial = flex_attention_onto(*(jnp.asarray(x, jnp.float32) for x in (
            q, k[:, keys], v[:, keys])), partial, plan.geometry, tables, INTERPRET)
    out, lse = partial
    want_out, want_lse = reference.attention(q, k, v, mask)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), want_out, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(lse), want_lse, atol=1e-5, rtol=0)


@pytest.mark.parametrize("lowering", [INTERPRET, FUSED], ids=["two_pass", "fused"])
def test_gradients_add_onto_running_sums_as_a_ring_step_does(lowering):
    """Each key part's dq, dk, dv added inside the kernels to the running
    float32 sums: the sums over the parts are the full gradients."""
    seqlen, parts = 160, [(0, 50), (50, 160)]
    mask = make_mask("causal_document", seqlen, seed=4)
    rng = np.random.default_rng(1)
    q, k, v, dout = (rng.normal(size=(1, seqlen, h, 16)) for h in (4, 2, 2, 4))
    out, lse = reference.attention(q, k, v, mask)
    as32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    dq = jnp.zeros(q.shape, jnp.float32)
    dk, dv = np.zeros(k.shape), np.zeros(v.shape)
    for part in parts:
        plan = make_plan(sub_mask(mask, [(0, seqlen)], [part]), 32, 32)
        keys = slice(*part)
        dq, dk_part, dv_part = block_gradients(
            as32(q), as32(k[:, keys]), as32(v[:, keys]), as32(out), as32(lse), as32(dout),
            plan.geometry, jax.tree.map(jnp.asarray, plan.tables()), lowering,
            onto=(dq, jnp.full(k[:, keys].shape, 0.5, jnp.float32),
                  jnp.full(v[:, keys].shape, -0.5, jnp.float32)))
        assert dq.dtype == dk_part.dtype == jnp.float32
        dk[:, keys], dv[:, keys] = np.asarray(dk_part) - 0.5, np.asarray(dv_part) + 0.5
    for got, want in zip((dq, dk, dv), reference.attention_grads(q, k, v, mask, dout)):
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=0)


def test_the_kernels_lower_to_triton_for_a_gpu():
    """Lowering to Triton IR needs no GPU: this catches what interpret mode
    would let through (ops the Triton lowering lacks, type clashes)."""
    mask = make_mask("causal_document", 1000)  # not a multiple of any block
    forward_plan, backward_plan = make_plan(mask, 128, 64), make_plan(mask, 64, 64)
    q = jax.ShapeDtypeStruct((1, 1000, 8, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 1000, 2, 128), jnp.bfloat16)
    for lowering, kernels in ((Lowering(), ("lcab_flex_forward", "lcab_flex_dq", "lcab_flex_dkv")),
                              (Lowering(fused_backward=True), ("lcab_flex_dkv_dq",))):
        def loss(q, k, v, lowering=lowering):
            out, lse = flex_attention(q, k, v, forward_plan, backward_plan, lowering)
            return out.astype(jnp.float32).sum() + lse.sum()

        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(
            lowering_platforms=("cuda",)).as_text()
        assert all(kernel in text for kernel in kernels)
    tables = jax.tree.map(jnp.asarray, forward_plan.tables())
    partial = (jax.ShapeDtypeStruct((1, 1000, 8, 128), jnp.float32),
               jax.ShapeDtypeStruct((1, 8, 1000), jnp.float32))
    onto = lambda q, k, v, partial: flex_attention_onto(  # noqa: E731
        q, k, v, partial, forward_plan.geometry, tables, Lowering())
    text = jax.jit(onto).trace(q, kv, kv, partial).lower(lowering_platforms=("cuda",)).as_text()
    assert "lcab_flex_forward_onto" in text
    backward_tables = jax.tree.map(jnp.asarray, backward_plan.tables())
    sums = (partial[0], jax.ShapeDtypeStruct(kv.shape, jnp.float32),
            jax.ShapeDtypeStruct(kv.shape, jnp.float32))
    for lowering in (Lowering(), Lowering(fused_backward=True)):
        def step(q, k, v, out, lse, sums, lowering=lowering):
            return block_gradients(q, k, v, out, lse, out.astype(q.dtype),
                                   backward_plan.geometry, backward_tables, lowering, onto=sums)

        text = jax.jit(step).trace(q, kv, kv, *partial, sums).lower(
            lowering_platforms=("cuda",)).as_text()
        assert ("lcab_flex_dkv_dq" if lowering.fused_backward else "lcab_flex_dq_onto") in text


@pytest.mark.parametrize("head_dim,dtype,block_k,persistent", [
    (128, jnp.bfloat16, 128, False), (64, jnp.float16, 64, False), (256, jnp.bfloat16, 64, False),
    (128, jnp.bfloat16, 128, True)])
def test_the_mosaic_forward_lowers_for_a_gpu_on_every_family(head_dim, dtype, block_k, persistent,
                                                             monkeypatch):
    """Mosaic GPU's interpret mode cannot run this kernel (flex_kernel_mosaic
    says why), so on a CPU it is lowered to Mosaic GPU's MLIR instead: that
    catches ops and layouts the lowering lacks; its numbers are checked on a
    GPU (results/gpu/2026-11-26-h100-pallas-flex-mosaic/). The persistent
    variant gets 5 SMs, so its programs take uneven numbers of items."""
    monkeypatch.setattr(flex_kernel_mosaic, "streaming_multiprocessors", lambda: 5)
    for name in MASK_NAMES:
        plan = make_plan(small_mask(name, 300), 128, block_k)  # 300: padded rows and columns
        tables = jax.tree.map(jnp.asarray, plan.tables())
        q = jax.ShapeDtypeStruct((2, plan.padded_q, 4, head_dim), dtype)
        kv = jax.ShapeDtypeStruct((2, plan.padded_k, 2, head_dim), dtype)
        forward = lambda q, k, v, t, plan=plan: flex_kernel_mosaic.forward(
            q, k, v, plan.geometry, t, persistent=persistent)
        text = jax.jit(forward).trace(q, kv, kv, tables).lower(
            lowering_platforms=("cuda",)).as_text()
        assert text.count("stablehlo.custom_call @mosaic_gpu") == 1, name


@pytest.mark.parametrize("head_dim,dtype,heads_together,parts", [
    (128, jnp.bfloat16, False, 1), (64, jnp.float16, True, 1), (128, jnp.bfloat16, True, 2)])
def test_the_mosaic_backward_lowers_for_a_gpu_on_every_family(head_dim, dtype, heads_together,
                                                              parts):
    """As the forward: lowered to Mosaic GPU's MLIR, both kernels, every
    family (its numbers are for a GPU to check)."""
    for name in MASK_NAMES:
        plan = make_plan(small_mask(name, 300), 128, 128)
        tables = jax.tree.map(jnp.asarray, plan.tables())
        q = jax.ShapeDtypeStruct((2, plan.padded_q, 4, head_dim), dtype)
        kv = jax.ShapeDtypeStruct((2, plan.padded_k, 2, head_dim), dtype)
        rows = jax.ShapeDtypeStruct((2, 4, plan.padded_q), jnp.float32)

        def gradients(q, k, v, dout, lse2, delta, t, plan=plan):
            return flex_backward_mosaic.backward(q, k, v, dout, lse2, delta, plan.geometry, t,
                                                 heads_together=heads_together, parts=parts)

        text = jax.jit(gradients).trace(q, kv, kv, q, rows, rows, tables).lower(
            lowering_platforms=("cuda",)).as_text()
        assert "lcab_flex_dq_mosaic" in text and "lcab_flex_dkv_mosaic" in text, name


@pytest.mark.parametrize("dtype,heads_together", [(jnp.bfloat16, False), (jnp.float16, True)])
def test_the_one_pass_mosaic_backward_lowers_for_a_gpu_on_every_family(dtype, heads_together):
    """v7 (dQ by TMA reduce-adds from the dK/dV kernel): lowered to Mosaic
    GPU's MLIR for every family (its numbers are checked on a GPU:
    results/gpu/2026-11-27-pallas-flex-v6b/)."""
    for name in MASK_NAMES:
        plan = make_plan(small_mask(name, 300), 128, 128)
        tables = jax.tree.map(jnp.asarray, plan.tables())
        q = jax.ShapeDtypeStruct((2, plan.padded_q, 4, 128), dtype)
        kv = jax.ShapeDtypeStruct((2, plan.padded_k, 2, 128), dtype)
        rows = jax.ShapeDtypeStruct((2, 4, plan.padded_q), jnp.float32)

        def gradients(q, k, v, dout, lse2, delta, t, plan=plan):
            return flex_backward_fused_mosaic.backward(q, k, v, dout, lse2, delta, plan.geometry,
                                                       t, heads_together=heads_together)

        text = jax.jit(gradients).trace(q, kv, kv, q, rows, rows, tables).lower(
            lowering_platforms=("cuda",)).as_text()
        # One Mosaic kernel (its name is inside the serialised module); dQ is its third result.
        assert text.count("stablehlo.custom_call @mosaic_gpu") == 1, name
        assert ":3 = stablehlo.custom_call @mosaic_gpu" in text, name
    assert "head_dim 128, not 64" in flex_backward_fused_mosaic.problem(128, 128, "bfloat16", 64)
    assert flex_backward_fused_mosaic.problem(128, 128, "bfloat16", 128) is None


def test_the_mosaic_forward_says_what_it_cannot_take():
    problem = flex_kernel_mosaic.problem
    assert problem(128, 128, "bfloat16", 128) is None and problem(128, 64, "float16", 256) is None
    assert "bf16 or f16" in problem(128, 128, "float32", 128)
    assert "head_dim 64, 128, 192 or 256" in problem(128, 128, "bfloat16", 32)
    assert "block_q=128" in problem(64, 128, "bfloat16", 128)
    assert "64 above head_dim 128" in problem(128, 128, "bfloat16", 256)
    # On a CPU "auto" takes the Triton forward; "mosaic" is refused with its reason.
    from lcab import registry
    workload = Workload(1, 256, 256, 4, 2, 64, "bfloat16", small_mask("causal", 256))
    auto = registry.load_backend("jax.pallas_flex", {})
    assert auto.lowering.forward_lowering == "auto"
    assert "forward Triton, backward Triton" in auto.mask_support(workload).how
    mosaic = registry.load_backend("jax.pallas_flex", {"forward_lowering": "mosaic"})
    support = mosaic.mask_support(workload)
    assert not support.ok and "forward_lowering=mosaic: needs a CUDA GPU" in support.reason
    with pytest.raises(ValueError, match="choose one of auto, triton, mosaic"):
        Lowering(forward_lowering="wgmma")
    with pytest.raises(ValueError, match="no interpret mode"):
        Lowering(interpret=True, forward_lowering="mosaic")
    with pytest.raises(ValueError, match="forward_stages=1"):
        Lowering(forward_stages=1)


def test_the_mosaic_backward_says_what_it_cannot_take():
    problem = flex_backward_mosaic.problem
    assert problem(128, 128, "bfloat16", 128) is None and problem(128, 128, "float16", 64) is None
    assert "bf16 or f16" in problem(128, 128, "float32", 128)
    assert "head_dim 64 or 128" in problem(128, 128, "bfloat16", 256)
    assert "backward blocks 128 x 128, not 64 x 64" in problem(64, 64, "bfloat16", 128)
    from lcab import registry
    workload = Workload(1, 256, 256, 4, 2, 64, "bfloat16", small_mask("causal", 256))
    assert Lowering().backward_lowering == "auto"
    mosaic = registry.load_backend("jax.pallas_flex", {"backward_lowering": "mosaic"})
    support = mosaic.mask_support(workload)
    assert not support.ok and "backward_lowering=mosaic: needs a CUDA GPU" in support.reason
    with pytest.raises(ValueError, match="choose one of auto, triton, mosaic"):
        Lowering(backward_lowering="wgmma")
    with pytest.raises(ValueError, match="backward_lowering=mosaic has no interpret mode"):
        Lowering(interpret=True, backward_lowering="mosaic")
    with pytest.raises(ValueError, match="backward_parts=3: choose one of 1, 2"):
        Lowering(backward_parts=3)


def test_the_backward_blocks_follow_the_backward_that_runs(monkeypatch):
    """128 x 128 where the Mosaic backward runs (a Hopper GPU, faked here),
    64 x 64 for the Triton one: on a CPU, for float32 or head_dim 32, and
    for a ring adding onto running sums; blocks that are set always win."""
    from jax_backends import _shared
    from lcab import registry
    auto = registry.load_backend("jax.pallas_flex", {})
    assert auto.backward_blocks("bfloat16", 128) == (64, 64)  # this CPU
    monkeypatch.setattr(_shared, "gpu_problem", lambda **_: None)
    auto = registry.load_backend("jax.pallas_flex", {"interpret": False})
    assert auto.backward_blocks("bfloat16", 128) == (128, 128)
    assert auto.backward_blocks("float16", 64) == (128, 128)
    assert auto.backward_blocks("float32", 128) == (64, 64)
    assert auto.backward_blocks("bfloat16", 32) == (64, 64)
    from jax_backends.context_parallel import RingBackend
    summing = RingBackend(merge="in_kernel", interpret=False).inner  # adds onto running sums
    assert summing.backward_blocks("bfloat16", 128) == (64, 64)
    assert RingBackend(interpret=False).inner.backward_blocks("bfloat16", 128) == (128, 128)
    triton = registry.load_backend("jax.pallas_flex",
                                   {"interpret": False, "backward_lowering": "triton"})
    assert triton.backward_blocks("bfloat16", 128) == (64, 64)
    set_blocks = registry.load_backend("jax.pallas_flex",
                                       {"interpret": False, "backward_block_q": 32})
    assert set_blocks.backward_blocks("bfloat16", 128) == (32, 128)
    workload = Workload(1, 256, 256, 4, 2, 128, "bfloat16", small_mask("causal", 256))
    backward_plan = auto.plans(workload)[1]
    assert (backward_plan.block_q, backward_plan.block_k) == (128, 128)
    assert "forward Mosaic GPU, backward Mosaic GPU" in auto.mask_support(workload).how


def test_the_backend_runs_through_the_correctness_gate(tmp_path):
    mask = small_mask("share_question", 256)
    case = Case("jax.pallas_flex", Workload(1, 256, 256, 4, 2, 32, "float32", mask))
    path = tmp_path / "rows.jsonl"
    # Nine repeats; even so CI twice reported this bwd row as ERROR (the full
    # suite on a 2-core host, never alone), without its reason. A CPU time too
    # noisy to subtract ("not measurable") is the row's honest answer; any
    # other failure of the backward still fails here, printing its reason.
    run_cases([case], results.Writer(path), Settings(warmup=2, iters=9, git_commit="t"))
    rows = results.read_rows([path])
    assert [r["direction"] for r in rows] == ["fwd", "bwd"]
    for row in rows:
        unmeasurable = row["status"] == "ERROR" and row["reason"].startswith("not measurable")
        assert row["status"] == "OK" or unmeasurable, (row["reason"], row["samples_ms"])
    assert all(r["max_err"] < 1e-4 for r in rows)
    assert rows[0]["notes"].startswith("block plan from the mask's slices")


def test_options_choose_blocks_and_lowering_and_rows_say_so(tmp_path):
    mask = small_mask("causal_document", 200)
    settings = Settings(warmup=1, iters=7, git_commit="t", backend_options=(
        ("jax.pallas_flex", "block_k", "32"), ("jax.pallas_flex", "backward_block_q", "32")))
    case = Case("jax.pallas_flex", Workload(1, 200, 200, 4, 2, 32, "float32", mask))
    path = tmp_path / "rows.jsonl"
    run_cases([case], results.Writer(path), settings)
    rows = results.read_rows([path])
    assert [r["status"] for r in rows] == ["OK", "OK"], [r["reason"] for r in rows]
    assert all("backward_block_q=32; block_k=32" in r["notes"] for r in rows)
    from lcab import registry
    backend = registry.load_backend("jax.pallas_flex", {"block_k": "32", "num_stages": "3",
                                                        "fused_backward": "true"})
    assert backend.tiling.block_k == 32 and backend.lowering.num_stages == 3
    assert backend.lowering.fused_backward is True
    with pytest.raises(ValueError, match="its options: backward_block_k, backward_block_q"):
        type(backend).parse_options({"block_size": "64"})
    with pytest.raises(ValueError, match="block_k='big' is not a int"):
        type(backend).parse_options({"block_k": "big"})


def test_block_sizes_must_be_triton_tiles():
    from lcab import registry

    with pytest.raises(registry.Unavailable, match="block_k=48: blocks are powers of two"):
        registry.load_backend("jax.pallas_flex", {"block_k": "48"})


def test_the_backward_kernel_timing_script_lowers_every_mosaic_kernel_and_ablation():
    """experiments/pallas_flex_backward_kernels.py reaches into the kernel
    modules (DKV_REGISTERS, DQ_LAYOUT, the one-pass kernel's plgpu and
    two_pass) to time ablations on a GPU: each Mosaic entry, ablations
    included, still lowers to Mosaic GPU's MLIR, and the overrides are
    undone afterwards. In its own process: the script defines absl flags
    (--masks, --out) that LCAB's CLIs define too."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).parent.parent
    program = """
import importlib.util, sys
from jax_backends import flex_backward_fused_mosaic as fused
from jax_backends import flex_backward_mosaic as two_pass
from lcab.masks import small_mask
path = "experiments/pallas_flex_backward_kernels.py"
spec = importlib.util.spec_from_file_location("kernels", path)
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
kept = (two_pass.DKV_REGISTERS, fused.DQ_LAYOUT, fused.plgpu, fused.two_pass)
for name, matmuls, fn, args in script._kernels(small_mask("causal_document", 512), 512):
    if name.startswith("triton"):
        continue
    text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "stablehlo.custom_call @mosaic_gpu" in text, name
    print(matmuls, name)
assert kept == (two_pass.DKV_REGISTERS, fused.DQ_LAYOUT, fused.plgpu, fused.two_pass)
"""
    done = subprocess.run([sys.executable, "-c", program], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 10, lines
    assert sum(" fused dkv+dq" in line for line in lines) == 5, lines
    assert all(line.split()[0] in ("3", "4", "5") for line in lines), lines


_TILE_TABLES = {  # folder -> the script's invocations, in the order of the file's tables
    "results/gpu/2026-11-27-pallas-flex-v6b": [["call7", "call8"], ["call4/paper"]],
    "results/gpu/2026-11-27-pallas-flex-table": [["call1", "call2", "call3"]],
}


@pytest.mark.parametrize("folder", sorted(_TILE_TABLES))
def test_the_committed_tile_efficiency_table_is_what_the_script_prints(folder):
    """results/.../tile_efficiency.md (cited by the README and
    docs/pallas_flex.md) is experiments/pallas_flex_tile_efficiency.py's
    output on the committed rows: each mask rebuilt from its row, its
    plan's useful fraction, the slice-aligned bound and the measured
    ratios."""
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).parent.parent
    committed = [line for line in (root / folder / "tile_efficiency.md").read_text().splitlines()
                 if line.startswith("| ") and not line.startswith("| mask")]
    printed = []
    for dirs in _TILE_TABLES[folder]:
        command = [sys.executable, "experiments/pallas_flex_tile_efficiency.py",
                   *(str(root / folder / d) for d in dirs)]
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(root)})
        assert done.returncode == 0, done.stderr[-2000:]
        printed += [line for line in done.stdout.splitlines()
                    if line.startswith("| ") and not line.startswith("| mask")]
    assert printed == committed
    causal_document = next(line for line in printed
                           if line.startswith("| causal_document (chatqa2_long_sft) | 32k"))
    useful, aligned = causal_document.split(" | ")[2:4]
    assert (useful, aligned) == ("0.83", "0.87")  # the documents target is out of 128-tile reach


def test_slice_aligned_tiles_count_each_slice_from_its_own_corner():
    """Causal documents of 64 and 256 tokens. The whole mask's 128 x 128
    plan: q block 0 holds both documents (1 tile), blocks 1 and 2 hold the
    second one, which starts inside kv tile 0 (2 and 3 tiles): 6. Planned
    alone, the first document is one tile and the second a 2 x 2 lower
    triangle: 4."""
    from lcab.masks.mask import AttnMask
    from lcab.masks.slices import AttnSlice
    from tests import experiment_scripts

    script = experiment_scripts.load("pallas_flex_tile_efficiency")
    mask = AttnMask(320, 320, [AttnSlice(0, 64, 0, 64, "causal"),
                               AttnSlice(64, 320, 64, 320, "causal")])
    assert make_plan(mask, 128, 128).tiles() == 6
    assert script.aligned_tiles(mask, 128) == 4
