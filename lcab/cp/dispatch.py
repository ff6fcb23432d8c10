"""Dispatch: which tokens each context-parallel rank holds.

Every rank holds the same number of tokens (its queries, and its keys and
values for the ring). What differs between dispatches is the work: the
visible pairs of a rank's query rows. `contiguous` splits the sequence in
cp pieces, `zigzag` gives rank r chunks r and 2cp-1-r (the head-tail
balance for causal masks), `balanced` reads the mask and deals equal
chunks greedily by their exact area, `ring_balanced` goes on from there
to even every ring step, not only every rank's total, and
`tile_balanced` deals finer chunks by the kernel tiles they touch. `groupcast`
(lcab.cp.groupcast.solve) keeps balanced's even areas and moves few K/V
chunks under a group-cast plan; `groupcast_tiles` does the same with even
tiles instead of areas.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from lcab.cp import intervals
from lcab.masks.mask import AttnMask
from lcab.masks.schedule import EMPTY

DISPATCH_NAMES = ("contiguous", "zigzag", "balanced", "ring_balanced", "tile_balanced",
                  "groupcast", "groupcast_tiles")
# The dispatches that deal equal chunks by the mask (a chunk size to choose).
MASK_AWARE = DISPATCH_NAMES[2:]
# tile_balanced's unit of work: the square tile a block-sparse flash kernel
# computes whole or skips (pallas_flex's forward, FA3).
TILE = 128
# balanced's default chunking: at least this many chunks per rank, so the
# greedy has room to even out the areas.
MIN_CHUNKS_PER_RANK = 4
# ring_balanced's: finer, since it evens cp steps rather than one total.
RING_CHUNKS_PER_RANK = 16
# ring_balanced tries at most this many chunk swaps (about a second at cp 8):
# at very large cp it stops before it converges, never worse than balanced.
RING_SEARCH_SWAPS = 20_000

Ranges = tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """Per rank, its global token ranges in order (local token i = i-th listed)."""

    name: str
    cp: int
    seqlen: int
    ranges: tuple[Ranges, ...]

    def __post_init__(self):
        _check_cp(self.cp)
        if len(self.ranges) != self.cp:
            raise ValueError(f"{self.name}: {len(self.ranges)} rank range lists for cp={self.cp}")
        sizes = {sum(stop - start for start, stop in rank) for rank in self.ranges}
        if len(sizes) != 1:
            raise ValueError(f"{self.name}: ranks hold unequal token counts {sorted(sizes)}")
        # Together the ranges must cover every token exactly once.
        everything = sorted(r for rank in self.ranges for r in rank if r[1] > r[0])
        expected_start = 0
        for start, stop in everything:
            if start != expected_start:
                raise ValueError(
                    f"{self.name}: ranges do not tile [0, {self.seqlen}) at token {expected_start}"
                )
            expected_start = stop
        if expected_start != self.seqlen:
            raise ValueError(f"{self.name}: ranges end at {expected_start}, not {self.seqlen}")

    @property
    def tokens_per_rank(self) -> int:
        return self.seqlen // self.cp

    def rank_rows(self, rank: int) -> np.ndarray:
        """Global token indices of `rank`, in its local order."""
        return _expand(self.ranges[rank])

    def order(self) -> np.ndarray:
        """The permutation: all ranks' tokens, rank 0 first."""
        return _expand([r for rank in self.ranges for r in rank])

    def owners(self) -> np.ndarray:
        """Rank of every range in `flat_ranges()` order."""
        return np.repeat(np.arange(self.cp), [len(rank) for rank in self.ranges])

    def flat_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """(starts, stops) of all ranges, rank 0 first."""
        flat = np.array([r for rank in self.ranges for r in rank], dtype=np.int64)
        flat = flat.reshape(-1, 2)
        return flat[:, 0], flat[:, 1]


def _expand(ranges) -> np.ndarray:
    parts = [np.arange(start, stop, dtype=np.int64) for start, stop in ranges]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _check_cp(cp) -> None:
    if int(cp) != cp or cp < 1:
        raise ValueError(f"cp={cp!r} must be a positive integer")


def _need_divisible(name: str, seqlen: int, divisor: int, rule: str) -> None:
    if seqlen % divisor:
        raise ValueError(
            f"{name} dispatch needs {rule}, got seqlen={seqlen} (not a multiple of {divisor})"
        )


