"""The PyTorch kernel backends: exact on every family they claim, honest elsewhere.

On a CPU: torch.sdpa_math and torch.flex (uncompiled) against the float64
reference through the runner, the flex BlockMask against the dense mask,
UNAVAILABLE reasons of the GPU-only and not-installed backends, and the
capability logic of the GPU backends through supports() alone. Tests marked
`gpu` run every torch backend on a GPU.
"""

import importlib
import importlib.util
import time

import numpy as np
import pytest
import torch

from lcab import registry, results
from lcab.masks import MASK_NAMES, AttnMask, AttnSlice, make_mask, small_mask
from lcab.runner import Case, Settings, run_cases
from lcab.validation import TOLERANCE
from lcab.workloads import Workload
from tests.row_checks import measured_or_noisy
from torch_backends.kernels import flash_attn, flash_style, flex, sdpa, varlen

ON_GPU = torch.cuda.is_available()
without_gpu = pytest.mark.skipif(ON_GPU, reason="checks what a machine without a GPU says")
FAST = Settings(warmup=0, iters=1, flush_l2=False)
TORCH_BACKENDS = registry.backend_names("torch", "kernel")
GPU_ONLY = ["torch.sdpa_cudnn", "torch.sdpa_flash", "torch.sdpa_efficient", "torch.varlen"]
PACKAGES = {"torch.flash_attn": "flash_attn", "torch.fa3": "flash_attn_interface",
            "torch.fa4": "flash_attn.cute"}


def workload(mask, heads=(2, 1), head_dim=16, dtype="float32", batch=1):
    return Workload(batch, mask.seqlen_q, mask.seqlen_k, *heads, head_dim, dtype, mask)


def run(tmp_path, cases, settings=FAST):
    path = tmp_path / "rows.jsonl"
    run_cases(cases, results.Writer(path), settings)
    return results.read_rows([path])


def not_ok(rows):
    # Tiny CPU cases can make fwd+bwd - fwd unmeasurable; that is not the backend's fault.
    return [(r["backend"], r["mask"], r["direction"], r["status"], r["reason"]) for r in rows
            if not measured_or_noisy(r)]


# ----- exactness on CPU --------------------------------------------------------
# 200 tokens: not a multiple of flex's 128-token blocks; heads 2:1 is GQA ratio 2.
@pytest.mark.parametrize("backend", ["torch.sdpa_math", "torch.flex"])
def test_cpu_backends_match_the_reference_on_every_family(tmp_path, backend):
    cases = [Case(backend, workload(small_mask(m, 200))) for m in MASK_NAMES]
    rows = run(tmp_path, cases)
    directions = registry.load_backend(backend).directions
    by_direction = [r for r in rows if r["direction"] in directions]
    assert not not_ok(by_direction)
    assert len(by_direction) == len(MASK_NAMES) * len(directions)
    assert max(r["max_err"] for r in by_direction) < TOLERANCE["float32"] / 4


def test_flex_on_cpu_is_forward_only_and_says_so(tmp_path):
    """Its backward exists on a GPU: on a CPU its row is UNAVAILABLE (the
    machine lacks it, "-"), not UNSUPPORTED (a mask it cannot express, X)."""
    rows = run(tmp_path, [Case("torch.flex", workload(small_mask("causal", 64)))])
    by_direction = {r["direction"]: r for r in rows}
    assert by_direction["fwd"]["status"] == "OK"
    assert "uncompiled flex_attention" in by_direction["fwd"]["notes"]
    bwd = by_direction["bwd"]
    assert (bwd["status"], bwd["reason"]) == ("UNAVAILABLE", (
        "torch.flex has no bwd pass here: torch runs FlexAttention's backward on a GPU only "
        "(it raises on a CPU)"))


