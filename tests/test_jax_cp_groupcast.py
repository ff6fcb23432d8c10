"""jax.cp_groupcast on host devices: every family against the float64
reference, forward and backward; the received layout's sub-masks against a
dense count; what it cannot run, and what it moves."""

import jax
import numpy as np
import pytest

from jax_backends.cp.groupcast import PADDING
from lcab import registry
from lcab.cp import make_dispatch
from lcab.masks import MASK_NAMES, make_mask, small_mask
from lcab.workloads import Workload
from tests.row_checks import measured_or_noisy
from tests.test_jax_cp import check

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 JAX devices")


@pytest.mark.parametrize("mask_name", MASK_NAMES)
def test_every_family_matches_the_reference_with_its_own_dispatch(mask_name):
    # GQA 4:2; the dense inner (one branch per rank) keeps this quick.
    how = check("jax.cp_groupcast", mask_name, 4, "groupcast", seqlen=128, heads=(4, 2),
                inner="jax.xla")
    assert how.startswith("groupcast; dispatch=groupcast; inner jax.xla")


@pytest.mark.parametrize("cp, dispatch, transfer", [
    (2, "zigzag", "all_to_all"), (4, "balanced", "all_to_all"), (4, "balanced", "shifts"),
    (8, "contiguous", "all_to_all"), (8, "groupcast", "shifts"),
    (4, "groupcast_tiles", "all_to_all")])
def test_the_tabled_kernel_serves_every_rank_at_cp_2_4_and_8(cp, dispatch, transfer):
    for mask_name in ("causal_document", "full_document"):
        how = check("jax.cp_groupcast", mask_name, cp, dispatch, seqlen=128, heads=(4, 2),
                    transfer=transfer)
        assert "inner jax.pallas_flex" in how and "lax.switch" not in how


@pytest.mark.parametrize("transfer", ["all_to_all", "shifts"])
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_each_calls_layout_is_the_mask_exactly(transfer, stages):
    """Rank r's sub-mask of each kernel call, column by column, is the
    global mask's rows of r against the key that column holds (call 0: own
    keys, then with one stage every hop's piece; later calls: their hops'
    pieces where the transfer puts them; padding columns see nothing), and
    every visible pair lies in exactly one call."""
    from jax_backends.cp.groupcast import call_masks, cast_of, transfer_layout

    mask = small_mask("causal_document", 256, seed=3)
    dispatch = make_dispatch("zigzag", mask, 4)
    cast = cast_of(mask, dispatch, 16)
    plan = transfer_layout(cast, transfer, stages)
    own = dispatch.tokens_per_rank
    widths, offsets = plan.widths(own, 16), plan.hop_offsets(own, 16)
    calls = call_masks(mask, cast, transfer, stages)
    assert len(calls) == plan.stages == len(widths)
    dense = mask.to_dense()
    for rank in range(4):
        rows = dispatch.rank_rows(rank)
        seen = 0
        for call, width in enumerate(widths):
            keys = [None] * width
            if call == 0:
                keys[:own] = list(rows)
            for h, hop in enumerate(plan.hops):
                if plan.stages == 1 or hop.stage == call:
                    for global_chunk, place in plan.landing[rank][h]:
                        for i in range(16):
                            keys[offsets[h] + place * 16 + i] = global_chunk * 16 + i
            want = np.array([[key is not None and dense[row, key] for key in keys]
                             for row in rows])
            np.testing.assert_array_equal(calls[call][rank].to_dense(), want)
            seen += want.sum()
        assert seen == dense[rows].sum()