# ----- the dispatches ----------------------------------------------------
def contiguous(seqlen: int, cp: int) -> Dispatch:
    """Rank r holds tokens [r*S/cp, (r+1)*S/cp)."""
    _check_cp(cp)
    _need_divisible("contiguous", seqlen, cp, f"seqlen % cp == 0 (cp={cp})")
    per_rank = seqlen // cp
    ranges = tuple(((r * per_rank, (r + 1) * per_rank),) for r in range(cp))
    return Dispatch("contiguous", cp, seqlen, ranges)


def zigzag(seqlen: int, cp: int) -> Dispatch:
    """2cp equal chunks; rank r holds chunk r and chunk 2cp-1-r."""
    _check_cp(cp)
    _need_divisible("zigzag", seqlen, 2 * cp, f"seqlen % (2*cp) == 0 (cp={cp})")
    chunk = seqlen // (2 * cp)

    def span(i):
        return (i * chunk, (i + 1) * chunk)

    ranges = tuple(_merge([span(r), span(2 * cp - 1 - r)]) for r in range(cp))
    return Dispatch("zigzag", cp, seqlen, ranges)


def default_chunk(seqlen: int, cp: int, chunks_per_rank: int = MIN_CHUNKS_PER_RANK) -> int:
    """Largest power of two <= seqlen / (chunks_per_rank cp) that divides
    seqlen / cp; >= 1."""
    _check_cp(cp)
    _need_divisible("balanced", seqlen, cp, f"seqlen % cp == 0 (cp={cp})")
    per_rank = seqlen // cp
    chunk = 1
    while chunk * 2 * chunks_per_rank <= per_rank and per_rank % (chunk * 2) == 0:
        chunk *= 2
    return chunk


def balanced(mask: AttnMask, cp: int, chunk: int | None = None) -> Dispatch:
    """Equal chunks dealt to ranks greedily by exact area (deterministic).

    Chunks go largest area first (ties: earlier chunk first) to the rank
    with the least area among those still short of S/(cp*chunk) chunks
    (ties: lower rank), so every rank gets the same number of chunks.
    The greedy is a heuristic and can lose to a fixed layout on a mask
    that layout happens to fit (block-causal documents cut at rank
    boundaries), so the contiguous and zigzag chunkings compete too and
    the smallest largest-rank area wins (ties: greedy first).
    """
    chunk, owner = balanced_owners(mask, cp, chunk, MIN_CHUNKS_PER_RANK, "balanced")
    return from_owners("balanced", mask.seqlen_q, cp, chunk, owner)


def tile_balanced(mask: AttnMask, cp: int, chunk: int | None = None) -> Dispatch:
    """balanced's deal, weighing each chunk by the TILE x TILE tiles its
    query rows touch instead of its exact area (deterministic).

    A block-sparse kernel computes every tile the mask touches whole, so a
    rank's kernel time follows its tiles: on packed documents, where tiles
    cut by document edges are many, a deal even in area can leave one rank
    10 % more tiles (4 x H100, 2026-11-28: the ranks' forward kernel times
    followed their tile counts, not their areas). Under every strategy here
    a rank's keys keep their tile boundaries (chunks are whole tiles), so a
    chunk's tiles in the global mask are exactly its tiles on the rank.
    It deals ring_balanced's finer chunks (RING_CHUNKS_PER_RANK a rank):
    at balanced's four a rank, whole 2048-token chunks leave little to
    even (packed causal documents, 32k, cp 4: the most tiles on a rank
    1383 under balanced, 1360 under this at 2048-token chunks, 1288 at
    512, where the mean is 1285). Tiles shrink to gcd(TILE, chunk) where
    the chunk is smaller.
    """
    chunk, owner = balanced_owners(mask, cp, chunk, RING_CHUNKS_PER_RANK, "tile_balanced",
                                   by_tiles=True)
    return from_owners("tile_balanced", mask.seqlen_q, cp, chunk, owner)