def test_flex_on_cpu_runs_uncompiled_without_torchs_warning_to_compile(monkeypatch):
    """Uncompiled is chosen on a CPU: the default CPU sweep does not open
    with torch's advice to compile (its rows' notes say how they ran);
    flex_attention called directly still warns (the control)."""
    import warnings

    import torch.nn.attention.flex_attention as torch_flex

    from torch_backends.kernels import flex

    q = torch.randn(1, 2, 128, 16)

    def warned(attention) -> list[str]:
        monkeypatch.setattr(torch_flex, "_WARNINGS_SHOWN", set())  # torch warns once a process
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = attention(q, q, q)
        assert out.shape == q.shape
        return [str(w.message) for w in caught if "torch.compile" in str(w.message)]

    assert warned(torch_flex.flex_attention)  # the control: torch does warn
    assert warned(flex.eager_flex_attention) == []


@pytest.mark.parametrize("backend", ["torch.sdpa_math", "torch.flex"])
def test_low_precision_and_batches(tmp_path, backend):
    masks = ["causal_document", "var_block_sparse", "longformer_window"]
    cases = [Case(backend, workload(small_mask(m, 300), (4, 2), 32, "bfloat16", 2))
             for m in masks]
    rows = run(tmp_path, cases)
    fwd = [r for r in rows if r["direction"] == "fwd"]
    assert not not_ok(fwd) and len(fwd) == len(masks)
    assert max(r["max_err"] for r in fwd) < TOLERANCE["bfloat16"] / 4


def test_sdpa_math_refuses_oversized_dense_masks_only():
    backend = sdpa.SdpaMathBackend()
    assert backend.supports(workload(make_mask("causal", 32768))).how == "is_causal; enable_gqa"
    refused = backend.supports(workload(make_mask("causal_document", 32768)))
    assert not refused.ok and "32768 x 32768 exceeds" in refused.reason


# ----- ring forms -------------------------------------------------------------------
RING_KERNELS = ["torch.sdpa_math", "torch.flex"]


@pytest.mark.parametrize("backend", RING_KERNELS)
def test_ring_kernels_give_out_and_lse_of_a_step(backend):
    # A step's sub-mask whose first 32 rows see nothing; heads 4:2 is GQA.
    mask = AttnMask(96, 128, [AttnSlice(32, 96, 0, 128, "causal")], name="custom")
    kernel = registry.load_backend(backend).ring_kernel()
    assert kernel.refusal(mask) is None
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, seqlen, 16, generator=generator)
               for heads, seqlen in ((4, 96), (2, 128), (2, 128)))
    out, lse = kernel.step(mask, gqa_ratio=2)(q, k, v)

    k64, v64 = (x.double().repeat_interleave(2, dim=1) for x in (k, v))
    scores = (q.double() @ k64.transpose(-1, -2)) / 4.0
    scores = scores.masked_fill(~torch.from_numpy(mask.to_dense()), float("-inf"))
    want_lse = torch.logsumexp(scores, dim=-1)
    seen = want_lse.isfinite()
    assert torch.equal(seen, lse.isfinite()) and not seen[..., :32].any()
    torch.testing.assert_close(lse[seen].double(), want_lse[seen], atol=1e-5, rtol=1e-5)
    want = torch.softmax(scores[..., 32:, :], dim=-1) @ v64
    torch.testing.assert_close(out[..., 32:, :].double(), want, atol=1e-5, rtol=1e-5)
    assert not out[..., :32, :].any()


def test_other_kernels_have_no_ring_form_and_say_why():
    for name in set(TORCH_BACKENDS) - set(RING_KERNELS):
        cls = registry.all_backends()[name].load()
        assert cls().ring_kernel() is None, name
        assert "log-sum-exp" in cls.no_ring_kernel, name


def test_the_dense_ring_kernel_keeps_to_small_steps():
    kernel = sdpa.SdpaMathBackend().ring_kernel()
    step = AttnMask(8192, 16384, [AttnSlice(0, 8192, 0, 16384, "full")], name="custom")
    assert "scores a 8192 x 16384 step" in kernel.refusal(step)


