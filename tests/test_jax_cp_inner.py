"""The inner kernel of the JAX CP strategies, chosen per run (`inner`): every
strategy and dispatch with jax.xla inside against the float64 reference,
and what an inner kernel cannot do (a sub-mask, a log-sum-exp, this
machine) turning into UNSUPPORTED or UNAVAILABLE with its reason."""

import jax
import pytest

from lcab import registry, results
from lcab.masks import AttnMask, AttnSlice, small_mask
from lcab.runner import Case, Settings, run_cases
from lcab.workloads import Workload
from tests.test_jax_cp import DISPATCHES, STRATEGIES, check, ring_rows

pytestmark = pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 JAX devices")

RINGS = ("jax.cp_ring", "jax.cp_usp", "jax.cp_double_ring")


def support_of(name, mask_name, seqlen=256, heads=(4, 4), dtype="float32", **options):
    workload = Workload(1, seqlen, seqlen, *heads, 16, dtype, small_mask(mask_name, seqlen))
    return registry.load_backend(name, {"cp_size": "2", **options}).supports(workload)


@pytest.mark.parametrize("dispatch", DISPATCHES)
@pytest.mark.parametrize("name", STRATEGIES)
def test_every_strategy_and_dispatch_with_the_xla_inner_matches_the_reference(name, dispatch):
    # GQA 8:4 throughout; contiguous causal rings include empty steps.
    for cp, mask_name in ((2, "full"), (2, "causal"), (4, "causal_document"),
                          (4, "sliding_window")):
        how = check(name, mask_name, cp, dispatch, heads=(8, 4), inner="jax.xla")
        assert f"dispatch={dispatch}; inner jax.xla: " in how
        if name in RINGS:
            assert "dense boolean mask per rank and step (O(S^2/cp^2)" in how


def test_ulysses_hands_the_xla_inner_the_plain_mask_in_natural_order():
    # Causal is the native flag once the tokens are back in natural order.
    assert check("jax.cp_ulysses", "causal", 2, "zigzag", inner="jax.xla").endswith(
        "inner jax.xla: is_causal; tokens gathered back to natural order")
    assert check("jax.cp_ulysses", "causal", 2, "contiguous", inner="jax.xla").endswith(
        "inner jax.xla: is_causal")


def test_a_bad_inner_name_fails_at_construction_naming_the_choices():
    from jax_backends.cp.ring import RingBackend

    with pytest.raises(ValueError, match=r"inner='jax.flash' is not one of .*jax\.xla"):
        RingBackend(inner="jax.flash")
    with pytest.raises(registry.Unavailable, match="inner='torch.flex' is not one of"):
        registry.load_backend("jax.cp_ulysses", {"inner": "torch.flex"})


def test_options_other_than_the_strategys_own_go_to_the_inner():
    """A strategy carries its own options and its inner's, checked against
    the inner's own declaration; rows name both."""
    ring = registry.load_backend("jax.cp_ring", {"block_k": "64", "cp_size": "2"})
    assert ring.inner_backend.forward_blocks == (128, 64)
    assert ring.inner() == ("jax.pallas_flex", {"block_k": "64"})
    with pytest.raises(ValueError, match="the rest go to inner jax.xla: jax.xla has no option "
                                         "'block_q'; its options: none"):
        type(ring).parse_options({"inner": "jax.xla", "block_q": "64"})
    with pytest.raises(ValueError, match="jax.pallas_flex has no option 'merge'"):
        type(ring).parse_options({"merge": "in_kernel"})


def test_an_inner_takes_its_cp_defaults_unless_the_strategy_sets_them():
    """pallas_flex's dK/dV split ("auto" on one GPU) stays whole inside CP,
    where it was not measured, unless the run asks for it; rows' inner
    options stay what the run set."""
    for name in ("jax.cp_ring", "jax.cp_ulysses", "jax.cp_allgather"):
        strategy = registry.load_backend(name, {"cp_size": "2"})
        assert strategy.inner_backend.lowering.dkv_split == "1"
        assert strategy.inner() == ("jax.pallas_flex", {})
    asked = registry.load_backend("jax.cp_ring", {"cp_size": "2", "dkv_split": "auto"})
    assert asked.inner_backend.lowering.dkv_split == "auto"
    assert registry.load_backend("jax.pallas_flex").lowering.dkv_split == "auto"


