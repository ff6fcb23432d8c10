"""torch.flex: FlexAttention with a BlockMask built from the mask's slices.

Every family is expressed exactly, in two parts:
- the block tables come from lcab's closed-form block schedule on a
  128 x 128 grid: full tiles -> full_kv_num_blocks / full_kv_indices,
  partial tiles -> kv_num_blocks / kv_indices;
- a mask_mod, exact on every (q, kv) pair (the uncompiled CPU path
  evaluates it everywhere; the compiled kernel only in partial tiles):
  * full slices are rectangles, so they form a boolean grid over the
    segments their edges cut the rows and columns into:
    grid[q_segment[q], kv_segment[kv]];
  * every other slice (causal, inv_causal, bi_causal) gives each of its rows
    one kv interval, exactly its row rule (lcab/masks/slices.py); at most
    ROW_SLOTS of them share a row in any family, stored as (slots, seqlen)
    int32 lo/hi tables: lo[j][q] <= kv <= hi[j][q].
  Lookups indexed by q alone are loop-invariant in the kernel and those by
  kv alone are one row of loads; the only 2-D lookup is the (small, bool)
  segment grid, and only for masks with full slices. (A first design that
  looked up per-tile slice lists with 2-D int32 gathers made triton's
  software pipelining ask for more shared memory than an H100/H200 has:
  "No valid triton configs".)

Nothing S x S is built: tables are O(S + tiles + segments^2); at 128k the
tile tables are 1k x 1k int32. Sequence lengths need not be multiples of 128
(edge tiles are smaller, and the BlockMask carries the exact seq_lengths).

On a GPU, flex_attention runs under torch.compile; each build() resets
Dynamo first, because every case's mask_mod closes over new tensors and
would otherwise pile up recompilations until Dynamo's recompile limit
(torch._dynamo.config.recompile_limit, 8) sends calls to the dense eager
path. A ring case alone compiles once per step and grad mode (a cp-4 ring
up to 8 times), so the limit is raised and hitting it is an error, never a
silent eager fallback. On a CPU it runs uncompiled (dense scores, forward
only: torch has no FlexAttention backward on CPU).

Its ring form (`FlexBackend.ring_kernel`) is flex_attention with return_lse
on each ring step's exact BlockMask.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from lcab.backend import Backend, Support
from lcab.masks import MASK_NAMES, AttnMask
from lcab.masks import schedule as schedule_lib
from lcab.masks import slices as slices_lib
from lcab.workloads import Workload

BLOCK = 128
ROW_SLOTS = 8  # most non-full slices sharing one row (every family has at most 1)
MAX_GRID_CELLS = 1 << 24  # the full-slice segment grid, one byte a cell
MAX_TILES = 1 << 24  # the tile tables cost 4 bytes a tile, several times: 512k tokens
EAGER_DENSE_CELLS = 1 << 28  # uncompiled flex_attention materialises S x S scores
GPU_HEAD_DIMS = (16, 32, 64, 128, 256)  # triton's tl.dot needs >= 16


@dataclasses.dataclass(frozen=True)
class FlexTables:
    """A BlockMask's contents as host arrays, built from a mask's slices.

    Block lists are (num_q_blocks,) counts and (num_q_blocks, num_kv_blocks)
    indices, q-block major. `grid` (None without full slices) is the
    (q segments, kv segments) boolean map of full slices, `q_segment` and
    `kv_segment` each token's segment. `row_lo` / `row_hi` are
    (slots, seqlen_q) int32: the kv interval each row sees through each
    non-full slice (lo > hi where a slot is unused).
    """

    seqlen_q: int
    seqlen_k: int
    block: int
    kv_num_blocks: np.ndarray
    kv_indices: np.ndarray
    full_kv_num_blocks: np.ndarray
    full_kv_indices: np.ndarray
    grid: np.ndarray | None
    q_segment: np.ndarray | None
    kv_segment: np.ndarray | None
    row_lo: np.ndarray
    row_hi: np.ndarray


def _ragged(starts: np.ndarray, stops: np.ndarray):
    """(owner, value) for every value of each range [start, stop)."""
    lengths = np.maximum(stops - starts, 0)
    owner = np.repeat(np.arange(len(starts)), lengths)
    first = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return owner, np.arange(lengths.sum()) - first + starts[owner]


def _block_lists(schedule: schedule_lib.BlockSchedule, state: int):
    """(counts (nq,), indices (nq, nk)) int32 of one tile state, q-block major."""
    nq, nk = schedule.num_q_blocks, schedule.num_k_blocks
    chosen = schedule.state == state
    qb, kb = schedule.q_block[chosen], schedule.k_block[chosen]  # sorted by (qb, kb)
    counts = np.bincount(qb, minlength=nq)
    position = np.arange(len(qb)) - (np.cumsum(counts) - counts)[qb]
    indices = np.zeros((nq, nk), dtype=np.int32)
    indices[qb, position] = kb
    return counts.astype(np.int32), indices


def _visible_slices(mask: AttnMask) -> tuple[np.ndarray, np.ndarray]:
    """(full slices, other slices) of the mask, empty ones dropped."""
    table = mask.slice_table[slices_lib.table_areas(mask.slice_table) > 0]
    full = table[:, slices_lib.KIND] == slices_lib.FULL
    return table[full], table[~full]


def _most_per_row(table: np.ndarray, seqlen_q: int) -> int:
    """The largest number of slices of `table` that share one row."""
    if len(table) == 0:
        return 0
    change = np.zeros(seqlen_q + 1, dtype=np.int64)
    np.add.at(change, table[:, slices_lib.Q0], 1)
    np.add.at(change, table[:, slices_lib.Q1], -1)
    return int(np.cumsum(change).max())


def _segments(edges: np.ndarray, seqlen: int):
    """(bounds, segment of each token) for the cuts `edges` make in [0, seqlen)."""
    bounds = np.unique(np.concatenate([[0, seqlen], edges]))
    segment = np.searchsorted(bounds, np.arange(seqlen), side="right") - 1
    return bounds, segment.astype(np.int32)


def _full_slice_grid(full: np.ndarray, seqlen_q: int, seqlen_k: int):
    """(grid, q_segment, kv_segment) of full slices; every slice covers whole segments."""
    q_bounds, q_segment = _segments(full[:, [slices_lib.Q0, slices_lib.Q1]].ravel(), seqlen_q)
    k_bounds, k_segment = _segments(full[:, [slices_lib.K0, slices_lib.K1]].ravel(), seqlen_k)
    rows = [np.searchsorted(q_bounds, full[:, c]) for c in (slices_lib.Q0, slices_lib.Q1)]
    cols = [np.searchsorted(k_bounds, full[:, c]) for c in (slices_lib.K0, slices_lib.K1)]
    # A 2-D difference array: +1 / -1 at each rectangle's corners, then prefix sums.
    change = np.zeros((len(q_bounds), len(k_bounds)), dtype=np.int32)
    for r, c, sign in ((0, 0, 1), (0, 1, -1), (1, 0, -1), (1, 1, 1)):
        np.add.at(change, (rows[r], cols[c]), sign)
    grid = np.cumsum(np.cumsum(change, axis=0), axis=1)[:-1, :-1] > 0
    return grid, q_segment, k_segment


def _row_intervals(others: np.ndarray, seqlen_q: int):
    """(lo, hi) (slots, seqlen_q) int32: each row's kv interval in each non-full slice."""
    owner, row = _ragged(others[:, slices_lib.Q0], others[:, slices_lib.Q1])
    per_pair = others[owner]
    lo, hi = slices_lib.row_edges(*(per_pair[:, i] for i in range(5)), row)
    lo = np.maximum(lo, per_pair[:, slices_lib.K0])
    hi = np.minimum(hi, per_pair[:, slices_lib.K1] - 1)
    order = np.argsort(row, kind="stable")
    row, lo, hi = row[order], lo[order], hi[order]
    per_row = np.bincount(row, minlength=seqlen_q)
    slot = np.arange(len(row)) - (np.cumsum(per_row) - per_row)[row]
    slots = int(per_row.max(initial=0))
    # Unused slots keep lo = 1 > hi = 0, which no kv satisfies.
    row_lo = np.ones((slots, seqlen_q), dtype=np.int32)
    row_hi = np.zeros((slots, seqlen_q), dtype=np.int32)
    row_lo[slot, row], row_hi[slot, row] = lo, hi
    return row_lo, row_hi


