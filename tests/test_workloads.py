"""Workloads and the FLOP convention (design.md section 3)."""

import pytest

from lcab import flops
from lcab.masks import make_mask
from lcab.workloads import Workload


def seed_workload(mask_name="causal", seqlen=32768, **overrides):
    fields = dict(batch=1, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=64, heads_kv=8,
                  head_dim=128, dtype="bf16", mask=make_mask(mask_name, seqlen))
    fields.update(overrides)
    return Workload(**fields)


def test_flops_use_the_exact_area():
    w = seed_workload("causal", 32768)
    area = 32768 * 32769 // 2
    assert w.mask.area() == area
    assert w.flops("fwd") == 4 * 64 * 128 * area
    assert w.flops("bwd") == 10 * 64 * 128 * area  # 2.5x forward, exactly
    assert w.flops("fwd_bwd") == w.flops("fwd") + w.flops("bwd")
    doc = seed_workload("causal_document", 8192)
    assert doc.flops("fwd") == 4 * 64 * 128 * sum(n * (n + 1) // 2 for n in doc.mask.doc_lens())


def test_full_mask_flops_match_the_published_convention():
    # FlashAttention's benchmark: 4 * seqlen^2 * head_dim * heads for a full forward.
    w = seed_workload("full", 8192, batch=2)
    assert w.flops() == 4 * 2 * 8192**2 * 128 * 64
    assert flops.tflops_per_second(w.flops(), 1e-3) == pytest.approx(w.flops() * 1e-9)


def test_tflops_per_gpu_divides_by_devices():
    assert flops.tflops_per_second(8e12, 2.0, devices=4) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        flops.tflops_per_second(1, 0.0)


def test_dtype_aliases_and_key():
    w = seed_workload("causal", 1024)
    assert w.dtype == "bfloat16" and w.gqa_ratio == 8
    key = w.key()
    assert key.startswith("causal@") and "/h64:8/d128/bfloat16" in key
    assert key == seed_workload("causal", 1024, dtype="bfloat16").key()
    assert key != seed_workload("causal", 1024, dtype="fp16").key()
    docs_a = seed_workload("causal_document", 4096, mask=make_mask("causal_document", 4096, seed=1))
    docs_b = seed_workload("causal_document", 4096, mask=make_mask("causal_document", 4096, seed=2))
    assert docs_a.key() != docs_b.key()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"heads_q": 12, "heads_kv": 8}, "heads_q=12 is not a multiple of heads_kv=8"),
        ({"head_dim": 0}, "head_dim=0"),
        ({"batch": -1}, "batch=-1"),
        ({"dtype": "int8"}, "dtype='int8' is not one of"),
        ({"seqlen_q": 2048}, "mask is 1024 x 1024"),
        ({"mask": "causal"}, "mask must be an AttnMask"),
    ],
)
def test_invalid_workloads_raise(overrides, message):
    with pytest.raises(ValueError, match=message):
        seed_workload("causal", 1024, **overrides)


def test_unknown_direction():
    with pytest.raises(ValueError, match="direction='backward'"):
        seed_workload().flops("backward")
