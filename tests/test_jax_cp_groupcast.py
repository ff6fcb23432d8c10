"""jax.cp_groupcast on host devices: every family against the float64
reference, forward and backward; the received layout's sub-masks against a
dense count; what it cannot run, and what it moves."""

import jax
import numpy as np
import pytest

from lcab import registry
from lcab.cp import make_dispatch
from lcab.masks import MASK_NAMES, make_mask, small_mask
from lcab.workloads import Workload
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
    (8, "contiguous", "all_to_all"), (8, "groupcast", "shifts")])
def test_the_tabled_kernel_serves_every_rank_at_cp_2_4_and_8(cp, dispatch, transfer):
    for mask_name in ("causal_document", "full_document"):
        how = check("jax.cp_groupcast", mask_name, cp, dispatch, seqlen=128, heads=(4, 2),
                    transfer=transfer)
        assert "inner jax.pallas_flex" in how and "lax.switch" not in how


@pytest.mark.parametrize("transfer", ["all_to_all", "shifts"])
def test_the_received_layout_is_the_mask_exactly(transfer):
    """Rank r's sub-mask, column by column, is the global mask's rows of r
    against the key each column holds (own keys, then each sender's slot
    where the transfer puts it; padding columns see nothing)."""
    from jax_backends.cp.groupcast import cast_of, received_masks, slot_starts

    mask = small_mask("causal_document", 256, seed=3)
    dispatch = make_dispatch("zigzag", mask, 4)
    cast = cast_of(mask, dispatch, 16)
    width, starts = slot_starts(cast, transfer)
    dense = mask.to_dense()
    for rank, sub in enumerate(received_masks(mask, cast, transfer)):
        rows = dispatch.rank_rows(rank)
        keys = [*rows] + [None] * (width - len(rows))
        for sender, chunks in enumerate(cast.receives[rank]):
            for index, token in enumerate(t for c in chunks for t in range(c * 16, c * 16 + 16)):
                keys[starts[rank][sender] + index] = token
        want = np.array([[key is not None and dense[row, key] for key in keys]
                         for row in rows])
        np.testing.assert_array_equal(sub.to_dense(), want)


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


def test_documents_cut_at_rank_boundaries_move_nothing_and_still_match():
    mask = make_mask("causal_document", 128, doc_lens=(32, 32, 64))
    how = check("jax.cp_groupcast", mask, 4, "contiguous", seqlen=128, inner="jax.xla")
    assert how.startswith("groupcast")
    backend = registry.load_backend("jax.cp_groupcast",
                                    {"cp_size": "4", "dispatch": "contiguous"})
    notes = backend.case_notes(Workload(1, 128, 128, 4, 4, 16, "float32", mask))
    # Rank 3's queries (96-127) see the document starting at 64: rank 2's two chunks.
    assert ("chunk=32; transfer=all_to_all; K/V chunks seen 1, moved 12 with padding, where a "
            "ring moves 12") in notes


def test_a_chunk_that_does_not_tile_the_dispatch_is_unsupported_with_the_reason():
    mask = small_mask("causal", 128)
    backend = registry.load_backend("jax.cp_groupcast",
                                    {"cp_size": "2", "dispatch": "zigzag", "chunk": "24"})
    support = backend.supports(Workload(1, 128, 128, 4, 4, 16, "float32", mask))
    assert not support.ok and "chunk=24 must be a positive divisor of 32" in support.reason