# ----- the flex BlockMask --------------------------------------------------------
def expand_block_mask(block_mask, seqlen_q, seqlen_k):
    """The dense mask a BlockMask means: full tiles, plus mask_mod in partial ones."""
    q = torch.arange(seqlen_q)[:, None]
    kv = torch.arange(seqlen_k)[None, :]
    mask_mod = block_mask.mask_mod(0, 0, q, kv).numpy()
    block = block_mask.BLOCK_SIZE[0]
    dense = np.zeros((seqlen_q, seqlen_k), dtype=bool)
    lists = [(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, True),
             (block_mask.kv_num_blocks, block_mask.kv_indices, False)]
    for counts, indices, full in lists:
        for qb, count in enumerate(counts[0, 0].tolist()):
            rows = slice(qb * block, (qb + 1) * block)
            for kb in indices[0, 0, qb, :count].tolist():
                cols = slice(kb * block, (kb + 1) * block)
                dense[rows, cols] = True if full else mask_mod[rows, cols]
    return dense, mask_mod


@pytest.mark.parametrize("seqlen", [200, 700, 1024])
@pytest.mark.parametrize("name", MASK_NAMES)
def test_block_mask_is_exactly_the_mask(name, seqlen):
    mask = small_mask(name, seqlen)
    block_mask = flex.build_block_mask(mask, "cpu")
    want = mask.to_dense()
    through_tables, mask_mod_everywhere = expand_block_mask(block_mask, seqlen, seqlen)
    np.testing.assert_array_equal(through_tables, want)
    # The uncompiled path evaluates mask_mod on every pair: exact everywhere too.
    np.testing.assert_array_equal(mask_mod_everywhere, want)
    # BlockMask's own view of which tiles are visited is the schedule's.
    visited = block_mask.to_dense()[0, 0].numpy() > 0
    np.testing.assert_array_equal(visited, mask.block_schedule(128, 128).to_dense() > 0)


def test_block_mask_of_a_non_square_hand_built_mask():
    # A diagonal band and a causal block that starts mid-way: ragged tiles both ways.
    mask = AttnMask(300, 500, [AttnSlice(0, 300, 200, 500, "bi_causal"),
                               AttnSlice(0, 300, 0, 150, "causal")], name="custom")
    through_tables, _ = expand_block_mask(flex.build_block_mask(mask, "cpu"), 300, 500)
    np.testing.assert_array_equal(through_tables, mask.to_dense())


def test_block_mask_builds_fast_and_small_at_128k():
    worst = 0.0
    for name in MASK_NAMES:
        mask = make_mask(name, 131072, seed=0)
        start = time.perf_counter()
        block_mask = flex.build_block_mask(mask, "cpu")
        worst = max(worst, time.perf_counter() - start)
        assert block_mask.kv_indices.shape == (1, 1, 1024, 1024)
    assert worst < 10.0


# ----- availability ----------------------------------------------------------------
def test_every_torch_backend_module_imports_without_optional_packages():
    for name in TORCH_BACKENDS:
        assert registry.all_backends()[name].load().name == name


@without_gpu
def test_gpu_only_backends_are_unavailable_naming_the_missing_gpu(tmp_path):
    mask = small_mask("causal", 64)
    rows = run(tmp_path, [Case(name, workload(mask, dtype="bfloat16")) for name in GPU_ONLY])
    assert {r["status"] for r in rows} == {"UNAVAILABLE"} and len(rows) == 2 * len(GPU_ONLY)
    assert all("needs a CUDA GPU" in r["reason"] for r in rows)


@pytest.mark.parametrize("name, module", PACKAGES.items())
def test_flash_attn_packages_are_unavailable_naming_the_package(tmp_path, name, module):
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is not None:
        pytest.skip(f"{top} is installed here")
    rows = run(tmp_path, [Case(name, workload(small_mask("causal", 64), dtype="bfloat16"))])
    assert {r["status"] for r in rows} == {"UNAVAILABLE"}
    assert all(f"cannot import {module}" in r["reason"] for r in rows)


