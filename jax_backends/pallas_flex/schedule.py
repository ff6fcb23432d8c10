"""How jax.pallas_flex's programs are launched: the Mosaic forward's grid
and the order of its rows, the split of each K/V head's dK/dV block over
its query heads (head_split) and the dK/dV launch order. Host arithmetic
on a plan's Geometry, without JAX, so that the registry's record of which
rows a change moves (changed_rows.py) can ask it too.
"""

from __future__ import annotations

import math

from jax_backends.pallas_flex.plan import Geometry

# The Mosaic forward's grid: one program per item (q block, head, batch),
# one per SM walking items in turn (mosaic_fwd_sm90.Config.persistent), or
# "auto".
FORWARD_GRIDS = ("auto", "per_item", "persistent")
# "auto" runs the persistent grid where a forward program would walk at most
# this many keys on average: measured (64:8, d=128, one H200, v23 in
# docs/pallas_flex.md) +2 to +28 % forward on every mask up to 16k keys a
# program and on windows and documents at 32k; -1.1 to -1.2 % on full (32k
# keys a program) and causal (16,448 on average) at 32k.
PERSISTENT_ROW_KEYS = 16384
# The order the Mosaic forward's rows (q block, head) start in, or "auto".
ROWS_LAUNCHES = ("auto", "heads_together", "head_major")
# "auto" starts them head after head where a program walks at least this
# many keys on average: the running programs then share one or two K/V heads
# in L2 where every head's K/V would not fit (a head is 8 MiB at 16k, 64:8,
# d=128, bf16). Measured (one H200, 2026-12-04, two rounds, v25 in
# docs/pallas_flex.md): +1.7 to +4.8 % forward on full at 16k-64k and +0.6
# to +1.8 % on causal at 32k-64k; -0.1 to -5.3 % on the shorter rows of
# causal at 16k, windows and documents (one cell +0.5 % in one round),
# where heads together keeps the heaviest rows first.
HEAD_MAJOR_ROW_KEYS = 16384
# The Mosaic forward's key block where a row sets none: 192 keys a step
# (mosaic_fwd_sm90.WIDE_BLOCK_K) where a program walks more than this many
# keys on average at 128 (so the persistent grid, which 192 cannot take,
# would not run anyway) and head_dim is 128 (the one measured), else 128.
# Measured (one H200, 2026-12-05, three rounds, v26 in docs/pallas_flex.md):
# +3.5 to +5.1 % forward on full at 24k-64k and +1.3 to +2.7 % on causal at
# 32k-64k; -6 to -41 % on documents and windows (short rows, persistent at
# 128), where ptxas's 844 bytes of spills a thread fall on partial tiles.
WIDE_ROW_KEYS = PERSISTENT_ROW_KEYS
# ... and where at most this share of the tiles it visits is cut by the
# mask: a cut tile at 192 keys costs its spills and its wider waste. The
# paper's longca_global_window at 32k-40k (2.3-2.8 % of its tiles cut, rows
# of 17-22k keys) lost 1.2-2.5 % at 192 (one round, one H200, 2026-12-05)
# and 1.8-5.4 % at 40k (two rounds, one H100); full_document (1.8 %) and
# causal_blockwise (1.3 %) at 40k neither gained nor lost beyond the rounds'
# spread; causal's diagonal (0.4-0.8 % cut) and prefix_lm_causal's
# (0.4-0.5 %) gained 1.3-5.2 % (docs/pallas_flex.md, v26).
WIDE_MAX_CUT_SHARE = 0.01
DKV_LAUNCHES = ("auto", "head_major", "heads_together")
# dK/dV programs a K/V head's block (head_split): one, a number of them
# (at most the group; else its largest divisor in common), or "auto".
DKV_SPLITS = ("1", "2", "4", "8", "auto")
# SMs of an H100 or H200: the Mosaic dK/dV kernel's registers and shared
# memory fill an SM, so this many of its programs run at once.
_SMS = 132
# "auto" takes a larger split only where its estimated pass is this much
# shorter (more programs cost their loads, stores and the shares' sum).
_SPLIT_GAIN = 0.95
# Programs that run at once: two 4-warp dK/dV programs per SM of an H100's
# 132 (an estimate; only the launch choice depends on it).
_CONCURRENT_PROGRAMS = 264
# dK/dV launches every head of a block together where its heaviest program,
# started last, would outrun the others by more than this share of the pass
# (the measurements behind it: docs/pallas_flex.md, "dK/dV launch order").
_TAIL_LIMIT = 0.15