def unsupported_reason(mask: AttnMask) -> str | None:
    """Why the tables cannot be built for `mask` (None: they can)."""
    nq, nk = -(-mask.seqlen_q // BLOCK), -(-mask.seqlen_k // BLOCK)
    if nq * nk > MAX_TILES:
        return f"{nq * nk} tiles of {BLOCK} x {BLOCK} exceed the {MAX_TILES} the tables allow"
    full, others = _visible_slices(mask)
    shared = _most_per_row(others, mask.seqlen_q)
    if shared > ROW_SLOTS:
        return f"{shared} causal-type slices share a row; the mask_mod takes {ROW_SLOTS}"
    q_cuts = len(np.unique(full[:, [slices_lib.Q0, slices_lib.Q1]]))
    k_cuts = len(np.unique(full[:, [slices_lib.K0, slices_lib.K1]]))
    if (q_cuts + 1) * (k_cuts + 1) > MAX_GRID_CELLS:
        return f"full slices cut the grid into more than {MAX_GRID_CELLS} segments"
    return None


def flex_tables(mask: AttnMask, block: int = BLOCK) -> FlexTables:
    """The BlockMask contents of `mask`; O(tiles + slices + rows), never S x S."""
    reason = unsupported_reason(mask)
    if reason:
        raise ValueError(f"no FlexAttention tables for {mask!r}: {reason}")
    schedule = mask.block_schedule(block, block)
    kv_num_blocks, kv_indices = _block_lists(schedule, schedule_lib.PARTIAL)
    full_num_blocks, full_indices = _block_lists(schedule, schedule_lib.FULL)
    full, others = _visible_slices(mask)
    grid = q_segment = kv_segment = None
    if len(full):
        grid, q_segment, kv_segment = _full_slice_grid(full, mask.seqlen_q, mask.seqlen_k)
    row_lo, row_hi = _row_intervals(others, mask.seqlen_q)
    return FlexTables(
        mask.seqlen_q, mask.seqlen_k, block, kv_num_blocks, kv_indices,
        full_num_blocks, full_indices, grid, q_segment, kv_segment, row_lo, row_hi,
    )


def make_mask_mod(tables: FlexTables, device):
    """The exact mask_mod(b, h, q_idx, kv_idx) of `tables`, on `device`."""

    def on_device(array):
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)

    grid = None
    if tables.grid is not None:
        grid, segments_k = on_device(tables.grid.reshape(-1)), tables.grid.shape[1]
        q_segment, kv_segment = on_device(tables.q_segment), on_device(tables.kv_segment)
    intervals = [(on_device(lo), on_device(hi)) for lo, hi in zip(tables.row_lo, tables.row_hi)]

    def mask_mod(b, h, q_idx, kv_idx):
        visible = kv_idx < 0  # nothing, in the broadcast shape
        if grid is not None:
            visible = grid[q_segment[q_idx] * segments_k + kv_segment[kv_idx]]
        for lo, hi in intervals:
            visible = visible | ((kv_idx >= lo[q_idx]) & (kv_idx <= hi[q_idx]))
        return visible

    return mask_mod


