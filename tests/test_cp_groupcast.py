"""lcab.cp.groupcast: the chunks each rank receives, against a dense count, and\nthe solver that deals chunks evenly with few of them moved."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcab.cp import balanced, default_chunk, imbalance, make_dispatch, rank_areas
from lcab.cp.dispatch import chunk_tiles, rank_loads
from lcab.cp.groupcast import (
    AREA_TOLERANCE,
    TILES_CHUNKS_PER_RANK,
    coarsest_chunk,
    plan,
    solve,
)
from lcab.masks import MASK_NAMES, make_mask, small_mask


def dense_receives(mask, dispatch, chunk):
    """receives[r][s] by brute force: the chunks of rank s's keys that one
    of rank r's query rows sees in the dense mask."""
    dense = mask.to_dense()
    owner = chunk_owners(dispatch, chunk)
    found = []
    for r in range(dispatch.cp):
        keys = np.flatnonzero(dense[dispatch.rank_rows(r)].any(axis=0))
        chunks = np.unique(keys // chunk)
        found.append(tuple(() if s == r else tuple(int(c) for c in chunks if owner[c] == s)
                           for s in range(dispatch.cp)))
    return tuple(found)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(MASK_NAMES), seed=st.integers(0, 5),
       cp=st.sampled_from([2, 4, 8]), dispatch_name=st.sampled_from(
           ["contiguous", "zigzag", "balanced"]), finer=st.sampled_from([1, 2, 4]))
def test_every_family_receives_exactly_the_chunks_its_queries_see(name, seed, cp,
                                                                  dispatch_name, finer):
    mask = small_mask(name, 256, seed=seed)
    dispatch = make_dispatch(dispatch_name, mask, cp)
    chunk = coarsest_chunk(dispatch) // finer
    cast = plan(mask, dispatch, chunk)
    assert cast.receives == dense_receives(mask, dispatch, chunk)
    counts = cast.counts()
    assert np.all(np.diag(counts) == 0)
    assert cast.moved_chunks() == cast.received().sum() == cast.sent().sum()
    # A pair's bucket holds at most what the sender has: padding never
    # moves more than a ring, and ragged transfers never more than padding.
    assert cast.moved_chunks() <= cast.padded_chunks() <= cast.all_gather_chunks()


def test_a_full_mask_moves_everything_and_causal_only_the_past():
    full = plan(make_mask("full", 1024), make_dispatch("contiguous", make_mask("full", 1024),
                                                       4), chunk=64)
    assert full.moved_chunks() == full.all_gather_chunks() == 4 * 3 * 4
    causal = make_mask("causal", 1024)
    cast = plan(causal, make_dispatch("contiguous", causal, 4), chunk=64)
    # Rank r sees the keys of ranks 0..r-1 whole (4 chunks each) and nothing later.
    assert cast.received().tolist() == [0, 4, 8, 12]
    assert cast.sent().tolist() == [12, 8, 4, 0]
    assert cast.receives[3][1] == (4, 5, 6, 7)
    assert cast.bucket() == 4 and cast.padded_chunks() == 48


def test_packed_documents_move_a_fraction_of_what_a_ring_moves():
    """Documents shorter than a rank's share: most chunks are seen by
    their own rank alone, and a chunk nobody else needs never moves."""
    mask = make_mask("causal_document", 8192, doc_lens=(1000, 3000, 500, 1692, 2000))
    cast = plan(mask, make_dispatch("contiguous", mask, 4), chunk=256)
    assert cast.all_gather_chunks() == 4 * 3 * 8
    # Rank 1 (tokens 2048-4095) needs document 2's start (1000-2047: chunks 3-7).
    assert cast.receives[1][0] == (3, 4, 5, 6, 7)
    assert cast.moved_chunks() < cast.all_gather_chunks() / 4


def test_bytes_count_k_and_v():
    mask = make_mask("causal", 512)
    cast = plan(mask, make_dispatch("contiguous", mask, 2))
    assert cast.chunk == 256 and cast.moved_chunks() == 1
    assert cast.kv_bytes(cast.moved_chunks(), heads_kv=8, head_dim=128, itemsize=2) == \
        2 * 256 * 8 * 128 * 2


def test_a_chunk_that_cuts_a_rank_range_or_another_mask_size_is_refused():
    mask = make_mask("causal", 512)
    dispatch = make_dispatch("zigzag", mask, 2)  # ranges of 128 tokens
    assert coarsest_chunk(dispatch) == 128
    with pytest.raises(ValueError, match="positive divisor of 128"):
        plan(mask, dispatch, chunk=96)
    with pytest.raises(ValueError, match="does not fit a dispatch of 512 tokens"):
        plan(make_mask("causal", 256), dispatch)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(MASK_NAMES), seed=st.integers(0, 3), cp=st.sampled_from([2, 4, 8]))
