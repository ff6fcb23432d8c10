"""Context-parallel layer: exact sub-masks and token dispatch, against dense counts."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcab.cp import (
    DISPATCH_NAMES,
    Dispatch,
    balanced,
    contiguous,
    default_chunk,
    imbalance,
    make_dispatch,
    pair_areas,
    rank_areas,
    ring_balanced,
    ring_lockstep_area,
    sub_mask,
    zigzag,
)
from lcab.masks import KINDS, MASK_NAMES, AttnMask, AttnSlice, make_mask, small_mask


def _rows(ranges):
    parts = [np.arange(a, b) for a, b in ranges]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=int)


@st.composite
def range_lists(draw, size):
    """Disjoint half-open ranges inside [0, size), in a random order (some may be empty)."""
    cuts = sorted(draw(st.lists(st.integers(0, size), min_size=2, max_size=8)))
    pairs = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
    pairs = draw(st.permutations(pairs))
    if sum(b - a for a, b in pairs) == 0:  # a sub-mask needs a token
        return [(0, size)]
    return list(pairs)


@st.composite
def rectangular_masks(draw):
    """Slices of every kind in disjoint boxes of a random (rows x cols) grid."""
    seqlen_q, seqlen_k = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    row_cuts = sorted({0, seqlen_q, *draw(st.lists(st.integers(0, seqlen_q), max_size=3))})
    col_cuts = sorted({0, seqlen_k, *draw(st.lists(st.integers(0, seqlen_k), max_size=3))})
    slices = []
    for q0, q1 in zip(row_cuts, row_cuts[1:]):
        for k0, k1 in zip(col_cuts, col_cuts[1:]):
            kind = draw(st.sampled_from((None, *KINDS)))
            if kind is not None:
                slices.append(AttnSlice(q0, q1, k0, k1, kind))
    return AttnMask(seqlen_q, seqlen_k, slices)


def _check_sub_mask(mask, row_ranges, col_ranges):
    sub = sub_mask(mask, row_ranges, col_ranges)
    expected = mask.to_dense()[np.ix_(_rows(row_ranges), _rows(col_ranges))]
    assert (sub.seqlen_q, sub.seqlen_k) == expected.shape
    np.testing.assert_array_equal(sub.to_dense(), expected)
    # Equal area proves the pieces never overlap; the checked constructor agrees.
    assert sub.area() == expected.sum()
    AttnMask(sub.seqlen_q, sub.seqlen_k, sub.slice_table)


# ----- sub_mask ------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(MASK_NAMES),
    seqlen=st.integers(32, 96),
    seed=st.integers(0, 3),
    data=st.data(),
)
def test_sub_mask_matches_dense_for_every_family(name, seqlen, seed, data):
    mask = small_mask(name, seqlen, seed=seed)
    _check_sub_mask(mask, data.draw(range_lists(seqlen)), data.draw(range_lists(seqlen)))


@settings(max_examples=150, deadline=None)
@given(mask=rectangular_masks(), data=st.data())
def test_sub_mask_matches_dense_on_rectangular_masks(mask, data):
    _check_sub_mask(
        mask, data.draw(range_lists(mask.seqlen_q)), data.draw(range_lists(mask.seqlen_k))
    )


@pytest.mark.parametrize("name", MASK_NAMES)
def test_sub_mask_of_everything_is_the_mask(name):
    mask = small_mask(name, 64)
    sub = sub_mask(mask, [(0, 64)], [(0, 64)])
    np.testing.assert_array_equal(sub.to_dense(), mask.to_dense())


def test_sub_mask_never_builds_the_full_grid():
    mask = make_mask("causal_document", 1 << 20, seed=0)  # dense would be 2**40 cells
    dispatch = zigzag(mask.seqlen_q, 8)
    total = sum(
        sub_mask(mask, dispatch.ranges[i], dispatch.ranges[j]).area()
        for i in range(8)
        for j in range(8)
    )
    assert total == mask.area()


def test_sub_mask_rejects_bad_ranges():
    mask = small_mask("causal", 32)
    with pytest.raises(ValueError, match="overlap"):
        sub_mask(mask, [(0, 10), (5, 12)], [(0, 32)])
    with pytest.raises(ValueError, match="outside"):
        sub_mask(mask, [(0, 33)], [(0, 32)])
    with pytest.raises(ValueError, match="at least one row"):
        sub_mask(mask, [(4, 4)], [(0, 32)])


# ----- dispatches ------------------------------------------------------------
def test_dispatch_layouts():
    assert contiguous(12, 3).ranges == (((0, 4),), ((4, 8),), ((8, 12),))
    # Rank 1 of 2 holds chunks 1 and 2, adjacent, so one range.
    assert zigzag(16, 2).ranges == (((0, 4), (12, 16)), ((4, 12),))
    dispatch = zigzag(16, 2)
    assert dispatch.tokens_per_rank == 8
    np.testing.assert_array_equal(dispatch.rank_rows(0), [0, 1, 2, 3, 12, 13, 14, 15])
    np.testing.assert_array_equal(np.sort(dispatch.order()), np.arange(16))


def test_default_chunk():
    assert default_chunk(1024, 2) == 128  # 4 chunks a rank
    assert default_chunk(96, 2) == 8  # largest power of two dividing 48 with >= 4 chunks
    assert default_chunk(64, 32) == 1  # fewer than 4 tokens a rank: single tokens
    assert default_chunk(36, 3) == 2  # 12 tokens a rank: 4 is too big to give 4 chunks


@pytest.mark.parametrize("name", MASK_NAMES)
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_every_dispatch_covers_the_mask_once(name, cp):
    mask = small_mask(name, 192, seed=1)
    for dispatch_name in DISPATCH_NAMES:
        dispatch = make_dispatch(dispatch_name, mask, cp)
        assert dispatch.name == dispatch_name
        assert sorted(dispatch.order().tolist()) == list(range(192))
        for rank in range(cp):
            assert len(dispatch.rank_rows(rank)) == dispatch.tokens_per_rank == 192 // cp
        areas = rank_areas(mask, dispatch)
        assert areas.sum() == mask.area()
        assert imbalance(mask, dispatch) >= 1.0


def test_contiguous_full_and_zigzag_causal_are_exactly_balanced():
    full = make_mask("full", 4096)
    causal = make_mask("causal", 4096)
    for cp in (1, 2, 4, 8, 16):
        assert imbalance(full, contiguous(4096, cp)) == 1.0
        assert imbalance(causal, zigzag(4096, cp)) == 1.0
    assert imbalance(causal, contiguous(4096, 4)) > 1.5


@pytest.mark.parametrize("name", MASK_NAMES)
def test_balanced_is_never_worse_than_contiguous(name):
    for seqlen, make in ((256, small_mask), (1 << 16, make_mask)):
        for seed in (0, 1):
            mask = make(name, seqlen, seed=seed)
            for cp in (2, 4, 8):
                chosen = balanced(mask, cp)
                assert imbalance(mask, chosen) <= imbalance(mask, contiguous(seqlen, cp))
                chunk = default_chunk(seqlen, cp)
                chunks = [sum(b - a for a, b in rank) // chunk for rank in chosen.ranges]
                assert chunks == [seqlen // (cp * chunk)] * cp
                assert balanced(mask, cp) == chosen  # deterministic


def test_balanced_evens_out_documents():
    mask = make_mask("causal_document", 1 << 17, seed=0)
    assert imbalance(mask, balanced(mask, 8)) < 1.1 < imbalance(mask, zigzag(1 << 17, 8))


def _dense_ring_lockstep_area(mask, dispatch):
    """The ring's lockstep time counted from the dense mask: at step s,
    rank r's rows against rank (r - s)'s columns; a step lasts its largest."""
    dense, cp = mask.to_dense(), dispatch.cp
    rows = [dispatch.rank_rows(r) for r in range(cp)]
    return sum(max(dense[np.ix_(rows[r], rows[(r - s) % cp])].sum() for r in range(cp))
               for s in range(cp))


@pytest.mark.parametrize("name", ["causal_document", "full_document", "sliding_window_causal"])
def test_a_ranks_tiles_are_its_chunks_tiles_and_tile_balanced_evens_them(name):
    """chunk_tiles is exact: the tiles of a rank's all-gather and group-cast
    sub-masks are its chunks' tiles in the global mask (chunks are whole
    tiles); tile_balanced's most-loaded rank holds no more tiles than the
    fixed layouts' or balanced's at its chunking."""
    from jax_backends.cp.allgather import gathered_masks
    from jax_backends.cp.groupcast import call_masks, cast_of
    from lcab.cp.dispatch import EMPTY, chunk_tiles, fixed_owners, rank_loads

    mask = small_mask(name, 2048, seed=1)
    split = make_dispatch("tile_balanced", mask, 4)
    chunk = 2048 // (16 * 4)  # tile_balanced's 16 chunks a rank
    tiles = chunk_tiles(mask, chunk)
    def chunk_owners(dispatch):
        """The rank of every chunk."""
        owner = np.empty(len(tiles), np.int64)
        for r in range(4):
            owner[dispatch.rank_rows(r)[::chunk] // chunk] = r
        return owner

    mine = rank_loads(chunk_owners(split), tiles, 4)
    for subs in (gathered_masks(mask, split),
                 call_masks(mask, cast_of(mask, split, None), "all_to_all")[0]):
        found = [int((np.asarray(s.block_schedule(32, 32).state) != EMPTY).sum()) for s in subs]
        assert found == list(mine)
    others = [rank_loads(o, tiles, 4).max() for o in fixed_owners(len(tiles), 4)]
    balanced = make_dispatch("balanced", mask, 4, chunk=chunk)
    others.append(rank_loads(chunk_owners(balanced), tiles, 4).max())
    assert mine.max() <= min(others)


def test_chunks_per_rank_set_the_mask_aware_dispatches_chunk():
    """cached_dispatch(..., chunks_per_rank): default_chunk's size for that
    count, for the mask-aware dispatches only; at 32k tokens per GPU, cp 4,
    eight 4096-token chunks a rank even the tiles of packed documents
    (the sweeps' masks) where balanced's default four leave 3-5 % over."""
    from lcab.cp import cached_dispatch, tile_imbalance
    from lcab.cp.dispatch import MASK_AWARE
    from lcab.masks.factory import taken_params

    mask = small_mask("causal_document", 1024, seed=2)
    for name in MASK_AWARE:
        assert cached_dispatch(name, mask, 4, 4) == make_dispatch(
            name, mask, 4, chunk=default_chunk(1024, 4, 4))
    with pytest.raises(ValueError, match="mask-aware"):
        cached_dispatch("zigzag", mask, 4, 4)
    with pytest.raises(ValueError, match="at least 1"):
        cached_dispatch("balanced", mask, 4, 0)
    for name, default, finer in (("causal_document", 1.033, 1.003),
                                 ("full_document", 1.045, 1.010)):
        params = taken_params(name, distribution="chatqa2_long_sft", sampler="magi_pack",
                              doc_cap=None)
        big = make_mask(name, 4 * 32768, seed=0, **params)
        assert tile_imbalance(big, cached_dispatch("balanced", big, 4)) == pytest.approx(
            default, abs=5e-4)
        assert tile_imbalance(big, cached_dispatch("balanced", big, 4, 8)) == pytest.approx(
            finer, abs=5e-4)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(MASK_NAMES), cp=st.sampled_from([2, 3, 4]),
       dispatch_name=st.sampled_from(["contiguous", "zigzag", "balanced", "groupcast"]),
       seed=st.integers(0, 5))
def test_rank_tiles_count_the_touched_tiles_of_each_ranks_rows(name, cp, dispatch_name, seed):
    """rank_tiles against the dense mask: per rank, the (tile x tile)
    blocks of its query rows against every key block with a visible pair,
    tile the largest power of two up to 128 dividing every range edge;
    tile_imbalance is their max over mean, 1.0 where nothing is visible."""
    import math

    from lcab.cp import rank_tiles, tile_imbalance

    mask = small_mask(name, 192, seed=seed)
    dispatch = make_dispatch(dispatch_name, mask, cp)
    starts, stops = dispatch.flat_ranges()
    tile = math.gcd(128, *map(int, starts), *map(int, stops))
    dense = mask.to_dense()
    blocks = dense.reshape(192 // tile, tile, dense.shape[1] // tile, tile).any(axis=(1, 3))
    want = [int(blocks[np.unique(dispatch.rank_rows(r) // tile)].sum()) for r in range(cp)]
    assert rank_tiles(mask, dispatch).tolist() == want
    expected = max(want) * cp / sum(want) if sum(want) else 1.0
    assert tile_imbalance(mask, dispatch) == pytest.approx(expected)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(MASK_NAMES), cp=st.sampled_from([2, 3, 4]), seed=st.integers(0, 5))
def test_ring_balanced_never_lengthens_the_ring_and_its_search_counts_exactly(name, cp, seed):
    mask = small_mask(name, 192, seed=seed)
    chunk = 4
    start, found = balanced(mask, cp, chunk), ring_balanced(mask, cp, chunk)
    assert sorted(found.order().tolist()) == list(range(192))  # a dispatch, same chunks
    assert all(sum(b - a for a, b in rank) == 192 // cp for rank in found.ranges)
    # The search's in-place updates agree with a dense recount.
    assert ring_lockstep_area(pair_areas(mask, found)) == _dense_ring_lockstep_area(mask, found)
    assert _dense_ring_lockstep_area(mask, found) <= _dense_ring_lockstep_area(mask, start)
    assert ring_balanced(mask, cp, chunk) == found  # deterministic


def test_ring_balanced_evens_the_ring_steps_of_documents():
    """docs/context_parallel.md: causal_document, chatqa2 lengths, seed 0 --
    the ring's lockstep time over its ideal (the mask's area / cp)."""
    found = {}
    for seqlen, cp in ((131072, 2), (131072, 4), (65536, 8)):
        mask = make_mask("causal_document", seqlen, distribution="chatqa2_long_sft", seed=0)
        ideal = mask.area() / cp
        found[seqlen, cp] = tuple(round(ring_lockstep_area(pair_areas(mask, make_dispatch(
            name, mask, cp))) / ideal, 2) for name in ("balanced", "ring_balanced"))
    assert found == {(131072, 2): (1.42, 1.01), (131072, 4): (1.61, 1.02),
                     (65536, 8): (1.76, 1.02)}


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(MASK_NAMES),
    dispatch_name=st.sampled_from(DISPATCH_NAMES),
    cp=st.sampled_from([1, 2, 3, 4]),
    seed=st.integers(0, 3),
)
def test_pair_areas_match_dense_counts(name, dispatch_name, cp, seed):
    mask = small_mask(name, 96, seed=seed)
    dispatch = make_dispatch(dispatch_name, mask, cp)
    dense = mask.to_dense()
    expected = np.array(
        [
            [dense[np.ix_(dispatch.rank_rows(i), dispatch.rank_rows(j))].sum() for j in range(cp)]
            for i in range(cp)
        ]
    )
    got = pair_areas(mask, dispatch)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got.sum(axis=1), rank_areas(mask, dispatch))
    i, j = cp - 1, 0
    assert sub_mask(mask, dispatch.ranges[i], dispatch.ranges[j]).area() == got[i, j]


def test_empty_mask_is_balanced():
    empty = AttnMask(16, 16, [])
    assert imbalance(empty, contiguous(16, 4)) == 1.0
    assert rank_areas(empty, zigzag(16, 2)).tolist() == [0, 0]


def test_bad_names_and_sizes_explain_themselves():
    mask = small_mask("causal", 96)
    with pytest.raises(ValueError, match="contiguous, zigzag, balanced, ring_balanced"):
        make_dispatch("ring", mask, 2)
    with pytest.raises(ValueError, match=r"seqlen % cp == 0"):
        make_dispatch("contiguous", mask, 5)
    with pytest.raises(ValueError, match=r"seqlen % \(2\*cp\) == 0"):
        make_dispatch("zigzag", mask, 5)  # 96 % 10
    with pytest.raises(ValueError, match=r"seqlen % \(cp\*chunk\) == 0"):
        make_dispatch("balanced", mask, 2, chunk=32)
    with pytest.raises(ValueError, match="balanced dispatches only"):
        make_dispatch("zigzag", mask, 2, chunk=8)
    with pytest.raises(ValueError, match="positive integer"):
        contiguous(96, 0)
    with pytest.raises(ValueError, match="square"):
        balanced(AttnMask(8, 16, [AttnSlice(0, 8, 0, 16)]), 2)
    with pytest.raises(ValueError, match="does not fit"):
        rank_areas(mask, contiguous(64, 2))


def test_dispatch_checks_its_ranges():
    with pytest.raises(ValueError, match="unequal"):
        Dispatch("custom", 2, 8, (((0, 3),), ((3, 8),)))
    with pytest.raises(ValueError, match="tile"):
        Dispatch("custom", 2, 8, (((0, 4),), ((3, 7),)))
    with pytest.raises(ValueError, match="rank range lists"):
        Dispatch("custom", 3, 8, (((0, 4),), ((4, 8),)))


def test_the_readme_imbalance_figures():
    """README: causal_document at 128k (chatqa2 lengths, seed 0), cp 8."""
    mask = make_mask("causal_document", 131072, distribution="chatqa2_long_sft", seed=0)
    found = {name: round(imbalance(mask, make_dispatch(name, mask, 8)), 2)
             for name in ("contiguous", "zigzag", "balanced")}
    assert found == {"contiguous": 2.46, "zigzag": 2.06, "balanced": 1.06}