# ----- capability logic of the GPU backends, without a GPU ---------------------------
SEED = dict(heads=(64, 8), head_dim=128, dtype="bfloat16")


def seed_workload(name, seqlen=4096, **overrides):
    return workload(make_mask(name, seqlen, seed=0), **{**SEED, **overrides})


@without_gpu  # with a GPU, the installed torch answers instead of the declarations
def test_sdpa_fused_backends_declare_what_they_express():
    flash, efficient, cudnn = (sdpa.SdpaFlashBackend(), sdpa.SdpaEfficientBackend(),
                               sdpa.SdpaCudnnBackend())
    assert flash.supports(seed_workload("causal")).how == "is_causal; enable_gqa"
    assert efficient.supports(seed_workload("full")).how == (
        "no mask; K/V heads repeated (EFFICIENT_ATTENTION takes no enable_gqa)")
    assert cudnn.supports(seed_workload("causal")).how == "is_causal; enable_gqa"
    assert flash.supports(seed_workload("causal", heads=(8, 8))).how == "is_causal"

    refused = flash.supports(seed_workload("causal_document"))
    assert not refused.ok and "FLASH_ATTENTION takes no attn_mask" in refused.reason
    for backend in (efficient, cudnn):
        assert backend.supports(seed_workload("sliding_window_causal", 8192)).how.startswith(
            "dense boolean attn_mask")
        too_long = backend.supports(seed_workload("sliding_window_causal", 16384))
        assert not too_long.ok and "16384 x 16384 exceeds" in too_long.reason

    assert not flash.supports(seed_workload("causal", dtype="float32")).ok
    assert efficient.supports(seed_workload("causal", dtype="float32")).ok
    assert not cudnn.supports(seed_workload("causal", head_dim=192)).ok
    assert not flash.supports(seed_workload("causal", head_dim=512)).ok


def test_non_square_causal_is_never_is_causal():
    # torch's is_causal is top-left aligned; LCAB's causal slice bottom-right.
    mask = AttnMask(128, 256, [AttnSlice(0, 128, 0, 256, "causal")], name="custom")
    w = workload(mask, heads=(8, 8), head_dim=64, dtype="bfloat16")
    assert sdpa.SdpaMathBackend().supports(w).how == "dense boolean attn_mask"
    assert not sdpa.SdpaFlashBackend().supports(w).ok
    assert not varlen.VarlenBackend().supports(w).ok


def test_varlen_expresses_windows_and_documents_only():
    backend = varlen.VarlenBackend()
    gqa = "enable_gqa" if varlen.takes_enable_gqa() else "K/V heads repeated (no enable_gqa here)"
    expected = {
        "full": "no mask", "causal": "causal", "sliding_window": "window_size",
        "sliding_window_causal": "window_size", "full_document": "cu_seqlens (full documents)",
        "causal_document": "cu_seqlens (causal documents)",
    }
    for name in MASK_NAMES:
        # At 4k the blog's 2048-token blocks often leave every document one
        # block (full documents, which varlen does express); at 32k they do not.
        work = seed_workload(name, seqlen=32768 if name == "varlen_block_causal" else 4096)
        support = backend.supports(work)
        if name in expected:
            assert support.how == f"{expected[name]}; {gqa}", name
        else:
            assert not support.ok and "none of these" in support.reason, name
    assert not backend.supports(seed_workload("causal", dtype="float32")).ok