def forward_grid(plan: Geometry, asked: str, persistent_fits: bool) -> str:
    """The Mosaic forward's grid: as asked, or with "auto" "persistent"
    where it fits (shared memory: mosaic_fwd_sm90.problem) and the plan's
    programs walk at most PERSISTENT_ROW_KEYS keys on average. A persistent
    program pays its start, first loads and epilogue's wait once for all
    its items, which counts where items are short; on long items it has
    measured about 1 % slower (unexplained: the deal of items is even)."""
    if asked != "auto":
        return asked
    short = plan.row_keys <= PERSISTENT_ROW_KEYS
    return "persistent" if persistent_fits and short else "per_item"


def forward_key_block(plan: Geometry, head_dim: int, wide: int) -> int:
    """The Mosaic forward's key block where none is set, from the plan at
    its default (128-key) blocks: `wide` where its programs walk more than
    WIDE_ROW_KEYS keys on average, at most WIDE_MAX_CUT_SHARE of its tiles
    are cut and head_dim is 128, else the plan's own."""
    long_rows = plan.row_keys > WIDE_ROW_KEYS
    whole_tiles = plan.cut_share <= WIDE_MAX_CUT_SHARE
    return wide if long_rows and whole_tiles and head_dim == 128 else plan.block_k


def rows_launch(plan: Geometry, asked: str) -> str:
    """The Mosaic forward's rows order: as asked, or with "auto" head after
    head where the plan's programs walk at least HEAD_MAJOR_ROW_KEYS keys
    on average, every head of a q block together elsewhere."""
    if asked != "auto":
        return asked
    return "head_major" if plan.row_keys >= HEAD_MAJOR_ROW_KEYS else "heads_together"


def dkv_schedule(plan: Geometry, programs_per_block: int, group: int, launch: str,
                 split: str, mosaic: bool) -> tuple[str, int]:
    """The dK/dV launch order and split the backward takes for the asked
    `launch` (DKV_LAUNCHES) and `split` (DKV_SPLITS): the split first,
    since it multiplies the programs a block launches. programs_per_block:
    K/V heads x batch; group: query heads a K/V head; mosaic: the backward
    runs the Mosaic kernels."""
    chosen = dkv_split(plan, programs_per_block, group, split, mosaic)
    return dkv_launch(plan, programs_per_block * chosen, launch), chosen


def dkv_split(plan: Geometry, programs_per_block: int, group: int, asked: str,
              mosaic: bool) -> int:
    """How many dK/dV programs each K/V head's block takes: as asked (the
    largest divisor of the group it shares), or with "auto" on the Mosaic
    backward the power of two dividing the group whose pass is estimated
    shortest. A pass lasts at least its waves of average programs
    (programs over _SMS, rounded up) and at least its heaviest program (the
    plan's dkv_tail gives heaviest / average), each 1/split of the unsplit
    program's work; a short sequence has too few programs to fill the
    SMs, a causal one a heaviest program far past the average. The Triton
    backward (other GPUs, a CPU) takes 1 under "auto": its split is
    unmeasured, and its programs do not fill an SM each."""
    if asked != "auto":
        return math.gcd(int(asked), group)
    if not mosaic:
        return 1
    programs = plan.num_k_blocks * programs_per_block
    heaviest = 1 + plan.dkv_tail * plan.num_k_blocks  # over the average program

    def estimate(split):  # in unsplit average programs' time
        return max(math.ceil(programs * split / _SMS), heaviest) / split

    best = 1
    for split in (2, 4, 8):
        if group % split == 0 and estimate(split) < _SPLIT_GAIN * estimate(best):
            best = split
    return best


def dkv_launch(plan: Geometry, programs_per_block: int, asked: str) -> str:
    """The dK/dV launch order the backward takes: as asked, or with "auto",
    every head of a block together where the heaviest program's excess run
    beats the pass's share of work per running program (all equal:
    never). programs_per_block: K/V heads x batch (x split)."""
    if asked != "auto":
        return asked
    together = plan.dkv_tail * _CONCURRENT_PROGRAMS / programs_per_block > _TAIL_LIMIT
    return "heads_together" if together else "head_major"
