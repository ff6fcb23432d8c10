"""Group-cast: the key/value chunks each context-parallel rank must receive.

MagiAttention's zero-redundancy idea: a rank receives exactly the K/V
chunks its query rows see, from the ranks that hold them, and nothing else
(group-cast); in the backward it sends the partial dK/dV of those chunks
back to their owners, which sum them (group-reduce). A ring or an
all-gather moves every chunk to every rank whatever the mask; on packed
documents most of those chunks are never looked at.

`plan` makes the plan from the mask's slices (exact; no S x S grid). The
counts it reports (chunks received and sent per rank, the largest bucket
of one rank pair, bytes) are what a strategy carrying it out moves: with
ragged transfers exactly `moved_chunks`, with all_to_all over padded
buckets `padded_chunks`, with one ppermute per ring shift, each padded to
its own largest bucket, `shifted_chunks`.

    from lcab.cp import make_dispatch
    from lcab.cp.groupcast import plan
    cast = plan(mask, make_dispatch("balanced", mask, cp=4), chunk=512)
    cast.receives[2][0]     # global chunk indices rank 2 receives from rank 0
    cast.moved_chunks(), cast.all_gather_chunks()
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from lcab.cp import intervals
from lcab.cp.dispatch import (
    MIN_CHUNKS_PER_RANK,
    Dispatch,
    balanced_owners,
    chunk_tiles,
    fixed_owners,
    from_owners,
    rank_loads,
    square_seqlen,
)
from lcab.masks.mask import AttnMask


@dataclasses.dataclass(frozen=True)
class GroupCast:
    """Per rank pair, the global chunk indices one rank receives from another."""

    dispatch: Dispatch
    chunk: int  # tokens per chunk
    # receives[r][s]: ascending global chunk indices rank r receives from
    # rank s (chunk c holds tokens [c*chunk, (c+1)*chunk)); () for s == r.
    receives: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def cp(self) -> int:
        return self.dispatch.cp

    def counts(self) -> np.ndarray:
        """(cp, cp): [r, s] chunks rank r receives from rank s."""
        return np.array([[len(chunks) for chunks in row] for row in self.receives],
                        dtype=np.int64).reshape(self.cp, self.cp)

    def received(self) -> np.ndarray:
        """(cp,) chunks each rank receives."""
        return self.counts().sum(axis=1)

    def sent(self) -> np.ndarray:
        """(cp,) chunks each rank sends (one sent to two ranks counts twice)."""
        return self.counts().sum(axis=0)

    def moved_chunks(self) -> int:
        """Chunks moved in all, each transfer counted once."""
        return int(self.counts().sum())

    def bucket(self) -> int:
        """The most chunks one rank receives from one other: the bucket an
        all_to_all over padded buckets gives every rank pair."""
        return int(self.counts().max(initial=0))

    def padded_chunks(self) -> int:
        """Chunks moved by an all_to_all whose every bucket is `bucket()`."""
        return self.cp * (self.cp - 1) * self.bucket()

    def shift_buckets(self) -> tuple[int, ...]:
        """Per ring shift d = 1..cp-1, the most chunks a rank sends to rank
        + d: the bucket of a ppermute per shift."""
        counts = self.counts()
        ranks = np.arange(self.cp)
        return tuple(int(counts[(ranks + d) % self.cp, ranks].max()) for d in range(1, self.cp))

    def shifted_chunks(self) -> int:
        """Chunks moved by one ppermute per shift, each padded to its bucket."""
        return self.cp * sum(self.shift_buckets())

    def all_gather_chunks(self) -> int:
        """Chunks a ring or an all-gather moves: every rank gets every other
        rank's K/V, seen or not."""
        per_rank = self.dispatch.tokens_per_rank // self.chunk
        return self.cp * (self.cp - 1) * per_rank

    def kv_bytes(self, chunks: int, heads_kv: int, head_dim: int, itemsize: int) -> int:
        """Bytes of K and V in `chunks` chunks of one batch row."""
        return 2 * chunks * self.chunk * heads_kv * head_dim * itemsize


# The transfer granule's default upper bound, in tokens.
TRANSFER_CHUNK = 512


def transfer_chunk(dispatch: Dispatch, upper: int = TRANSFER_CHUNK) -> int:
    """The default transfer granule: the largest divisor of coarsest_chunk
    that divides `upper` (a power of two up to 512 tokens where the ranges
    allow)."""
    return math.gcd(coarsest_chunk(dispatch), upper)


def coarsest_chunk(dispatch: Dispatch) -> int:
    """The largest chunk that tiles every rank's ranges: the gcd of all
    range boundaries."""
    starts, stops = dispatch.flat_ranges()
    return math.gcd(dispatch.seqlen, *(int(x) for x in np.concatenate([starts, stops])))