def test_flash_attn_packages_declare_their_families_and_head_dims():
    fa2, fa3, fa4 = (flash_attn.FlashAttn2Backend(), flash_attn.FlashAttn3Backend(),
                     flash_attn.FlashAttn4Backend())
    for backend in (fa2, fa3, fa4):
        assert backend.supports(seed_workload("causal_document")).how == (
            "cu_seqlens (causal documents); GQA native")
        assert backend.supports(seed_workload("sliding_window")).how == "window_size; GQA native"
        assert not backend.supports(seed_workload("share_question")).ok
        assert not backend.supports(seed_workload("causal", dtype="float32")).ok
    assert fa2.supports(seed_workload("causal", head_dim=256)).ok
    assert not fa3.supports(seed_workload("causal", head_dim=80)).ok
    assert not fa4.supports(seed_workload("causal", head_dim=256)).ok


def test_flash_windows_speak_each_packages_dialect():
    fa2, fa4 = flash_attn.FlashAttn2Backend(), flash_attn.FlashAttn4Backend()
    causal, band, right_only = (flash_style.FlashPlan(window, None, "")
                                for window in [(-1, 0), (16, 0), (-1, 3)])
    assert fa2._window(causal) == (True, (-1, -1))
    assert fa2._window(band) == (False, (16, 0))
    assert fa4._window(causal) == (True, (None, None))
    assert fa4._window(right_only) == (False, (None, 3))


def test_packed_documents_repeat_per_batch_row():
    plan = flash_style.flash_plan(make_mask("causal_document", 100, doc_lens=[30, 70]))
    cu, longest = flash_style.batch_cu_seqlens(plan, batch=2, seqlen=100)
    assert cu.tolist() == [0, 30, 100, 130, 200] and cu.dtype == np.int32 and longest == 70


# ----- on a GPU ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("backend", TORCH_BACKENDS)
def test_every_torch_backend_on_every_family_on_a_gpu(tmp_path, backend):
    # 700 tokens: 6 flex blocks, the last ragged; 14 flex cases in a row also
    # outnumber Dynamo's default recompile limit (8).
    cases = [Case(backend, workload(small_mask(m, 700), (8, 2), 64, "bfloat16", 2))
             for m in MASK_NAMES]
    rows = run(tmp_path, cases)
    assert not [r for r in not_ok(rows) if r[3] in ("ERROR", "MISMATCH", "OOM")]
    # The families a backend claims must run where it is available (others:
    # UNSUPPORTED, or UNAVAILABLE where a package is missing).
    cls = registry.all_backends()[backend].load()
    must_run = cls.claimed_masks if cls.unavailable_reason() is None else set()
    assert not [r for r in not_ok(rows) if r[1] in must_run]
    assert all(r["max_err"] < TOLERANCE["bfloat16"] / 2 for r in rows if r["status"] == "OK")


def test_forward_and_backward_are_timed_together_in_turn():
    runtime = registry.load_runtime("torch")
    workload = Workload(1, 256, 256, 4, 4, 32, "float32", make_mask("causal", 256))
    backend = registry.load_backend("torch.sdpa_math")
    shape = (1, 4, 256, 32) if backend.layout == "bhsd" else (1, 256, 4, 32)
    inputs = runtime.random_inputs([shape] * 4, "float32", 0)
    forward, both = runtime.measure_pair(backend.build(workload), inputs, warmup=1, iters=4,
                                         flush_l2=False)
    assert len(forward.samples_ms) == len(both.samples_ms) == 4
    assert both.median_ms > 0 and forward.median_ms > 0


def test_compiled_flex_never_falls_back_to_eager_silently(monkeypatch):
    """A ring case compiles flex once per step and grad mode: the limit
    covers that, and hitting it raises (an ERROR row) rather than timing
    the dense eager fallback."""
    import torch

    from torch_backends.kernels.flex import RECOMPILE_LIMIT, compiled_flex_attention

    config = torch._dynamo.config
    monkeypatch.setattr(config, "recompile_limit", 8)  # restored after the test
    monkeypatch.setattr(config, "fail_on_recompile_limit_hit", False)
    compiled_flex_attention()
    assert config.recompile_limit >= RECOMPILE_LIMIT >= 2 * 8
    assert config.fail_on_recompile_limit_hit