def build_block_mask(mask: AttnMask, device, block: int = BLOCK) -> BlockMask:
    """The exact BlockMask of `mask` (one batch and head, broadcast)."""
    tables = flex_tables(mask, block)

    def on_device(array):
        return torch.from_numpy(array).to(device)[None, None]  # (batch, heads, ...)

    return BlockMask.from_kv_blocks(
        on_device(tables.kv_num_blocks),
        on_device(tables.kv_indices),
        on_device(tables.full_kv_num_blocks),
        on_device(tables.full_kv_indices),
        BLOCK_SIZE=(block, block),
        mask_mod=make_mask_mod(tables, device),
        seq_lengths=(mask.seqlen_q, mask.seqlen_k),
    )


# Compiles one case may need: a ring step's BlockMask has a mask_mod of its
# own (a Dynamo guard each), times grad on and off, for up to 8 steps.
RECOMPILE_LIMIT = 64


def compiled_flex_attention():
    """flex_attention under torch.compile, with a fresh Dynamo (see the
    module docstring). Past Dynamo's recompile limit a call would run the
    dense eager path, an order of magnitude slower but still right; so the
    limit is raised to what a case may need, and hitting it raises (the row
    becomes an ERROR that says so) instead of timing that fallback."""
    torch._dynamo.reset()
    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, limit, max(getattr(config, limit), RECOMPILE_LIMIT))
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True
    return torch.compile(flex_attention, dynamic=False)