def plan(mask: AttnMask, dispatch: Dispatch, chunk: int | None = None) -> GroupCast:
    """Which chunks every rank receives from every other, from the slices:
    chunk c of rank s goes to rank r exactly when one of r's query rows sees
    one of c's keys. `chunk` must divide every range boundary of the
    dispatch (default: coarsest_chunk); finer chunks move fewer unseen keys
    in more pieces."""
    if mask.seqlen_q != mask.seqlen_k or mask.seqlen_q != dispatch.seqlen:
        raise ValueError(f"a {mask.seqlen_q} x {mask.seqlen_k} mask does not fit a dispatch "
                         f"of {dispatch.seqlen} tokens (context parallelism splits one "
                         "sequence into queries and keys alike)")
    coarsest = coarsest_chunk(dispatch)
    chunk = coarsest if chunk is None else chunk
    if int(chunk) != chunk or chunk < 1 or coarsest % chunk:
        raise ValueError(f"chunk={chunk!r} must be a positive divisor of {coarsest}, the gcd "
                         f"of the {dispatch.name} dispatch's range boundaries")
    starts, stops = dispatch.flat_ranges()
    chunk_starts = np.arange(0, dispatch.seqlen, chunk, dtype=np.int64)
    # (ranges, chunks) visible pairs, summed into (cp, chunks) by range owner.
    per_range = intervals.rectangle_areas(mask.slice_table, starts, stops,
                                          chunk_starts, chunk_starts + chunk)
    seen = np.zeros((dispatch.cp, len(chunk_starts)), dtype=np.int64)
    np.add.at(seen, dispatch.owners(), per_range)
    owner = np.empty(len(chunk_starts), dtype=np.int64)
    for rank, ranges in enumerate(dispatch.ranges):
        for start, stop in ranges:
            owner[start // chunk:stop // chunk] = rank
    rows = []
    for r in range(dispatch.cp):
        # r's visible chunks by owner, each owner's in chunk order: one sort a rank.
        visible = np.flatnonzero(seen[r] > 0)
        order = np.argsort(owner[visible], kind="stable")
        chunks = visible[order].tolist()
        bounds = np.searchsorted(owner[visible][order], np.arange(dispatch.cp + 1)).tolist()
        rows.append(tuple(() if s == r else tuple(chunks[bounds[s]:bounds[s + 1]])
                          for s in range(dispatch.cp)))
    return GroupCast(dispatch, int(chunk), tuple(rows))


# ----- a dispatch that moves little ---------------------------------------
SOLVER_NAME = "groupcast"
# The same solver weighing each chunk by the kernel tiles it touches.
TILES_SOLVER_NAME = "groupcast_tiles"
# Its chunking: finer than balanced's four a rank, so tiles can be evened
# (whole 2048-token chunks leave packed documents at cp 4 7 % over the
# mean), coarser than tile_balanced's sixteen, so a rank's chunks stay
# near each other and few move.
TILES_CHUNKS_PER_RANK = 8
# Areas within this fraction of the most even deal count as even: the
# solver trades no more compute balance than this for fewer transfers.
AREA_TOLERANCE = 0.02
# The swap search stops after this many tries (a few seconds at cp 64).
SOLVER_SWAPS = 100_000


def solve(mask: AttnMask, cp: int, chunk: int | None = None,
          tolerance: float = AREA_TOLERANCE, by_tiles: bool = False) -> Dispatch:
    """Equal chunks dealt so that every rank's area is even (within
    `tolerance` of the most even deal found) and, among such deals, the
    fewest chunks move (deterministic).

    The deal: chunks largest area first, each to the rank that would receive
    the fewest new key chunks for it (keys its queries see that the rank
    neither holds nor already needs), among the ranks with room whose load
    is within `tolerance` of the lightest. balanced's candidates (its
    greedy, contiguous, zigzag) compete: the smallest largest-rank area,
    give or take `tolerance`, then the fewest moved chunks, wins; swaps of
    two chunks between ranks then cut the moved chunks further while every
    rank stays within that bound. Moves are counted at the dispatch's own
    chunking (plan with a finer chunk moves less, never more).

    by_tiles (the `groupcast_tiles` dispatch): a chunk weighs the TILE x
    TILE tiles its query rows touch (tile_balanced's measure) instead of
    its area, at TILES_CHUNKS_PER_RANK chunks a rank. A block-sparse
    kernel's time follows its tiles: on the 4 x H200 profile of group-cast
    at cp 4 (docs/context_parallel.md) the ranks' forward kernel times
    were 1.075 / 0.971 / 0.977 / 0.977 of their mean where their tiles
    were 1.076 / 0.968 / 0.971 / 0.985 and their areas 1.058 at most.
    """
    name = TILES_SOLVER_NAME if by_tiles else SOLVER_NAME
    seqlen = square_seqlen(mask, name)
    chunk, balanced_owner = balanced_owners(
        mask, cp, chunk, TILES_CHUNKS_PER_RANK if by_tiles else MIN_CHUNKS_PER_RANK, name,
        by_tiles=by_tiles)
    starts = np.arange(seqlen // chunk, dtype=np.int64) * chunk
    pairs = intervals.rectangle_areas(mask.slice_table, starts, starts + chunk,
                                      starts, starts + chunk)
    sees = pairs > 0  # [i, j]: chunk i's queries see chunk j's keys
    areas = chunk_tiles(mask, chunk) if by_tiles else pairs.sum(axis=1)
    candidates = [_local_greedy(sees, areas, cp, len(starts) // cp, tolerance),
                  balanced_owner, *fixed_owners(len(starts), cp)]
    heaviest = np.array([rank_loads(owner, areas, cp).max() for owner in candidates])
    moved = [_moved(sees, owner, cp) for owner in candidates]
    bound = heaviest.min() * (1 + tolerance)
    even = np.flatnonzero(heaviest <= bound)
    best = min(even, key=lambda index: (moved[index], index))
    owner = _fewer_moves(sees, areas, candidates[best], cp, bound)
    return from_owners(name, seqlen, cp, chunk, owner)


def _local_greedy(sees: np.ndarray, areas: np.ndarray, cp: int, quota: int,
                  tolerance: float) -> np.ndarray:
    load = np.zeros(cp, dtype=np.int64)
    taken = np.zeros(cp, dtype=np.int64)
    needed = np.zeros((cp, len(areas)), dtype=bool)  # key chunks each rank's queries see
    held = np.zeros((cp, len(areas)), dtype=bool)
    owner = np.empty(len(areas), dtype=np.int64)
    for index in np.argsort(-areas, kind="stable"):
        room = taken < quota
        lightest = load[room].min()
        close = room & (load <= lightest + tolerance * (lightest + areas[index]))
        # New receptions: keys it sees that the rank neither holds nor needs
        # yet, less one where the rank's queries already need this chunk.
        new = (sees[index] & ~needed & ~held).sum(axis=1) - (needed[:, index] & ~held[:, index])
        rank = min(np.flatnonzero(close), key=lambda r: (new[r], load[r], r))
        owner[index] = rank
        load[rank] += areas[index]
        taken[rank] += 1
        needed[rank] |= sees[index]
        held[rank, index] = True
    return owner


def _fewer_moves(sees: np.ndarray, areas: np.ndarray, owner: np.ndarray, cp: int,
                 bound: float) -> np.ndarray:
    """Swaps of two chunks between ranks, first improvement, while fewer
    chunks move and no rank's area passes `bound` (SOLVER_SWAPS at most).

    A swap of chunk a (rank x) and chunk b (rank y) changes only what x and
    y see and hold, so a try costs O(chunks): per rank, `count` holds how
    many of its chunks see each key chunk, and its moves are the key chunks
    it sees less those it holds."""
    owner = owner.copy()
    sees = sees.astype(np.int64)
    count = np.zeros((cp, len(owner)), dtype=np.int64)
    np.add.at(count, owner, sees)
    load = rank_loads(owner, areas, cp)

    def moves(row: np.ndarray, held: np.ndarray) -> int:
        return int(np.count_nonzero(row)) - int(np.count_nonzero(row[held]))

    swaps, improved = 0, True
    while improved and swaps < SOLVER_SWAPS:
        improved = False
        for a in range(len(owner)):
            for b in range(a + 1, len(owner)):
                x, y = int(owner[a]), int(owner[b])
                if x == y or swaps >= SOLVER_SWAPS:
                    continue
                swaps += 1
                change = areas[b] - areas[a]
                if max(load[x] + change, load[y] - change) > bound:
                    continue
                before = moves(count[x], owner == x) + moves(count[y], owner == y)
                row_x = count[x] + sees[b] - sees[a]
                row_y = count[y] + sees[a] - sees[b]
                owner[a], owner[b] = y, x
                after = moves(row_x, owner == x) + moves(row_y, owner == y)
                if after < before:
                    count[x], count[y] = row_x, row_y
                    load[x] += change
                    load[y] -= change
                    improved = True
                else:
                    owner[a], owner[b] = x, y
    return owner


def _moved(sees: np.ndarray, owner: np.ndarray, cp: int) -> int:
    """Chunks moved by a deal: for every rank, the chunks of others its
    queries see."""
    one_hot = np.zeros((len(owner), cp), dtype=bool)
    one_hot[np.arange(len(owner)), owner] = True
    seen_by_rank = (one_hot.T.astype(np.int64) @ sees.astype(np.int64)) > 0  # (cp, chunks)
    return int((seen_by_rank & ~one_hot.T).sum())
