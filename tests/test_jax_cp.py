"""JAX context parallelism on 8 host devices (tests/conftest.py): every
strategy and dispatch against the float64 reference, forward and backward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcab import reference, registry, results
from lcab.masks import MASK_NAMES, small_mask
from lcab.runner import Case, Settings, run_cases
from lcab.workloads import Workload
from tests.row_checks import measured_or_noisy

STRATEGIES = ("jax.cp_allgather", "jax.cp_ring", "jax.cp_ulysses", "jax.cp_usp",
              "jax.cp_double_ring")
DISPATCHES = ("contiguous", "zigzag", "balanced", "ring_balanced")

pytestmark = pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 JAX devices")


def check(name, mask_name, cp, dispatch, seqlen=64, heads=(4, 4), **options):
    """The backend's support.how, after checking out and gradients; mask_name
    may be an AttnMask of seqlen tokens instead."""
    mask = small_mask(mask_name, seqlen) if isinstance(mask_name, str) else mask_name
    workload = Workload(1, seqlen, seqlen, *heads, 16, "float32", mask)
    options = {"cp_size": str(cp), "dispatch": dispatch, **options}
    backend = registry.load_backend(name, options)
    support = backend.supports(workload)
    assert support.ok, support.reason
    rng = np.random.default_rng(cp)
    q = rng.normal(size=(1, seqlen, heads[0], 16)) * 2
    k = rng.normal(size=(1, seqlen, heads[1], 16)) * 2
    v = rng.normal(size=(1, seqlen, heads[1], 16))
    dout = rng.normal(size=(1, seqlen, heads[0], 16))
    out, pullback = jax.vjp(jax.jit(backend.build(workload)),
                            *(jnp.asarray(x, jnp.float32) for x in (q, k, v)))
    grads = pullback(jnp.asarray(dout, jnp.float32))
    want_out, _ = reference.attention(q, k, v, mask)
    for got, want in zip((out, *grads), (want_out, *reference.attention_grads(q, k, v, mask, dout))):
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=0)
    return support.how


@pytest.mark.parametrize("name", STRATEGIES)
def test_dispatch_chunks_deal_finer_chunks_and_still_match(name):
    """dispatch_chunks=N: the mask-aware dispatch deals N chunks a rank
    (default_chunk's size for that count), the notes say so, and the
    strategy still matches the reference; refused on a fixed layout."""
    from lcab.cp import cached_dispatch, default_chunk, make_dispatch

    how = check(name, "causal_document", 2, "balanced", seqlen=128, dispatch_chunks="8")
    assert "dispatch=balanced" in how
    mask = small_mask("causal_document", 128)
    assert cached_dispatch("balanced", mask, 2, 8) == make_dispatch(
        "balanced", mask, 2, chunk=default_chunk(128, 2, 8))
    backend = registry.load_backend(name, {"cp_size": "2", "dispatch": "balanced",
                                           "dispatch_chunks": "8"})
    workload = Workload(1, 128, 128, 4, 4, 16, "float32", mask)
    assert "dispatch_chunks=8; imbalance=" in backend.case_notes(workload)
    with pytest.raises(registry.Unavailable, match="mask-aware dispatches only"):
        registry.load_backend(name, {"cp_size": "2", "dispatch": "zigzag",
                                     "dispatch_chunks": "8"})


@pytest.mark.parametrize("dispatch", DISPATCHES)
@pytest.mark.parametrize("name", STRATEGIES)
def test_every_strategy_and_dispatch_matches_the_reference(name, dispatch):
    for cp, mask_name in ((2, "causal_document"), (4, "sliding_window")):
        how = check(name, mask_name, cp, dispatch)
        assert f"dispatch={dispatch}" in how


@pytest.mark.parametrize("mask_name", MASK_NAMES)
def test_the_ring_runs_every_family_with_the_balanced_dispatch(mask_name):
    # GQA 4:2 and skipped (empty) ring steps included.
    check("jax.cp_ring", mask_name, 4, "balanced", heads=(4, 2))


def test_usp_splits_ranks_into_ulysses_groups_and_a_ring():
    # 8 ranks: 4 groups of 2 (ring of 4), then 2 groups of 4 (ring of 2).
    check("jax.cp_usp", "causal_document", 8, "balanced", seqlen=128, ulysses_size="2")
    check("jax.cp_usp", "share_question", 8, "zigzag", seqlen=128, ulysses_size="4")


def test_the_double_ring_meets_every_shard_once_and_matches_the_reference():
    from jax_backends.cp.ring import double_ring_schedule, ring_schedule

    schedule = double_ring_schedule(8, 4)
    for rank in range(8):
        assert sorted(step[rank] for step in schedule.sources) == list(range(8))
    # Inside a window the first moves stay among ranks 0-3 (the fast links).
    assert {(a // 4, b // 4) for a, b in schedule.moves[0]} == {(0, 0), (1, 1)}
    assert ring_schedule(4).sources[1] == (3, 0, 1, 2)
    check("jax.cp_double_ring", "causal_document", 8, "balanced", seqlen=128, window="4")
    with pytest.raises(ValueError, match="window 3 does not divide 8 ranks"):
        double_ring_schedule(8, 3)


def test_the_double_ring_takes_a_ulysses_factor():
    # cp 8 = Ulysses groups of 2 x a double ring of 4 ranks in windows of 2.
    how = check("jax.cp_double_ring", "causal_document", 8, "balanced", seqlen=128,
                window="2", ulysses_size="2")
    assert how.startswith("double_ring; dispatch=balanced")
    mask = small_mask("causal", 128)
    backend = registry.load_backend(
        "jax.cp_double_ring", {"cp_size": "8", "window": "4", "ulysses_size": "4"})
    support = backend.supports(Workload(1, 128, 128, 4, 4, 16, "float32", mask))
    assert not support.ok
    assert "window 4 does not divide the ring's 2 ranks (cp_size / ulysses_size)" in \
        support.reason


def test_ulysses_repeats_kv_heads_where_cp_exceeds_them():
    """cp 8 over 2 K/V heads (each repeated 4x) and 8 query heads; the
    repeated heads' gradients sum back into the two K/V heads."""
    how = check("jax.cp_ulysses", "causal_document", 8, "zigzag", seqlen=128, heads=(8, 2),
                inner="jax.xla")
    assert "each K/V head repeated 4x (cp 8 > 2 K/V heads)" in how
    # The query heads must still divide.
    workload = Workload(1, 128, 128, 4, 2, 16, "float32", small_mask("causal", 128))
    support = registry.load_backend("jax.cp_ulysses", {"cp_size": "8"}).supports(workload)
    assert not support.ok and "4 query heads do not divide by cp_size 8" in support.reason


def test_eight_ranks():
    check("jax.cp_ring", "causal", 8, "zigzag", seqlen=128)
    check("jax.cp_allgather", "causal_document", 8, "balanced", seqlen=128)


def test_what_cannot_run_says_why():
    mask = small_mask("causal", 100)
    workload = Workload(1, 100, 100, 4, 2, 16, "float32", mask)
    cases = {
        ("jax.cp_ring", "16", "zigzag"): "needs 16 devices",
        ("jax.cp_ulysses", "8", "contiguous"): "4 query heads do not divide by cp_size 8",
        ("jax.cp_allgather", "4", "zigzag"): "100",  # not a multiple of 2 * cp
    }
    for (name, cp, dispatch), reason in cases.items():
        support = registry.load_backend(name, {"cp_size": cp, "dispatch": dispatch}).supports(
            workload)
        assert not support.ok and reason in support.reason, support.reason
    with pytest.raises(registry.Unavailable, match="dispatch='spiral' is not one of"):
        registry.load_backend("jax.cp_ring", {"dispatch": "spiral"})


def ring_rows(tmp_path, **options):
    """The runner's rows of jax.cp_ring at cp 4 on 128 tokens of packed
    causal documents, with more backend options."""
    mask = small_mask("causal_document", 128)
    case = Case("jax.cp_ring", Workload(1, 128, 128, 4, 2, 16, "float32", mask))
    settings = Settings(warmup=1, iters=5, git_commit="t", backend_options=tuple(
        ("jax.cp_ring", key, value) for key, value in {"cp_size": "4", **options}.items()))
    path = tmp_path / "rows.jsonl"
    run_cases([case], results.Writer(path), settings)
    return results.read_rows([path])


def test_rows_carry_cp_size_strategy_and_imbalance(tmp_path):
    rows = ring_rows(tmp_path, dispatch="balanced")
    # Five CPU samples of a 128-token ring under a loaded host may leave the
    # backward "not measurable" (the runner's honest answer); it is still
    # a whole row. Any other failure fails here, with its reason.
    assert rows[0]["status"] == "OK", rows[0]["reason"]
    assert measured_or_noisy(rows[1]), rows[1]["reason"]
    for row in rows:
        assert row["cp_size"] == 4 and row["strategy"] == "ring"
        assert "dispatch=balanced; inner" in row["notes"]
        assert row["inner"] == "jax.pallas_flex" and row["strategy"] == "ring"
        assert row["notes"].endswith("imbalance=1.000") or "imbalance=1.0" in row["notes"]
        assert "probe took" not in row["notes"]  # the probe ran the timed code path
        if row["status"] == "OK":
            assert row["tflops"] == pytest.approx(
                row["flops"] / (row["median_ms"] / 1e3) / 1e12 / 4)  # per GPU


def test_cp_runs_are_checked_against_a_single_device_run(tmp_path):
    mask = small_mask("causal_document", 128)
    workload = Workload(1, 128, 128, 4, 2, 16, "float32", mask)
    golden = str(tmp_path / "golden")

    def run(name, **options):
        settings = Settings(warmup=1, iters=3, git_commit="t", golden_dir=golden,
                            backend_options=tuple((name, k, v) for k, v in options.items()))
        path = tmp_path / f"{name}.jsonl"
        run_cases([Case(name, workload)], results.Writer(path), settings)
        return [r for r in results.read_rows([path]) if r["direction"] == "fwd"][0]

    first = run("jax.pallas_flex")  # one device: saves
    assert first["golden_err"] is None and first["notes"].endswith("saved as golden data")
    for name, cp in (("jax.cp_ring", "4"), ("jax.cp_ulysses", "2")):  # 2 kv heads
        row = run(name, cp_size=cp, dispatch="balanced")
        assert row["status"] == "OK" and row["golden_err"] < 1e-5, row


def test_a_run_that_differs_from_the_golden_data_is_a_mismatch_without_a_time(
        tmp_path, monkeypatch):
    runtime = registry.load_runtime("jax")
    monkeypatch.setattr(type(runtime), "golden_error", lambda *args: 0.5)
    mask = small_mask("causal", 64)
    path = tmp_path / "rows.jsonl"
    run_cases([Case("jax.pallas_flex", Workload(1, 64, 64, 2, 2, 16, "float32", mask))],
              results.Writer(path), Settings(warmup=0, iters=1, golden_dir=str(tmp_path)))
    for row in results.read_rows([path]):
        assert row["status"] == "MISMATCH" and row["golden_err"] == 0.5
        assert row["median_ms"] is None and "differs from the golden data" in row["reason"]


@pytest.mark.parametrize("name", ["jax.cp_ring", "jax.cp_usp"])
def test_timed_calls_take_inputs_already_dispatched_and_split_over_the_mesh(name):
    # The runtime times fn.timed on fn.timed_inputs(...): no permutation and
    # no input transfer between devices inside the timed call.
    mask = small_mask("causal_document", 64)
    workload = Workload(1, 64, 64, 4, 4, 16, "float32", mask)
    backend = registry.load_backend(name, {"cp_size": "4", "dispatch": "balanced"})
    fn = backend.build(workload)
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 64, 4, 16)), jnp.float32) for _ in range(3))
    placed = fn.timed_inputs([q, k, v])
    for x in placed:
        assert x.sharding.spec == fn.sharding.spec and len(x.sharding.device_set) == 4
    order = backend.dispatch(workload).order()
    np.testing.assert_allclose(np.asarray(jax.jit(fn.timed)(*placed)),
                               np.asarray(fn(q, k, v))[:, order], atol=1e-5)