@pytest.mark.parametrize("transfer", ["all_to_all", "shifts"])
def test_the_send_table_feeds_each_hop_what_its_receivers_land(transfer):
    """Simulating the collectives on the send table delivers, to every
    rank and hop, exactly the chunks the layout says land there."""
    from jax_backends.cp.groupcast import cast_of, transfer_layout

    mask = small_mask("full_document", 256, seed=5)
    dispatch = make_dispatch("balanced", mask, 4)
    cast = cast_of(mask, dispatch, 16)
    plan = transfer_layout(cast, transfer, 3)
    owned = [dispatch.rank_rows(r)[::16] // 16 for r in range(4)]  # local index -> global chunk
    at = 0
    for h, hop in enumerate(plan.hops):
        sent = plan.sends[:, at:at + hop.size]
        at += hop.size
        for receiver in range(4):
            if hop.pairs is None:
                width = hop.size // 4
                got = np.concatenate([owned[s][sent[s, receiver * width:(receiver + 1) * width]]
                                      for s in range(4)])
            else:
                (sender,) = [s for s, t in hop.pairs if t == receiver]
                got = owned[sender][sent[sender]]
            for global_chunk, place in plan.landing[receiver][h]:
                assert got[place] == global_chunk


@pytest.mark.parametrize("mask_name", ["causal_document", "full_document", "sliding_window"])
def test_shifts_deliver_the_same_keys_with_less_padding(mask_name):
    how = check("jax.cp_groupcast", mask_name, 8, "groupcast", seqlen=256, heads=(4, 2),
                inner="jax.xla", transfer="shifts")
    assert how.startswith("groupcast; dispatch=groupcast")
    backend = registry.load_backend("jax.cp_groupcast", {"cp_size": "8",
                                                        "dispatch": "groupcast"})
    mask = small_mask(mask_name, 256)
    cast = backend.cast(Workload(1, 256, 256, 4, 2, 16, "float32", mask),
                        make_dispatch("groupcast", mask, 8))
    shifted = registry.load_backend("jax.cp_groupcast", {"cp_size": "8", "transfer": "shifts"})
    assert cast.moved_chunks() <= shifted.sent_chunks(cast) <= backend.sent_chunks(cast)


@pytest.mark.slow
@pytest.mark.parametrize("mask_name", MASK_NAMES)
def test_stages_match_the_reference_for_every_family(mask_name):
    """The own keys first, the received ones in two more calls, merged by
    log-sum-exp; the backward through the custom_vjp (the dense ring kernel)."""
    how = check("jax.cp_groupcast", mask_name, 4, "groupcast", seqlen=128, heads=(4, 2),
                inner="jax.xla", stages="3")
    assert how.startswith("groupcast; dispatch=groupcast; inner jax.xla")


@pytest.mark.slow
@pytest.mark.parametrize("cp, transfer, stages", [
    (2, "all_to_all", 2), (4, "all_to_all", 3), (4, "shifts", 2), (8, "shifts", 8)])
def test_stages_with_the_tabled_kernel(cp, transfer, stages):
    for mask_name in ("causal_document", "full_document"):
        how = check("jax.cp_groupcast", mask_name, cp, "balanced", seqlen=128, heads=(4, 2),
                    transfer=transfer, stages=str(stages))
        assert "inner jax.pallas_flex" in how


def test_stages_need_a_kernel_with_a_log_sum_exp():
    backend = registry.load_backend("jax.cp_groupcast", {
        "cp_size": "2", "dispatch": "zigzag", "stages": "2", "inner": "jax.pallas_triton"})
    mask = small_mask("causal", 128)
    support = backend.supports(Workload(1, 128, 128, 4, 4, 16, "float32", mask))
    assert not support.ok and "stages=2 merge the calls' partial results by log-sum-exp" \
        in support.reason
    with pytest.raises(registry.Unavailable, match="stages=0 must be 1"):
        registry.load_backend("jax.cp_groupcast", {"stages": "0"})


def test_the_notes_give_the_calls_made():
    mask = make_mask("causal_document", 128, doc_lens=(32, 32, 64))
    notes = {stages: registry.load_backend("jax.cp_groupcast", {
        "cp_size": "4", "dispatch": "contiguous", "stages": str(stages)}).case_notes(
            Workload(1, 128, 128, 4, 4, 16, "float32", mask)) for stages in (1, 2, 5)}
    assert "stages=1;" in notes[1] and "stages=2;" in notes[2]
    assert "stages=2;" in notes[5]  # one chunk moves: one call for it


@pytest.mark.slow
def test_the_gate_passes_stages_on_unaligned_documents(tmp_path):
    """Through the runner, as a sweep runs it: the correctness probe and the
    timing, on documents whose edges fall inside chunks (the 256-token probe
    of a 2048-token magi_pack mask once read the backend's array layout
    wrongly and saw an infinite error)."""
    from lcab import results
    from lcab.runner import Case, Settings, run_cases

    mask = make_mask("causal_document", 256, doc_lens=(33, 19, 9, 64, 64, 64, 3))
    case = Case("jax.cp_groupcast", Workload(1, 256, 256, 4, 2, 16, "bfloat16", mask))
    settings = Settings(warmup=1, iters=2, git_commit="t", backend_options=tuple(
        ("jax.cp_groupcast", key, value) for key, value in
        {"cp_size": "4", "dispatch": "balanced", "stages": "3"}.items()))
    path = tmp_path / "rows.jsonl"
    run_cases([case], results.Writer(path), settings)
    rows = results.read_rows([path])
    # The probe is the point; a CPU backward timed under load may be
    # "not measurable", an honest row whose check still passed.
    assert [r["direction"] for r in rows] == ["fwd", "bwd"]
    assert all(measured_or_noisy(r) for r in rows), [r["reason"] for r in rows]
    assert all("stages=3;" in r["notes"] for r in rows)
    assert registry.load_backend("jax.cp_groupcast", {"stages": "2"}).layout == "bshd"


def test_documents_cut_at_rank_boundaries_move_nothing_and_still_match():
    mask = make_mask("causal_document", 128, doc_lens=(32, 32, 64))
    how = check("jax.cp_groupcast", mask, 4, "contiguous", seqlen=128, inner="jax.xla")
    assert how.startswith("groupcast")
    backend = registry.load_backend("jax.cp_groupcast",
                                    {"cp_size": "4", "dispatch": "contiguous"})
    notes = backend.case_notes(Workload(1, 128, 128, 4, 4, 16, "float32", mask))
    # Rank 3's queries (96-127) see the document starting at 64: rank 2's two chunks.
    assert ("chunk=32; transfer=all_to_all; stages=1; K/V chunks seen 1, moved 12 with "
            "padding, where a ring moves 12") in notes


def test_a_chunk_that_does_not_tile_the_dispatch_is_unsupported_with_the_reason():
    mask = small_mask("causal", 128)
    backend = registry.load_backend("jax.cp_groupcast",
                                    {"cp_size": "2", "dispatch": "zigzag", "chunk": "24"})
    support = backend.supports(Workload(1, 128, 128, 4, 4, 16, "float32", mask))
    assert not support.ok and "chunk=24 must be a positive divisor of 32" in support.reason


@pytest.mark.slow
@pytest.mark.parametrize("transfer", ["all_to_all", "shifts"])
def test_padded_buckets_match_the_reference(transfer):
    """Where many slots are padding (cp 4, documents): out and gradients
    match the reference, with the tabled kernel and with one branch per
    rank."""
    for mask_name in ("causal_document", "full_document"):
        how = check("jax.cp_groupcast", mask_name, 4, "balanced", seqlen=128, heads=(4, 2),
                    transfer=transfer)
        assert "inner jax.pallas_flex" in how
        check("jax.cp_groupcast", mask_name, 4, "balanced", seqlen=128, heads=(4, 2),
              transfer=transfer, inner="jax.xla")


@pytest.mark.parametrize("transfer", ["all_to_all", "shifts"])
def test_padding_indexes_one_past_the_ranks_chunks(transfer):
    """The buckets' empty slots index one past the rank's chunks (the
    gather fills zeros, the backward drops them, so no padded slot's
    gradient lands on a real chunk); every other slot is the layout's."""
    mask = small_mask("causal_document", 128)
    workload = Workload(1, 128, 128, 4, 2, 16, "float32", mask)
    dispatch = make_dispatch("balanced", mask, 4)
    backend = registry.load_backend("jax.cp_groupcast", {
        "cp_size": "4", "dispatch": "balanced", "transfer": transfer})
    sends = backend.transfer_layout(workload, dispatch).sends
    table = backend.send_table(workload, dispatch)
    chunks = dispatch.tokens_per_rank // backend.cast(workload, dispatch).chunk
    padded = sends == PADDING
    assert padded.any(), "this case must have padding to test it"
    assert (table[padded] == chunks).all()
    np.testing.assert_array_equal(table[~padded], sends[~padded])
    assert (table[~padded] < chunks).all()


def test_the_gathers_transpose_sums_each_chunks_slots_as_a_scatter_would():
    """gather_chunks' backward (return_table's gathers, added in float32)
    against JAX's own transpose of the same gather (a scatter-add), on a
    send table where chunks go to one, two and three slots and slots pad."""
    from jax_backends.cp.groupcast import gather_chunks, return_table

    chunks = 5
    sends = np.array([[0, 3, 0, 5, 2, 0, 3, 5]], np.int32)  # 5: past the end (padding)
    returns = return_table(sends, chunks)
    assert returns.shape == (1, chunks, 3)
    np.testing.assert_array_equal(returns[0, 0], [0, 2, 5])
    np.testing.assert_array_equal(returns[0, 1], [8, 8, 8])  # never sent: zeros
    np.testing.assert_array_equal(returns[0, 3], [1, 6, 8])
    x = jax.random.normal(jax.random.key(0), (2, chunks, 4, 3, 8), jax.numpy.float32)
    weights = jax.random.normal(jax.random.key(1), (2, 8, 4, 3, 8), jax.numpy.float32)

    def loss(gather):
        return lambda x: (gather(x) * weights).sum()

    ours = jax.grad(loss(lambda x: gather_chunks(x, sends[0], returns[0])))(x)
    theirs = jax.grad(loss(lambda x: jax.numpy.take(x, sends[0], axis=1, mode="fill",
                                                    fill_value=0)))(x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(gather_chunks(x, sends[0], returns[0]),
                                  jax.numpy.take(x, sends[0], axis=1, mode="fill",
                                                 fill_value=0))


@pytest.mark.parametrize("stages", [1, 2])
def test_the_gathered_transpose_matches_the_reference(stages):
    """transpose=gather on the tabled kernel, forward and backward, where
    chunks go to several ranks (cp 4, documents) and with the staged calls."""
    for mask_name in ("causal_document", "full_document", "causal"):
        how = check("jax.cp_groupcast", mask_name, 4, "balanced", seqlen=128, heads=(4, 2),
                    transpose="gather", stages=stages)
        assert "inner jax.pallas_flex" in how
    # And with a dense inner kernel (one branch per rank).
    check("jax.cp_groupcast", "causal_document", 4, "balanced", seqlen=128, heads=(4, 2),
          transpose="gather", inner="jax.xla")


def test_an_unknown_transpose_is_refused_with_the_choices():
    with pytest.raises(registry.Unavailable, match="scatter, gather"):
        registry.load_backend("jax.cp_groupcast", {"transpose": "atomic"})