# torch's own warning on an uncompiled call: on a CPU uncompiled is chosen
# (compiling there is slow and its rows' notes say how they ran).
_UNCOMPILED_WARNING = "flex_attention called without torch.compile"


def eager_flex_attention(*args, **kwargs):
    """flex_attention uncompiled, as a CPU runs it, without the warning that
    asks to compile it (shown once per process, the default CPU sweep's
    first lines otherwise)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_UNCOMPILED_WARNING, category=UserWarning)
        return flex_attention(*args, **kwargs)


class FlexBackend(Backend):
    name = "torch.flex"
    framework = "torch"
    description = "FlexAttention, BlockMask from the slice block schedule + exact mask_mod"
    layout = "bhsd"
    requires = ("torch.nn.attention.flex_attention",)
    # 6 blocks of 128, the last one ragged: the probe exercises block tables,
    # partial tiles and an edge that is not a multiple of the block size.
    probe_seqlen = 700
    claimed_masks = frozenset(MASK_NAMES)

    def __init__(self):
        self.on_gpu = torch.cuda.is_available()
        # torch raises for a FlexAttention backward on CPU; say so up front.
        self.directions = ("fwd", "bwd") if self.on_gpu else ("fwd",)
        if not self.on_gpu:
            self.directions_problem = ("torch runs FlexAttention's backward on a GPU only "
                                       "(it raises on a CPU)")
        self.head_dims = GPU_HEAD_DIMS if self.on_gpu else None

    @classmethod
    def environment_problem(cls) -> str | None:
        if torch.cuda.is_available():
            try:
                import triton  # noqa: F401 - torch.compile's GPU code generator
            except ImportError as exc:
                return f"flex_attention under torch.compile on a GPU needs triton: {exc}"
        return None

    def mask_support(self, workload: Workload) -> Support:
        reason = unsupported_reason(workload.mask)
        if reason:
            return Support.no(reason)
        cells = workload.seqlen_q * workload.seqlen_k
        if not self.on_gpu and cells > EAGER_DENSE_CELLS:
            return Support.no(
                f"uncompiled flex_attention (CPU) materialises {workload.seqlen_q} x "
                f"{workload.seqlen_k} scores, more than {EAGER_DENSE_CELLS} cells"
            )
        parts = [f"BlockMask from the {BLOCK}x{BLOCK} slice schedule + exact slice mask_mod"]
        parts.append(
            "torch.compile" if self.on_gpu
            else "uncompiled flex_attention (CPU: dense scores, no backward)"
        )
        if workload.heads_q != workload.heads_kv:
            parts.append("enable_gqa")
        return Support.yes("; ".join(parts))

    def build(self, workload: Workload):
        block_mask = build_block_mask(workload.mask, _device(self.on_gpu))
        attention = compiled_flex_attention() if self.on_gpu else eager_flex_attention
        enable_gqa = workload.heads_q != workload.heads_kv

        def attend(q, k, v):
            return attention(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)

        return attend

    def ring_kernel(self) -> "FlexRingKernel":
        return FlexRingKernel(self.on_gpu)


def _device(on_gpu: bool) -> str:
    return "cuda" if on_gpu else "cpu"


class FlexRingKernel:
    """torch.flex's ring form (torch_backends.cp.ring.RingKernel):
    flex_attention with return_lse on each step's exact BlockMask, whose
    limits FlexBackend.supports() already states for each step."""

    def __init__(self, on_gpu: bool):
        self.on_gpu = on_gpu
        self.how = "FlexAttention with return_lse, " + (
            "torch.compile" if on_gpu else "uncompiled")

    @functools.cached_property
    def attention(self):
        # Compiled on first use, once for every step of a build (compiling
        # resets Dynamo), never when a ring only asks what it supports.
        return compiled_flex_attention() if self.on_gpu else eager_flex_attention

    def refusal(self, mask: AttnMask) -> str | None:
        return None

    def step(self, mask: AttnMask, gqa_ratio: int):
        block_mask = build_block_mask(mask, _device(self.on_gpu))
        attention = self.attention
        return lambda q, k, v: attention(q, k, v, block_mask=block_mask,
                                         enable_gqa=gqa_ratio > 1, return_lse=True)