def test_the_solver_keeps_areas_even_and_moves_no_more_than_balanced(name, seed, cp):
    mask = small_mask(name, 512, seed=seed)
    solved = solve(mask, cp)
    again = balanced(mask, cp)
    assert solved == solve(mask, cp)  # deterministic
    chunk = default_chunk(512, cp)
    assert coarsest_chunk(solved) % chunk == 0
    most, most_balanced = rank_areas(mask, solved).max(), rank_areas(mask, again).max()
    assert most <= most_balanced * (1 + AREA_TOLERANCE)
    moved = plan(mask, solved, chunk).moved_chunks()
    # balanced's deal competes, so it is beaten unless another deal was
    # more even by more than the tolerance (and balanced's fell outside it).
    assert moved <= plan(mask, again, chunk).moved_chunks() or most < most_balanced


def chunk_owners(dispatch, chunk):
    """The rank of every chunk of `chunk` tokens."""
    owner = np.empty(dispatch.seqlen // chunk, dtype=np.int64)
    for rank in range(dispatch.cp):
        owner[dispatch.rank_rows(rank) // chunk] = rank
    return owner


def rank_tiles(mask, dispatch, chunk):
    """Each rank's tiles, by brute force over the dense mask (TILE = 128
    square tiles, or gcd(128, chunk) where the chunk is smaller)."""
    tile = math.gcd(128, chunk)
    dense = mask.to_dense()
    n = mask.seqlen_q // tile
    touched = dense.reshape(n, tile, n, tile).any(axis=(1, 3)).sum(axis=1)  # per query tile
    return np.array([touched[np.unique(dispatch.rank_rows(r) // tile)].sum()
                     for r in range(dispatch.cp)])


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(MASK_NAMES), seed=st.integers(0, 3), cp=st.sampled_from([2, 4]))
def test_the_tile_solver_evens_tiles_and_moves_no_more_than_tile_deals(name, seed, cp):
    """groupcast_tiles: every rank within the tolerance of the most even
    tile deal among its candidates (balanced's greedy by tiles at the same
    chunking is one), its tiles counted against the dense mask."""
    mask = small_mask(name, 1024, seed=seed)
    solved = make_dispatch("groupcast_tiles", mask, cp)
    assert solved.name == "groupcast_tiles" and solved == solve(mask, cp, by_tiles=True)
    chunk = default_chunk(1024, cp, TILES_CHUNKS_PER_RANK)
    assert coarsest_chunk(solved) % chunk == 0
    tiles = rank_tiles(mask, solved, chunk)
    weights = chunk_tiles(mask, chunk)
    greedy = make_dispatch("tile_balanced", mask, cp, chunk=chunk)
    most_even = rank_loads(chunk_owners(greedy, chunk), weights, cp).max()
    assert tiles.max() <= most_even * (1 + AREA_TOLERANCE)
    np.testing.assert_array_equal(tiles, rank_loads(chunk_owners(solved, chunk), weights, cp))


def test_the_tile_solver_evens_the_profiled_case():
    """Packed documents at cp 4, 32k (the seed blog's sampler, seed 0: the
    case profiled on 4 x H200): balanced leaves one rank 7.6 % over the
    mean in tiles; the tile solver within 2.5 %, moving no more chunks."""
    mask = make_mask("causal_document", 32768, seed=0, sampler="magi_pack")
    by_area, by_tiles = balanced(mask, 4), make_dispatch("groupcast_tiles", mask, 4)
    per_chunk = chunk_tiles(mask, 512)  # too large for the dense count; the test above checks it
    area_tiles, solved_tiles = (rank_loads(chunk_owners(d, 512), per_chunk, 4)
                                for d in (by_area, by_tiles))
    assert area_tiles.max() / area_tiles.mean() == pytest.approx(1383 / 1285.25, abs=1e-4)
    assert solved_tiles.max() / solved_tiles.mean() < 1.025
    assert plan(mask, by_tiles, 512).padded_chunks() <= plan(mask, by_area, 512).padded_chunks()


def test_the_solver_keeps_a_sliding_window_local():
    """A window's queries see only their neighbours: contiguous ranks move
    almost nothing, and the solver finds that deal where balanced does not."""
    mask = make_mask("sliding_window_causal", 32768, window=1024)
    solved = solve(mask, 4)
    chunk = default_chunk(32768, 4)
    moved = plan(mask, solved, chunk).moved_chunks()
    assert moved == plan(mask, make_dispatch("contiguous", mask, 4), chunk).moved_chunks() == 3
    assert plan(mask, balanced(mask, 4), chunk).moved_chunks() > moved
    assert imbalance(mask, solved) <= imbalance(mask, balanced(mask, 4)) * (1 + AREA_TOLERANCE)


def test_a_ppermute_per_shift_pads_each_shift_to_its_own_bucket():
    mask = make_mask("causal", 1024)
    cast = plan(mask, make_dispatch("contiguous", mask, 4), chunk=64)
    # Rank r sends all 4 of its chunks to every later rank: shift d reaches
    # r + d, full for r + d < 4; the wrap-around pairs (to earlier ranks) send nothing.
    assert cast.shift_buckets() == (4, 4, 4)
    assert cast.shifted_chunks() == 48 == cast.padded_chunks()
    window = make_mask("sliding_window_causal", 1024, window=64)
    cast = plan(window, make_dispatch("contiguous", window, 4), chunk=64)
    assert cast.shift_buckets() == (1, 0, 0) and cast.shifted_chunks() == 4
    assert cast.moved_chunks() == 3 and cast.padded_chunks() == 12
