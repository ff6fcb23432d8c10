"""Host-side plan of jax.pallas_flex: which tiles each program visits.

Built once per (mask, block sizes) with numpy from the mask's block
schedule, so nothing is S x S. A program of the forward (and of dQ) owns one
q block and walks its kv blocks; a program of dK/dV owns one kv block and
walks its q blocks. A visited tile is *full* (no element mask) or *partial*:
its element mask is the union of the slices listed for it, evaluated in the
kernel from the slices' five integers. Tiles that reach past the sequence
(lengths that are not a multiple of the block) are always partial, so the
padding is masked by the slices themselves.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lcab.masks import AttnMask
from lcab.masks import schedule as schedule_lib
from lcab.masks import slices as slices_lib


def _power_of_two(n: int) -> int:
    # Triton tensors need power-of-two shapes; tables are padded to one.
    return 1 << max(0, int(n) - 1).bit_length()


@dataclasses.dataclass(frozen=True, eq=False)
class Walk:
    """Visits of every program of one direction, one row per program.

    Full tiles come as runs of consecutive inner blocks: program p visits
    blocks run_start[p, r] .. run_stop[p, r] - 1 for r < runs[p], with no
    element mask and with addresses the compiler can prefetch. Partial tiles
    come one by one: block[p, j] for j < partials[p], masked by the slices
    slice_ids[lo[p, j]:hi[p, j]]. Entries past the counts are padding.

    `order` is the launch order: the k-th program launched takes row
    order[k], heaviest rows first. Launched in row order, the few long rows
    of a packed-documents mask can start last and run alone at the end (a
    list-scheduling estimate put a ring's dK/dV step at 8k tokens per GPU
    at 0.6 of its ideal so); heaviest first is the classic cure for such a
    tail (LPT scheduling). ops decides how heads interleave.
    """

    run_start: np.ndarray
    run_stop: np.ndarray
    runs: np.ndarray
    block: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    partials: np.ndarray
    order: np.ndarray

    @property
    def full_visits(self) -> int:
        return int((self.run_stop - self.run_start).sum())

    @property
    def partial_visits(self) -> int:
        return int(self.partials.sum())

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.run_start, self.run_stop, self.runs, self.block, self.lo, self.hi,
                self.partials, self.order)


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The static shape of a plan: what the kernels are compiled for."""

    seqlen_q: int
    seqlen_k: int
    block_q: int
    block_k: int
    # How far the heaviest dK/dV program runs past an average one, as a share
    # of one head's dK/dV work: the tail a late start of it would leave
    # (ops chooses the dK/dV launch by it; 0 when all are equal).
    dkv_tail: float = 0.0
    # The mean keys a forward program walks (its q block's tiles x block_k,
    # over the q blocks that walk any): the forward's grid is chosen by it
    # (schedule.forward_grid; 0 for a plan that walks nothing).
    row_keys: float = 0.0
    # The share of the forward's tiles that the mask cuts (partial tiles over
    # all it visits; 0 for a plan that walks nothing): the key block's
    # choice reads it (schedule.forward_key_block).
    cut_share: float = 0.0

    @property
    def num_q_blocks(self) -> int:
        return -(-self.seqlen_q // self.block_q)

    @property
    def num_k_blocks(self) -> int:
        return -(-self.seqlen_k // self.block_k)

    @property
    def padded_q(self) -> int:
        return self.num_q_blocks * self.block_q

    @property
    def padded_k(self) -> int:
        return self.num_k_blocks * self.block_k


@dataclasses.dataclass(frozen=True, eq=False)
class FlexPlan:
    geometry: Geometry
    by_q: Walk  # per q block: its kv blocks (forward, dQ)
    by_k: Walk  # per kv block: its q blocks (dK, dV)
    slice_ids: np.ndarray  # int32, the slices of every partial tile, tile after tile
    slices: np.ndarray  # int32 (n_slices * 5,): q0, q1, k0, k1, kind per slice

    def __getattr__(self, name):  # seqlen_q, block_q, padded_k, ... of the geometry
        geometry = self.__dict__.get("geometry")
        if geometry is None:
            raise AttributeError(name)
        return getattr(geometry, name)

    def partial_tiles(self) -> int:
        return self.by_q.partial_visits

    def tiles(self) -> int:
        return self.by_q.full_visits + self.by_q.partial_visits

    def tables(self) -> dict[str, tuple[np.ndarray, ...] | np.ndarray]:
        """The integer arrays the kernels read (a pytree)."""
        return {"by_q": self.by_q.arrays(), "by_k": self.by_k.arrays(),
                "slice_ids": self.slice_ids, "slices": self.slices}


def stack_plans(plans) -> tuple[Geometry, dict]:
    """The shared geometry and the tables of several plans of one shape (one
    per CP rank or step), zero-padded to common widths and stacked on a new
    first axis. The geometry keeps the longest dK/dV tail and the longest
    mean forward walk and largest cut share among them."""
    shapes = {dataclasses.replace(plan.geometry, dkv_tail=0.0, row_keys=0.0, cut_share=0.0)
              for plan in plans}
    if len(shapes) != 1:
        raise ValueError("plans of different shapes cannot be stacked")
    geometry = dataclasses.replace(shapes.pop(),
                                   dkv_tail=max(plan.geometry.dkv_tail for plan in plans),
                                   row_keys=max(plan.geometry.row_keys for plan in plans),
                                   cut_share=max(plan.geometry.cut_share for plan in plans))
    trees = [plan.tables() for plan in plans]

    def stack(*arrays):
        width = max(a.shape[-1] for a in arrays)
        pad = lambda a: np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, width - a.shape[-1])])  # noqa: E731
        return np.stack([pad(a) for a in arrays])

    return geometry, {
        "by_q": tuple(map(stack, *(t["by_q"] for t in trees))),
        "by_k": tuple(map(stack, *(t["by_k"] for t in trees))),
        "slice_ids": stack(*(t["slice_ids"] for t in trees)),
        "slices": stack(*(t["slices"] for t in trees)),
    }