def chunk_tiles(mask: AttnMask, chunk: int) -> np.ndarray:
    """(chunks,) the tiles (gcd(TILE, chunk) square) each chunk's query rows
    touch, over every key."""
    tile = math.gcd(TILE, chunk)
    schedule = mask.block_schedule(tile, tile)
    per_block = np.bincount(np.asarray(schedule.q_block)[np.asarray(schedule.state) != EMPTY],
                            minlength=-(-mask.seqlen_q // tile))
    return per_block.reshape(-1, chunk // tile).sum(axis=1).astype(np.int64)


def ring_balanced(mask: AttnMask, cp: int, chunk: int | None = None) -> Dispatch:
    """balanced's assignment at a finer chunking, then chunk swaps between
    ranks that shorten a ring's lockstep time (deterministic).

    At ring step s rank r attends its queries to the keys of rank
    (r - s) mod cp, and each step's transfer pairs two ranks, so a step
    lasts as long as its largest such area. balanced evens only the
    ranks' totals; this swaps pairs of chunks between ranks, first
    improvement, while the sum over steps of the largest area falls
    (RING_SEARCH_SWAPS tries at most). Every rank's total is at most that
    sum, so the ranks stay balanced for the other strategies too.
    """
    chunk, owner = balanced_owners(mask, cp, chunk, RING_CHUNKS_PER_RANK, "ring_balanced")
    starts = np.arange(len(owner), dtype=np.int64) * chunk
    chunk_pairs = intervals.rectangle_areas(mask.slice_table, starts, starts + chunk,
                                            starts, starts + chunk).astype(np.int64)
    owner = _even_ring_steps(chunk_pairs, owner, cp)
    return from_owners("ring_balanced", mask.seqlen_q, cp, chunk, owner)


def ring_step_areas(areas: np.ndarray) -> np.ndarray:
    """(cp, cp) pair areas rearranged by ring step: [r, s] is rank r's area
    at step s, its queries against the keys of rank (r - s) mod cp."""
    ranks = np.arange(len(areas))
    return areas[ranks[:, None], (ranks[:, None] - ranks[None, :]) % len(areas)]


def ring_lockstep_area(areas: np.ndarray) -> int:
    """Sum over a ring's steps of the step's largest area, from (cp, cp)
    pair areas: the ring's time if every step waits for its slowest rank."""
    return int(ring_step_areas(areas).max(axis=0).sum())


def _even_ring_steps(chunk_pairs: np.ndarray, owner: np.ndarray, cp: int) -> np.ndarray:
    """Local search over swaps of two chunks of different ranks. A swap
    changes two rows and two columns of the rank-pair areas, which are
    updated in place of a recount (rank_keys / rank_queries: each chunk's
    pairs with every rank's keys / queries)."""
    owner = owner.copy()
    one_hot = np.zeros((len(owner), cp), dtype=np.int64)
    one_hot[np.arange(len(owner)), owner] = 1
    rank_keys = chunk_pairs @ one_hot  # (chunks, cp)
    rank_queries = one_hot.T @ chunk_pairs  # (cp, chunks)
    areas = one_hot.T @ rank_keys
    best = ring_lockstep_area(areas)
    swaps, improved = 0, True
    while improved and swaps < RING_SEARCH_SWAPS:
        improved = False
        for a in range(len(owner)):
            for b in range(a + 1, len(owner)):
                x, y = owner[a], owner[b]
                if x == y:
                    continue
                swaps += 1
                row = rank_keys[a] - rank_keys[b]
                column = rank_queries[:, a] - rank_queries[:, b]
                both = (chunk_pairs[a, a] - chunk_pairs[a, b] - chunk_pairs[b, a]
                        + chunk_pairs[b, b])
                trial = areas.copy()
                trial[y] += row
                trial[x] -= row
                trial[:, y] += column
                trial[:, x] -= column
                trial[[x, y], [x, y]] += both
                trial[[x, y], [y, x]] -= both
                lockstep = ring_lockstep_area(trial)
                if lockstep < best:
                    best, areas, improved = lockstep, trial, True
                    owner[a], owner[b] = y, x
                    moved = chunk_pairs[:, a] - chunk_pairs[:, b]
                    rank_keys[:, y] += moved
                    rank_keys[:, x] -= moved
                    moved = chunk_pairs[a] - chunk_pairs[b]
                    rank_queries[y] += moved
                    rank_queries[x] -= moved
                if swaps >= RING_SEARCH_SWAPS:
                    return owner
    return owner


def balanced_owners(mask: AttnMask, cp: int, chunk: int | None, chunks_per_rank: int,
                    name: str, by_tiles: bool = False) -> tuple[int, np.ndarray]:
    """(chunk, rank of every chunk) of balanced's greedy deal, by exact area
    or (by_tiles) by chunk_tiles."""
    seqlen = square_seqlen(mask, name)
    _check_cp(cp)
    if chunk is None:
        chunk = default_chunk(seqlen, cp, chunks_per_rank)
    if int(chunk) != chunk or chunk < 1:
        raise ValueError(f"chunk={chunk!r} must be a positive integer")
    _need_divisible(
        name, seqlen, cp * chunk, f"seqlen % (cp*chunk) == 0 (cp={cp}, chunk={chunk})"
    )
    n_chunks = seqlen // chunk
    starts = np.arange(n_chunks, dtype=np.int64) * chunk
    areas = chunk_tiles(mask, chunk) if by_tiles else intervals.rectangle_areas(
        mask.slice_table, starts, starts + chunk, np.array([0]), np.array([seqlen])
    )[:, 0]

    candidates = [_greedy_owners(areas, cp, n_chunks // cp), *fixed_owners(n_chunks, cp)]
    heaviest = [rank_loads(owner, areas, cp).max() for owner in candidates]
    return chunk, candidates[int(np.argmin(heaviest))]


def fixed_owners(n_chunks: int, cp: int) -> list[np.ndarray]:
    """Rank of every chunk under the contiguous layout, and under zigzag's
    where a rank's chunks split in two halves (an even count per rank)."""
    quota = n_chunks // cp
    layouts = [np.arange(n_chunks) // quota]
    if quota % 2 == 0:
        group = np.arange(n_chunks) // (quota // 2)  # zigzag's 2cp chunks
        layouts.append(np.where(group < cp, group, 2 * cp - 1 - group))
    return layouts


def from_owners(name: str, seqlen: int, cp: int, chunk: int, owner: np.ndarray) -> Dispatch:
    starts = np.arange(len(owner), dtype=np.int64) * chunk
    ranges = tuple(
        _merge([(int(s), int(s) + chunk) for s in starts[owner == r]]) for r in range(cp)
    )
    return Dispatch(name, cp, seqlen, ranges)


def _greedy_owners(areas: np.ndarray, cp: int, quota: int) -> np.ndarray:
    """Rank of every chunk: largest first, to the lightest rank with room."""
    load = np.zeros(cp, dtype=np.int64)
    taken = np.zeros(cp, dtype=np.int64)
    owner = np.empty(len(areas), dtype=np.int64)
    for index in np.argsort(-areas, kind="stable"):
        # Full ranks are out of the running; argmin picks the lowest rank on ties.
        rank = int(np.argmin(np.where(taken < quota, load, np.iinfo(np.int64).max)))
        owner[index] = rank
        load[rank] += areas[index]
        taken[rank] += 1
    return owner


def rank_loads(owner: np.ndarray, areas: np.ndarray, cp: int) -> np.ndarray:
    load = np.zeros(cp, dtype=np.int64)
    np.add.at(load, owner, areas)
    return load


def _merge(ranges) -> Ranges:
    """Adjacent ranges (in the given order) joined into one."""
    out: list[tuple[int, int]] = []
    for start, stop in ranges:
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return tuple(out)


def square_seqlen(mask: AttnMask, what: str) -> int:
    # Context parallelism splits one token sequence into queries and keys alike.
    if mask.seqlen_q != mask.seqlen_k:
        raise ValueError(
            f"{what} needs a square mask (queries and keys are the same tokens), "
            f"got {mask.seqlen_q} x {mask.seqlen_k}"
        )
    return mask.seqlen_q


def make_dispatch(name: str, mask: AttnMask, cp: int, *, chunk: int | None = None) -> Dispatch:
    """The dispatch called `name` for `mask` over cp ranks (`chunk`: the
    mask-aware ones only; groupcast: lcab.cp.groupcast.solve)."""
    if name not in DISPATCH_NAMES:
        raise ValueError(f"unknown dispatch {name!r}; choose from {', '.join(DISPATCH_NAMES)}")
    if name in ("balanced", "ring_balanced", "tile_balanced"):
        return {"balanced": balanced, "ring_balanced": ring_balanced,
                "tile_balanced": tile_balanced}[name](mask, cp, chunk)
    if name in ("groupcast", "groupcast_tiles"):
        from lcab.cp.groupcast import solve  # it builds on this module

        return solve(mask, cp, chunk, by_tiles=name == "groupcast_tiles")
    if chunk is not None:
        raise ValueError(f"chunk={chunk} applies to the balanced dispatches only, not {name!r}")
    seqlen = square_seqlen(mask, name)
    return contiguous(seqlen, cp) if name == "contiguous" else zigzag(seqlen, cp)


# ----- work per rank -----------------------------------------------------
def _check_fits(mask: AttnMask, dispatch: Dispatch) -> None:
    if dispatch.seqlen != mask.seqlen_q:
        raise ValueError(
            f"dispatch over {dispatch.seqlen} tokens does not fit a mask with "
            f"{mask.seqlen_q} query rows"
        )


def rank_areas(mask: AttnMask, dispatch: Dispatch) -> np.ndarray:
    """(cp,) exact visible pairs of each rank's query rows against all keys."""
    _check_fits(mask, dispatch)
    starts, stops = dispatch.flat_ranges()
    per_range = intervals.rectangle_areas(
        mask.slice_table, starts, stops, np.array([0]), np.array([mask.seqlen_k])
    )[:, 0]
    out = np.zeros(dispatch.cp, dtype=np.int64)
    np.add.at(out, dispatch.owners(), per_range)  # integer sums: exact at any size
    return out


def check_chunks_per_rank(name: str, chunks_per_rank: int) -> None:
    """ValueError unless dispatch `name` deals chunks by the mask and
    `chunks_per_rank` (the option dispatch_chunks) is at least 1."""
    if name not in MASK_AWARE:
        raise ValueError(f"dispatch_chunks={chunks_per_rank} is for the mask-aware dispatches "
                         f"only ({', '.join(MASK_AWARE)}), not {name!r}")
    if chunks_per_rank < 1:
        raise ValueError(f"dispatch_chunks={chunks_per_rank} must be at least 1")


@functools.lru_cache(maxsize=16)
def cached_dispatch(name: str, mask: AttnMask, cp: int,
                    chunks_per_rank: int | None = None) -> Dispatch:
    """make_dispatch, remembered: a CP backend's supports(), notes and build
    of one case all ask, as does the model for every strategy and direction,
    and the balanced dispatches score every chunk (ring_balanced searches).
    chunks_per_rank: the mask-aware dispatches deal chunks of
    default_chunk(seqlen, cp, chunks_per_rank) tokens instead of their own
    default (None)."""
    if chunks_per_rank is None:
        return make_dispatch(name, mask, cp)
    check_chunks_per_rank(name, chunks_per_rank)
    return make_dispatch(name, mask, cp,
                         chunk=default_chunk(square_seqlen(mask, name), cp, chunks_per_rank))


def imbalance(mask: AttnMask, dispatch: Dispatch) -> float:
    """Largest rank area over the mean: 1.0 is perfect (and an empty mask)."""
    areas = rank_areas(mask, dispatch)
    total = int(areas.sum())
    return 1.0 if total == 0 else float(areas.max() * dispatch.cp / total)


def rank_tiles(mask: AttnMask, dispatch: Dispatch) -> np.ndarray:
    """(cp,) the tiles each rank's query rows touch over every key: TILE x
    TILE, or gcd(TILE, every range boundary) square where the ranges cut
    tiles. What a block-sparse kernel computes (each touched tile whole),
    so what a rank's kernel time follows where areas are even but document
    edges cut many tiles; a rank's keys keep their tile boundaries under
    every strategy here, so these are its tiles on the rank too."""
    _check_fits(mask, dispatch)
    starts, stops = dispatch.flat_ranges()
    tile = math.gcd(TILE, *(int(edge) for edge in (*starts, *stops)))
    before = np.concatenate([[0], np.cumsum(chunk_tiles(mask, tile))])
    out = np.zeros(dispatch.cp, dtype=np.int64)
    np.add.at(out, dispatch.owners(), before[np.asarray(stops) // tile]
              - before[np.asarray(starts) // tile])
    return out


def tile_imbalance(mask: AttnMask, dispatch: Dispatch) -> float:
    """Largest rank's tiles (rank_tiles) over the mean: 1.0 is perfect."""
    tiles = rank_tiles(mask, dispatch)
    total = int(tiles.sum())
    return 1.0 if total == 0 else float(tiles.max() * dispatch.cp / total)


def pair_areas(mask: AttnMask, dispatch: Dispatch) -> np.ndarray:
    """(cp, cp): rank i's query rows against rank j's keys (one ring step's work)."""
    _check_fits(mask, dispatch)
    square_seqlen(mask, "pair_areas")
    starts, stops = dispatch.flat_ranges()
    per_pair = intervals.rectangle_areas(mask.slice_table, starts, stops, starts, stops)
    owners = dispatch.owners()
    out = np.zeros((dispatch.cp, dispatch.cp), dtype=np.int64)
    np.add.at(out, (owners[:, None], owners[None, :]), per_pair)
    return out