def test_the_check_runs_the_timed_program_itself_compiled_once():
    """The runtime's untimed calls (the full-size check, the finite test)
    run fn.timed on dispatched inputs and put the results back in token
    order: they agree with the natural-order call, and the timing reuses
    the executable (the strategy's local program traced once per direction)."""
    mask = small_mask("causal_document", 64)
    workload = Workload(1, 64, 64, 4, 4, 16, "float32", mask)
    backend = registry.load_backend("jax.cp_ring", {"cp_size": "4", "dispatch": "balanced"})
    fn = backend.build(workload)
    traces = []
    local = fn.local
    fn.local = lambda q, k, v: (traces.append(q.shape), local(q, k, v))[1]
    runtime = registry.load_runtime("jax")
    rng = np.random.default_rng(0)
    q, k, v, dout = (jnp.asarray(rng.normal(size=(1, 64, 4, 16)), jnp.float32)
                     for _ in range(4))
    out, dq, dk, dv = runtime.forward_backward(fn, q, k, v, dout)
    want, pullback = jax.vjp(fn, q, k, v)
    for got, expected in zip((out, dq, dk, dv), (want, *pullback(dout))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5)
    np.testing.assert_allclose(np.asarray(runtime.forward(fn, q, k, v)), np.asarray(want),
                               atol=1e-5)
    traced = len(traces)
    runtime.measure_pair(fn, [q, k, v, dout], warmup=0, iters=1, flush_l2=False)
    assert len(traces) == traced  # timing found both executables compiled
    runtime.cleanup()


def test_usp_rows_name_their_ulysses_group():
    from lcab.model.validation import ulysses_size_of

    workload = Workload(1, 128, 128, 4, 2, 16, "float32", small_mask("causal", 128))
    backend = registry.load_backend("jax.cp_usp", {"cp_size": "4", "ulysses_size": "2"})
    notes = backend.case_notes(workload)
    assert ulysses_size_of(notes) == 2
    assert ulysses_size_of("usp; dispatch=balanced; imbalance=1.000") is None