def make_plan(mask: AttnMask, block_q: int, block_k: int) -> FlexPlan:
    table = mask.slice_table
    table = table[slices_lib.table_areas(table) > 0]
    sched = mask.block_schedule(block_q, block_k)
    nq, nk = sched.num_q_blocks, sched.num_k_blocks
    qb, kb = sched.q_block.astype(np.int64), sched.k_block.astype(np.int64)
    edge = ((qb + 1) * block_q > mask.seqlen_q) | ((kb + 1) * block_k > mask.seqlen_k)
    partial = (sched.state == schedule_lib.PARTIAL) | edge

    tile_key = qb * nk + kb  # sorted: the schedule is q-block major
    partial_keys = tile_key[partial]
    slice_ids, starts, stops = _slices_of_tiles(table, partial_keys, block_q, block_k, nk)
    lo = np.zeros(len(tile_key), np.int64)
    hi = np.zeros(len(tile_key), np.int64)
    lo[partial], hi[partial] = starts, stops

    by_q = _walk(qb, kb, partial, lo, hi, nq)
    order = np.lexsort((qb, kb))
    by_k = _walk(kb[order], qb[order], partial[order], lo[order], hi[order], nk)
    dkv_work = _work((by_k.run_stop - by_k.run_start).sum(axis=1), by_k.partials)
    row_tiles = np.bincount(qb, minlength=nq)
    walking = row_tiles[row_tiles > 0]
    return FlexPlan(
        geometry=Geometry(mask.seqlen_q, mask.seqlen_k, block_q, block_k,
                          dkv_tail=float((dkv_work.max() - dkv_work.mean()) / dkv_work.sum()),
                          row_keys=float(walking.mean() * block_k) if len(walking) else 0.0,
                          cut_share=float(partial.mean()) if len(partial) else 0.0),
        by_q=by_q, by_k=by_k,
        slice_ids=_padded(slice_ids.astype(np.int32)),
        slices=_padded(table.astype(np.int32).reshape(-1)),
    )