def test_an_inner_that_cannot_express_a_sub_mask_is_unsupported_with_its_reason():
    # jax.pallas_triton states full, causal and documents of square masks only.
    ulysses = support_of("jax.cp_ulysses", "sliding_window", inner="jax.pallas_triton")
    assert not ulysses.ok
    assert ulysses.reason.startswith(
        "inner jax.pallas_triton cannot run the sub-mask of every rank (256 x 256): "
        "sliding_window is not expressible exactly"), ulysses.reason
    # All-gather: rank 0's queries against every key is a 128 x 256 sub-mask.
    gathered = support_of("jax.cp_allgather", "causal", inner="jax.pallas_triton")
    assert not gathered.ok and "sub-mask of rank 0 (128 x 256)" in gathered.reason
    # Shapes count too: the sub-workload carries the dtype and the head share.
    half = support_of("jax.cp_ulysses", "causal", dtype="bfloat16", inner="jax.xla")
    assert half.ok
    assert support_of("jax.cp_ulysses", "causal", inner="jax.pallas_triton").ok


def test_ulysses_runs_a_narrow_inner_where_it_expresses_the_mask():
    how = check("jax.cp_ulysses", "causal", 2, "zigzag", seqlen=256, inner="jax.pallas_triton")
    assert how.startswith("ulysses; dispatch=zigzag; inner jax.pallas_triton: causal=True")


@pytest.mark.parametrize("name", RINGS)
def test_a_ring_needs_an_inner_with_a_log_sum_exp(name):
    support = support_of(name, "causal", inner="jax.pallas_triton")
    assert not support.ok
    assert "merges partial results by log-sum-exp" in support.reason
    assert "inner jax.pallas_triton: it offers no (out, log-sum-exp) form" in support.reason


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="jax.cudnn is available on a GPU")
def test_an_inner_unavailable_here_makes_unavailable_rows_that_say_why(tmp_path):
    mask = small_mask("causal", 64)
    case = Case("jax.cp_ulysses", Workload(1, 64, 64, 4, 2, 16, "bfloat16", mask))
    settings = Settings(warmup=0, iters=1, backend_options=(
        ("jax.cp_ulysses", "inner", "jax.cudnn"),))
    path = tmp_path / "rows.jsonl"
    run_cases([case], results.Writer(path), settings)
    for row in results.read_rows([path]):
        assert row["status"] == "UNAVAILABLE"
        assert row["reason"] == "inner jax.cudnn: needs a CUDA GPU (jax sees only cpu)"


def test_rows_of_the_xla_inner_pass_the_gate_and_name_it(tmp_path):
    rows = ring_rows(tmp_path, inner="jax.xla")
    assert [r["status"] for r in rows] == ["OK", "OK"], [r["reason"] for r in rows]
    assert all("; inner jax.xla: dense boolean mask per rank and step" in r["notes"]
               for r in rows)


def test_a_rank_or_step_that_sees_nothing_needs_no_inner_kernel():
    # Rows 32-63 see no key: all-gather's rank 1 runs no kernel (zeros), the
    # ring's dense steps of rank 1 are all-False.
    mask = AttnMask(64, 64, [AttnSlice(0, 32, 0, 32, "causal"), AttnSlice(0, 32, 32, 64)])
    for name in ("jax.cp_allgather", "jax.cp_ring"):
        check(name, mask, 2, "contiguous", inner="jax.xla")


def test_the_dense_ring_kernel_honours_the_dense_mask_limit(monkeypatch):
    from lcab import expressions

    # cp 2 at 64 tokens: 32 x 32 cells a step, two steps a rank.
    monkeypatch.setattr(expressions, "DENSE_MASK_CELLS", 1000)
    step = support_of("jax.cp_ring", "causal", seqlen=64, inner="jax.xla")
    assert not step.ok and step.reason.startswith(
        "inner jax.xla cannot run the sub-mask of rank 0 step 0 (32 x 32): a dense mask of "
        "32 x 32 exceeds 1000 cells"), step.reason
    monkeypatch.setattr(expressions, "DENSE_MASK_CELLS", 1500)
    rank = support_of("jax.cp_ring", "causal", seqlen=64, inner="jax.xla")
    assert not rank.ok and "holds 2 step masks of 32 x 32 per rank, over 1500 cells" in rank.reason
