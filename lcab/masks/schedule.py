"""Per-block schedules: which (q block, kv block) tiles a kernel must visit.

A tile is *full* when every (q, k) pair in it is visible, *partial* when
some are, and skipped otherwise. Counts are summed over slices with the
closed-form arithmetic of `slices.visible_counts`, touching only the tiles
each slice reaches, so a 128k mask costs milliseconds, not S^2.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lcab.masks import slices as slices_lib

EMPTY, PARTIAL, FULL = 0, 1, 2
# Up to this many tiles, per-tile sums use one dense bincount (8 bytes a
# tile); beyond it, a sort over the visited tiles only.
_DENSE_TILE_LIMIT = 1 << 24


@dataclasses.dataclass(frozen=True, eq=False)
class BlockSchedule:
    """Visible tiles of a mask on a (block_q x block_k) grid, q-block major.

    `q_block`, `k_block` and `state` are parallel arrays listing every
    non-empty tile, sorted by (q_block, k_block); `visible` counts its
    visible pairs. Edge tiles may be smaller than block_q x block_k when the
    sequence is not a multiple of the block size.
    """

    block_q: int
    block_k: int
    seqlen_q: int
    seqlen_k: int
    q_block: np.ndarray
    k_block: np.ndarray
    state: np.ndarray
    visible: np.ndarray

    @property
    def num_q_blocks(self) -> int:
        return -(-self.seqlen_q // self.block_q)

    @property
    def num_k_blocks(self) -> int:
        return -(-self.seqlen_k // self.block_k)

    def _of_q_block(self, q_block: int, state: int) -> np.ndarray:
        lo, hi = np.searchsorted(self.q_block, [q_block, q_block + 1])
        picked = self.k_block[lo:hi]
        return picked[self.state[lo:hi] == state]

    def full(self, q_block: int) -> np.ndarray:
        """KV blocks that q block `q_block` sees entirely (sorted)."""
        return self._of_q_block(q_block, FULL)

    def partial(self, q_block: int) -> np.ndarray:
        """KV blocks that q block `q_block` sees in part (sorted)."""
        return self._of_q_block(q_block, PARTIAL)

    def per_q_block(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """[(full kv blocks, partial kv blocks)] for every q block."""
        return [(self.full(i), self.partial(i)) for i in range(self.num_q_blocks)]

    def to_dense(self) -> np.ndarray:
        """(num_q_blocks, num_k_blocks) int8 map: 0 empty, 1 partial, 2 full."""
        out = np.zeros((self.num_q_blocks, self.num_k_blocks), dtype=np.int8)
        out[self.q_block, self.k_block] = self.state
        return out

    def transposed(self) -> "BlockSchedule":
        """The same tiles listed kv-block major (what a backward pass walks)."""
        order = np.lexsort((self.q_block, self.k_block))
        return BlockSchedule(
            block_q=self.block_k,
            block_k=self.block_q,
            seqlen_q=self.seqlen_k,
            seqlen_k=self.seqlen_q,
            q_block=self.k_block[order],
            k_block=self.q_block[order],
            state=self.state[order],
            visible=self.visible[order],
        )

    def counts(self) -> dict[str, int]:
        return {
            "full": int(np.sum(self.state == FULL)),
            "partial": int(np.sum(self.state == PARTIAL)),
            "empty": self.num_q_blocks * self.num_k_blocks - len(self.state),
        }


def ragged_ranges(starts: np.ndarray, stops: np.ndarray):
    """(owner index, value) for every value in each [start, stop) range."""
    lengths = np.maximum(stops - starts, 0)
    owner = np.repeat(np.arange(len(starts)), lengths)
    offsets = np.cumsum(lengths) - lengths
    values = np.arange(lengths.sum()) - np.repeat(offsets, lengths) + starts[owner]
    return owner, values


def build_block_schedule(
    table: np.ndarray, seqlen_q: int, seqlen_k: int, block_q: int, block_k: int
) -> BlockSchedule:
    if block_q <= 0 or block_k <= 0:
        raise ValueError(f"block sizes must be positive, got {block_q=} {block_k=}")
    table = table[slices_lib.table_areas(table) > 0]
    q0, q1, k0, k1 = (table[:, i] for i in range(4))

    # 1. Every (slice, q block) pair the slice's rows touch.
    slice_of, qb = ragged_ranges(q0 // block_q, -(-q1 // block_q))
    row_lo = np.maximum(qb * block_q, q0[slice_of])
    row_hi = np.minimum((qb + 1) * block_q, q1[slice_of])

    # 2. The kv blocks those rows can reach: from the first row's left edge
    # to the last row's right edge (edges move monotonically with the row).
    sub = table[slice_of]
    columns = [sub[:, i] for i in range(5)]
    first_lo, _ = slices_lib.row_edges(*columns, row_lo)
    _, last_hi = slices_lib.row_edges(*columns, row_hi - 1)
    kb_start = np.maximum(first_lo, k0[slice_of]) // block_k
    kb_stop = np.minimum(last_hi, k1[slice_of] - 1) // block_k + 1
    pair_of, kb = ragged_ranges(kb_start, kb_stop)

    # 3. Exact visible counts per (slice, tile), summed over slices per tile.
    tile_rows_lo = row_lo[pair_of]
    tile_rows_hi = row_hi[pair_of]
    counts = slices_lib.visible_counts(
        sub[pair_of],
        tile_rows_lo,
        tile_rows_hi,
        kb * block_k,
        np.minimum((kb + 1) * block_k, seqlen_k),
    )
    qb = qb[pair_of]
    keep = counts > 0
    qb, kb, counts = qb[keep], kb[keep], counts[keep]
    num_k_blocks = -(-seqlen_k // block_k)
    flat = qb * num_k_blocks + kb
    n_tiles = -(-seqlen_q // block_q) * num_k_blocks
    if n_tiles <= _DENSE_TILE_LIMIT:
        per_tile = np.bincount(flat, weights=counts, minlength=n_tiles)
        tile_id = np.flatnonzero(per_tile)
        visible = per_tile[tile_id].astype(np.int64)
    else:
        tile_id, inverse = np.unique(flat, return_inverse=True)
        visible = np.bincount(inverse, weights=counts).astype(np.int64)
    tq = tile_id // num_k_blocks
    tk = tile_id % num_k_blocks
    tile_area = (np.minimum((tq + 1) * block_q, seqlen_q) - tq * block_q) * (
        np.minimum((tk + 1) * block_k, seqlen_k) - tk * block_k
    )
    if np.any(visible > tile_area):
        raise ValueError("slices overlap: a tile has more visible pairs than cells")
    state = np.where(visible == tile_area, FULL, PARTIAL).astype(np.int8)
    return BlockSchedule(block_q, block_k, seqlen_q, seqlen_k, tq, tk, state, visible)