def _padded(values: np.ndarray) -> np.ndarray:
    out = np.zeros(_power_of_two(max(1, len(values))), np.int32)
    out[: len(values)] = values
    return out


def _walk(outer, inner, partial, lo, hi, n_outer) -> Walk:
    """A Walk from tiles sorted by (outer, inner)."""
    full = ~partial
    f_outer, f_inner = outer[full], inner[full]
    starts_run = np.ones(len(f_outer), bool)  # a run starts at a gap or a new row
    starts_run[1:] = (f_outer[1:] != f_outer[:-1]) | (f_inner[1:] != f_inner[:-1] + 1)
    first = np.flatnonzero(starts_run)
    last = np.append(first[1:], len(f_outer))[: len(first)] - 1  # no full tiles: none
    run_start, run_stop, runs = _rows(f_outer[first], n_outer, f_inner[first], f_inner[last] + 1)
    block, p_lo, p_hi, partials = _rows(outer[partial], n_outer, inner[partial], lo[partial],
                                        hi[partial])
    work = _work(np.bincount(f_outer, minlength=n_outer), partials)
    return Walk(run_start, run_stop, runs, block, p_lo, p_hi, partials,
                np.argsort(-work, kind="stable").astype(np.int32))


# A partial tile costs more than a full one (its element mask is built from
# the slices); a program, besides its tiles, loads its block and stores its
# result. Rough weights: only the order they give matters.
_PARTIAL_TILE_COST = 1.3
_PROGRAM_COST = 0.3


def _work(full_visits: np.ndarray, partials: np.ndarray) -> np.ndarray:
    """The estimated work of each program of a walk, in full tiles."""
    return full_visits + _PARTIAL_TILE_COST * partials + _PROGRAM_COST


def _rows(owner, n_outer, *values):
    """Each of `values` laid out as (n_outer, width) rows by owner (sorted),
    width a power of two; then the count per row."""
    count = np.bincount(owner, minlength=n_outer).astype(np.int32)
    width = _power_of_two(max(1, int(count.max(initial=0))))
    position = np.arange(len(owner)) - np.repeat(np.cumsum(count) - count, count)
    tables = []
    for value in values:
        table = np.zeros((n_outer, width), np.int32)
        table[owner, position] = value
        tables.append(table)
    return (*tables, count)


def _slices_of_tiles(table, tile_keys, block_q, block_k, nk):
    """CSR lists of the slices whose rectangle meets each tile in tile_keys.

    Returns (slice_ids, starts, stops) with slice_ids[starts[i]:stops[i]]
    the slices of tile_keys[i]. Every (slice, tile) pair a slice's rectangle
    covers is enumerated, but only those on listed tiles are kept.
    """
    if len(tile_keys) == 0 or len(table) == 0:
        empty = np.zeros(len(tile_keys), np.int64)
        return np.zeros(0, np.int64), empty, empty
    q0, q1, k0, k1 = (table[:, i] for i in range(4))
    owner, qb = schedule_lib.ragged_ranges(q0 // block_q, -(-q1 // block_q))
    kb_lo, kb_hi = k0[owner] // block_k, -(-k1[owner] // block_k)
    pair, kb = schedule_lib.ragged_ranges(kb_lo, kb_hi)
    slice_of, key = owner[pair], qb[pair] * nk + kb
    where = np.searchsorted(tile_keys, key)
    keep = (where < len(tile_keys)) & (tile_keys[np.minimum(where, len(tile_keys) - 1)] == key)
    tile_index, slice_of = where[keep], slice_of[keep]
    order = np.lexsort((slice_of, tile_index))
    tile_index, slice_of = tile_index[order], slice_of[order]
    counts = np.bincount(tile_index, minlength=len(tile_keys))
    stops = np.cumsum(counts)
    return slice_of, stops - counts, stops

