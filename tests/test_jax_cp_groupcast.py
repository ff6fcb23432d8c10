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


@pytest.mark.parametrize("cp, dispatch", [(2, "zigzag"), (4, "balanced"), (8, "contiguous"),
                                          (8, "groupcast")])
def test_the_tabled_kernel_serves_every_rank_at_cp_2_4_and_8(cp, dispatch):
    for mask_name in ("causal_document", "full_document"):
        how = check("jax.cp_groupcast", mask_name, cp, dispatch, seqlen=128, heads=(4, 2))
        assert "inner jax.pallas_flex" in how and "lax.switch" not in how


def test_the_received_layout_is_the_mask_exactly():
    """Rank r's sub-mask, column by column, is the global mask's rows of r
    against the key each column holds (own keys, then each sender's bucket;
    padding columns see nothing)."""
    from jax_backends.cp.groupcast import cast_of, received_masks

    mask = small_mask("causal_document", 256, seed=3)
    dispatch = make_dispatch("zigzag", mask, 4)
    cast = cast_of(mask, dispatch, 16)
    dense = mask.to_dense()
    for rank, sub in enumerate(received_masks(mask, cast)):
        rows = dispatch.rank_rows(rank)
        keys = [*rows]
        for sender, chunks in enumerate(cast.receives[rank]):
            held = [t for c in chunks for t in range(c * 16, (c + 1) * 16)]
            keys += held + [None] * (cast.bucket() * 16 - len(held))
        want = np.array([[key is not None and dense[row, key] for key in keys]
                         for row in rows])
        np.testing.assert_array_equal(sub.to_dense(), want)


def test_documents_cut_at_rank_boundaries_move_nothing_and_still_match():
    mask = make_mask("causal_document", 128, doc_lens=(32, 32, 64))
    how = check("jax.cp_groupcast", mask, 4, "contiguous", seqlen=128, inner="jax.xla")
    assert how.startswith("groupcast")
    backend = registry.load_backend("jax.cp_groupcast",
                                    {"cp_size": "4", "dispatch": "contiguous"})
    notes = backend.case_notes(Workload(1, 128, 128, 4, 4, 16, "float32", mask))
    # Rank 3's queries (96-127) see the document starting at 64: rank 2's two chunks.
    assert "chunk=32; K/V chunks moved 1 (padded 12) where a ring moves 12" in notes


def test_a_chunk_that_does_not_tile_the_dispatch_is_unsupported_with_the_reason():
    mask = small_mask("causal", 128)
    backend = registry.load_backend("jax.cp_groupcast",
                                    {"cp_size": "2", "dispatch": "zigzag", "chunk": "24"})
    support = backend.supports(Workload(1, 128, 128, 4, 4, 16, "float32", mask))
    assert not support.ok and "chunk=24 must be a positive divisor of 32" in support.reason
