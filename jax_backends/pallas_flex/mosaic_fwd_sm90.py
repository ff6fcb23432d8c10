"""jax.pallas_flex's forward through Pallas's Mosaic GPU lowering (Hopper).

The same FlexPlan walk as the Triton forward (triton.py), written the way
FA3 runs on Hopper: per program three warpgroups, two computing (64 rows
of the 128-row q block each, wgmma from shared memory) and one moving K/V
tiles with TMA into a ring of `stages` shared-memory slots, handing them
over through barriers. The two compute warpgroups take turns on the tensor
cores, so one's softmax overlaps the other's matmuls, as FA3 and tokamax
do: two hardware named barriers, a warpgroup handing the tensor cores over
(bar.arrive) once its scores' matmul is issued and waiting (bar.sync) only
before its P @ V. (An mbarrier both met at twice a tile was 0.8-3.7 %
slower: docs/pallas_flex.md, v10.) The memory warpgroup follows the
program's plan row: its full runs, then its partial tiles; the compute
warpgroups walk the same row and mask the partial tiles' scores by the
union of their slices.

The backward is mosaic_bwd_sm90's; both walk the plan through
mosaic_walk (fold_visits, masked, the K/V feeder). Needs bf16 or f16,
head_dim a multiple of 64 (at most 256) and a plan of 128-row q blocks
and 64-, 128- or (at head_dim 128 and below) 192-column kv blocks
(`problem` says what does not fit).
It has no CPU path: Mosaic GPU's interpret mode (jax 0.10.2) lacks
layout_cast and run_state and, with those patched out, hangs on this
warp-specialised pattern (JAX's own attention_mgpu as well); on a CPU the
tests lower it to Mosaic GPU's MLIR instead, and on a GPU the harness
checks it against the reference before it is timed.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import llvm

from jax_backends.pallas_flex.mosaic_walk import (
    COMPUTE_WARPGROUPS,
    ROWS_PER_WARPGROUP,
    accumulate,
    feed_row,
    fold_visits,
    launch_grid,
    masked,
    slice_bounds,
    visit_count,
)
from jax_backends.pallas_flex.plan import Geometry

_LOG2E = math.log2(math.e)
BLOCK_Q = ROWS_PER_WARPGROUP * COMPUTE_WARPGROUPS
SM90 = (9, 0)  # wgmma and TMA as lowered here: Hopper
# The forward's partial-tile test (mosaic_walk.MASK_TESTS): one unsigned
# compare an element, 3-5 % faster on windows and documents (v12).
FORWARD_MASK_TEST = "offset"
# Named barriers of the turns, one per compute warpgroup: Mosaic GPU takes
# barrier 0 and one per warpgroup (1-3) for itself.
_TURN_BARRIER = 4


# What a Hopper SM's shared memory holds for one program (227 KiB).
SMEM_BYTES = 232448
# Pallas lays each scratch buffer out on this boundary (Mosaic GPU's
# SMEM_ALIGNMENT) and adds 8 bytes an mbarrier.
SMEM_ALIGNMENT = 1024
_MBARRIER_BYTES = 8
# What Mosaic GPU adds to the forward's own buffers (the softmax's row
# reductions across threads, by its lowering's count on a CPU; the dQ
# kernel, which reduces nothing, has none).
_REDUCTION_SCRATCH = 2048
# The widest key block the Mosaic forward takes (v26, option block_k): a
# step of 192 keys spreads each step's fixed work (row max and sum, the
# output's rescale, the warpgroups' turn) over 1.5x the keys. Its K and V
# ring (2 x 2 x 48 KiB) and Q leave no room for the persistent grid's own
# output tile, so it runs one program per item, at head_dim 128 and below.
# (FA3 steps 176 keys on masks that are neither causal nor local; wgmma
# under the 128-byte swizzle takes K in groups of 64, so 176 cannot be.)
WIDE_BLOCK_K = 192


def _reduction_scratch(block_k: int) -> int:
    """Mosaic GPU reserves shared memory for reductions across warps in any
    kernel that reduces; the softmax's row max and sum reduce within a warp
    (a WGMMA row lives in one warp's four threads), so the reserve is never
    read. A 192-key ring needs those 2 KiB (its buffers and mbarriers take
    230,480 of 232,448 bytes), so it asks for none; the 128-key default
    keeps Mosaic's reserve (its IR unchanged). A reduction that did need
    it would not run wrong: Mosaic's lowering refuses it ("required
    reduction scratch size ... larger than the available"), which the
    lowering tests would show."""
    return 0 if block_k == WIDE_BLOCK_K else _REDUCTION_SCRATCH


def scratch_bytes(buffers, barriers: int) -> int:
    """Shared memory a kernel asks for: its buffers' bytes, each rounded up
    to SMEM_ALIGNMENT, and its mbarriers."""
    return (sum(-(-size // SMEM_ALIGNMENT) * SMEM_ALIGNMENT for size in buffers)
            + _MBARRIER_BYTES * barriers)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """The Mosaic forward's settings.

    persistent (v23; ops.Lowering.forward_grid sets it): one program per SM
    (`programs`, else the GPU's count), each taking items (q block, head,
    batch) in turn (WorkItems). A compute warpgroup loads its next item's Q
    as soon as its last scores of this one have read the tile, and the
    memory warpgroup runs on into the next item's K/V as ring slots free,
    so short rows (at 1k-4k a program walks at most 8-32 K/V tiles) pay
    the start, the first loads and the epilogue's wait once a program
    rather than once an item. The turns run on across a program's items
    as one chain. Q loads stay with the compute warpgroups: a memory
    warpgroup loading them in item order would deadlock on an item with
    no tiles (a CP rank's sub-mask has them), whose Q the warpgroup still
    waiting its turn for the item before could not release."""

    stages: int = 2  # shared-memory slots of the K/V ring
    persistent: bool = False
    programs: int | None = None
    # v33 (option forward_overlap=intra, unmeasured): FA3's overlap inside a
    # warpgroup; a turn issues tile j's scores and tile j-1's P @ V
    # together and the softmax of tile j runs while P @ V does (_Overlap).
    overlap: bool = False
    # (compute, memory) registers a thread after setmaxnreg (option
    # forward_registers): every row so far ran 232 / 40; FA3's forward takes
    # 240 / 24 with two compute warpgroups, and v33's overlap holds two P
    # tiles at once (about 256 live at 192 keys), so the 8 more may spare
    # it spills. Unmeasured.
    registers: tuple[int, int] = (232, 40)

    def __post_init__(self):
        if self.stages < 2:
            raise ValueError(f"stages={self.stages}: the K/V ring needs 2 or more")
        if self.registers not in REGISTER_SPLITS.values():
            raise ValueError(f"registers={self.registers}: choose one of "
                             f"{', '.join(map(str, REGISTER_SPLITS.values()))}")
        if self.programs is not None and self.programs < 1:
            raise ValueError(f"programs={self.programs}: a persistent grid needs 1 or more")


OVERLAPS = ("none", "intra")  # the backend's forward_overlap choices (Config.overlap)
# The backend's forward_registers choices: the compute warpgroups' count,
# and (Config.registers) with the memory warpgroup's; a thread's three
# warpgroups share 65,536 registers (2 x 240 + 24 = 504 of 512 per lane).
REGISTER_SPLITS = {"232": (232, 40), "240": (240, 24)}


def problem(block_q: int, block_k: int, dtype, head_dim: int,
            config: Config = Config()) -> str | None:
    """Why this forward cannot run these inputs; None if it can."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"the Mosaic forward takes bf16 or f16 (wgmma), not {jnp.dtype(dtype).name}"
    if head_dim % 64 or head_dim > 256:
        return f"the Mosaic forward takes head_dim 64, 128, 192 or 256, not {head_dim}"
    if block_q != BLOCK_Q:
        return f"the Mosaic forward needs block_q={BLOCK_Q} (two warpgroups of 64 rows)"
    if block_k not in (64, 128, WIDE_BLOCK_K) or (head_dim > 128 and block_k != 64):
        return (f"the Mosaic forward needs block_k 64, 128 or {WIDE_BLOCK_K} (64 above "
                "head_dim 128: shared memory)")
    if config.persistent and (needed := shared_memory(block_k, dtype, head_dim, config)) > \
            SMEM_BYTES:
        return (f"the persistent Mosaic forward needs {needed} bytes of shared memory at "
                f"head_dim {head_dim} (its own Q and output tiles), {SMEM_BYTES} fit")
    return None


def shared_memory(block_k: int, dtype, head_dim: int, config: Config) -> int:
    """Bytes of the forward's scratch (scratch_bytes): Q (staging the output
    too, unless persistent, which stages it apart: the next Q loads
    meanwhile), the K and V rings, the lse rows and the barriers (K, V and
    Q loads; K and V slots consumed)."""
    itemsize = jnp.dtype(dtype).itemsize
    rows = ROWS_PER_WARPGROUP * COMPUTE_WARPGROUPS
    tile = rows * head_dim * itemsize
    ring = config.stages * block_k * head_dim * itemsize
    buffers = (tile, ring, ring, rows * 4, *((tile,) if config.persistent else ()),
               _reduction_scratch(block_k))
    return scratch_bytes(buffers, 4 * config.stages + COMPUTE_WARPGROUPS)


def streaming_multiprocessors() -> int:
    """The GPU's SM count (a persistent grid's programs); a Hopper card's
    132 where JAX does not say (a CPU lowering for a GPU)."""
    device = jax.devices()[0]
    count = getattr(device, "core_count", None) if device.platform == "gpu" else None
    return int(count or 132)


def forward(q, k, v, geometry: Geometry, tables, config: Config = Config(),
            heads_together: bool = True):
    """(out, lse2) of q against k, v over the plan's "by_q" walk; the inputs
    are padded to the plan's blocks (ops._forward_padded), lse2 is
    (batch, heads, padded_q) float32 in base 2, -inf on rows that see
    nothing (their out is 0). heads_together: the launch order
    (launch_grid); config.persistent: one program per SM (Config)."""
    stages, persistent = config.stages, config.persistent
    batch, seq_q, heads, head_dim = q.shape
    group = heads // k.shape[2]
    block_k = geometry.block_k
    rows = ROWS_PER_WARPGROUP
    dtype = q.dtype
    qk_scale = _LOG2E / math.sqrt(head_dim)
    walk = [*tables["by_q"], tables["slice_ids"], tables["slices"]]
    q_blocks = geometry.num_q_blocks
    sms = (config.programs or streaming_multiprocessors()) if persistent else None
    items = WorkItems(q_blocks, heads, batch, heads_together, sms)

    def kernel(*refs):
        *walk_refs, ids, slices, q_ref, k_ref, v_ref, out_ref, lse_ref, scoped = refs
        lo, hi, order = walk_refs[4], walk_refs[5], walk_refs[7]
        (q_smem2, k_smem, v_smem, lse_smem2, *staging), loaded, consumed = scoped
        o_smem2 = staging[0] if persistent else q_smem2  # the default stages out over Q
        k_loaded, v_loaded, q_loaded = loaded
        k_consumed, v_consumed = consumed
        wg = lax.axis_index("wg")

        where = functools.partial(items.locate, order)

        def slot_of(step):
            return lax.rem(step, jnp.int32(stages))

        turns = _Turns(wg)

        @pl.when(wg < COMPUTE_WARPGROUPS)
        def _compute():
            plgpu.set_max_registers(config.registers[0], action="increase")
            q_smem, o_smem, lse_smem = q_smem2.at[wg], o_smem2.at[wg], lse_smem2.at[wg]

            def load_q(row0, head, b):  # this warpgroup's Q rows of an item, by TMA
                plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(row0, rows), head], q_smem,
                                        q_loaded.at[wg])

            def load_q_of(item):
                qi, head, b = where(item)
                load_q(qi * BLOCK_Q + wg * rows, head, b)

            def load_next_q(n):  # persistent: once item n's scores have read its Q
                items.after(n, load_q_of)

            def one_item(n, item, step0):
                qi, head, b = where(item)
                row0 = qi * BLOCK_Q + wg * rows
                visits = visit_count(walk_refs, qi)
                # the step after its last visit
                end = step0 + visits if persistent else visits
                if not persistent:  # persistent: loaded once the previous item's scores read Q
                    load_q(row0, head, b)
                plgpu.barrier_wait(q_loaded.at[wg])
                acc = plgpu.layout_cast(jnp.zeros((rows, head_dim), jnp.float32),
                                        plgpu.Layout.WGMMA)
                m = plgpu.layout_cast(jnp.full((rows,), -jnp.inf, jnp.float32),
                                      plgpu.Layout.WGMMA.reduce(1))
                l = plgpu.layout_cast(jnp.zeros((rows,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))

                if not config.overlap:  # v33 waits for each visit's K tile in the visit
                    @pl.when(visits > 0)
                    def _():
                        plgpu.barrier_wait(k_loaded.at[slot_of(step0) if persistent else 0])

                if persistent:  # an item that sees nothing is done with its Q at once
                    pl.when(visits == 0)(lambda: load_next_q(n))
                else:  # a persistent program's turns run on across its items
                    turns.start()

                def scores_read(slot, step):  # after a tile's scores: its K slot, the next Q
                    plgpu.barrier_arrive(k_consumed.at[slot])
                    if persistent:  # the item's last scores have read Q: load the next
                        pl.when(step + 1 == end)(lambda: load_next_q(n))

                def tile_softmax(s, j, first, kb, m):
                    """A tile's scores (partial tiles masked) against the running
                    max m: (m_next, alpha, P in float32)."""
                    if j is not None:
                        s = masked(s, first, ids, slices, lo[qi, j], hi[qi, j], row0,
                                   kb * block_k, test=FORWARD_MASK_TEST)
                    m_next = jnp.maximum(m, s.max(axis=1) * qk_scale)
                    # Rows that have seen nothing yet only meet partial tiles.
                    m_safe = m_next if j is None else jnp.where(m_next == -jnp.inf, 0.0, m_next)
                    alpha = jnp.exp2(m - m_safe)
                    p = jnp.exp2(s * qk_scale - lax.broadcast_in_dim(m_safe, s.shape, [0]))
                    return m_next, alpha, p

                def softmax(s, j, first, kb, m, l):
                    """v33's: (m_next, alpha, P in the input dtype, l rescaled
                    and summed)."""
                    m_next, alpha, p = tile_softmax(s, j, first, kb, m)
                    return m_next, alpha, p.astype(dtype), l * alpha + p.sum(axis=1)

                def visit(step, kb, j, carry):
                    acc, m, l = carry
                    slot = slot_of(step)

                    # A partial tile's first slice, loaded before the matmul.
                    first = None if j is None else slice_bounds(ids, slices, lo[qi, j])

                    def scores(acc_ref):
                        plgpu.wgmma(acc_ref, q_smem,
                                    plgpu.transpose_ref(k_smem.at[slot], (1, 0)))
                        turns.scores_issued()
                        return acc_ref[...]

                    s = pl.run_scoped(scores, plgpu.ACC((rows, block_k), jnp.float32))
                    scores_read(slot, step)
                    m_next, alpha, p = tile_softmax(s, j, first, kb, m)
                    acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
                    l = l * alpha
                    p16 = p.astype(dtype)
                    if head_dim <= 128:  # FA3's order for small heads (measured in JAX's kernel)
                        l = l + p.sum(axis=1)
                        acc, l, m_next, p16 = lax.optimization_barrier((acc, l, m_next, p16))
                    turns.before_values(v_loaded.at[slot])
                    if head_dim > 128:
                        l = l + p.sum(axis=1)
                    acc = accumulate(acc, p16, v_smem.at[slot],
                                     lambda: _wait_next(step, end, k_loaded, slot_of))
                    plgpu.barrier_arrive(v_consumed.at[slot])
                    return acc, m_next, l

                if config.overlap:
                    overlapped = _Overlap(
                        q_smem=q_smem, k_smem=k_smem, v_smem=v_smem, k_loaded=k_loaded,
                        v_loaded=v_loaded, k_consumed=k_consumed, v_consumed=v_consumed,
                        turns=turns, slot_of=slot_of, first_step=step0, softmax=softmax,
                        scores_read=scores_read)

                    def visit_overlapped(step, kb, j, carry):
                        first = None if j is None else slice_bounds(ids, slices, lo[qi, j])
                        return overlapped.visit(step, kb, j, first, carry)

                    p_none = plgpu.layout_cast(jnp.zeros((rows, block_k), dtype),
                                               plgpu.Layout.WGMMA)
                    step, carry = fold_visits(walk_refs, qi, visit_overlapped,
                                              (step0, (acc, m, l, p_none)))
                    acc, m, l = overlapped.last_values(visits > 0, step, carry)
                else:
                    step, (acc, m, l) = fold_visits(walk_refs, qi, visit, (step0, (acc, m, l)))
                if not persistent:
                    turns.finish()
                seen = l > 0
                l_safe = jnp.where(seen, l, 1.0)
                acc = acc / lax.broadcast_in_dim(l_safe, acc.shape, [0])
                if persistent:  # the last item's out and lse have left the staging tiles
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                o_smem[...] = acc.astype(dtype)
                lse_smem[...] = jnp.where(seen, m + jnp.log2(l_safe), -jnp.inf)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(o_smem, out_ref.at[b, pl.ds(row0, rows), head])
                plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[b, head, pl.ds(row0, rows)])
                return step

            if persistent:
                load_q_of(items.item(lax.axis_index("program"), jnp.int32(0)))
                turns.start()
                items.each(one_item)
                turns.finish()
            else:
                one_item(None, None, jnp.int32(0))
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == COMPUTE_WARPGROUPS)
        def _memory():
            plgpu.set_max_registers(config.registers[1], action="decrease")
            kv = ((k_ref, k_smem, k_loaded, k_consumed), (v_ref, v_smem, v_loaded, v_consumed))

            def feed_item(n, item, step):
                qi, head, b = where(item)
                return feed_row(walk_refs, qi, (b, lax.div(head, jnp.int32(group))), block_k,
                                stages, kv, step)

            if persistent:
                items.each(feed_item)
            else:
                feed_item(None, None, jnp.int32(0))

    def entry(*refs):
        transforms = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
        own = plgpu.SMEM((COMPUTE_WARPGROUPS, rows, head_dim), dtype, transforms=transforms)
        scratch = [
            own,
            plgpu.SMEM((stages, block_k, head_dim), dtype, transforms=transforms),
            plgpu.SMEM((stages, block_k, head_dim), dtype, transforms=transforms),
            plgpu.SMEM((COMPUTE_WARPGROUPS, rows), jnp.float32),
            *([own] if persistent else []),  # the output's staging, apart from Q
        ]
        pl.run_scoped(
            lambda *scoped: kernel(*refs, scoped),
            scratch,
            (plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=stages),
             plgpu.Barrier(num_barriers=COMPUTE_WARPGROUPS)),
            (plgpu.Barrier(num_arrivals=COMPUTE_WARPGROUPS, num_barriers=stages),) * 2,
            collective_axes="wg",
        )

    if persistent:
        grid, grid_names = (items.programs,), ("program",)
    else:
        grid, grid_names = launch_grid(("q_seq", q_blocks), ("heads", heads), batch,
                                       heads_together)
    call = plgpu.kernel(
        entry,
        out_type=[jax.ShapeDtypeStruct(q.shape, dtype),
                  jax.ShapeDtypeStruct((batch, heads, seq_q), jnp.float32)],
        grid=grid,
        grid_names=grid_names,
        num_threads=COMPUTE_WARPGROUPS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True,
                                             reduction_scratch_bytes=_reduction_scratch(block_k)),
        kernel_name="lcab_flex_forward_persistent" if persistent else "lcab_flex_forward_mosaic",
    )
    return call(*walk, q, k, v)


@dataclasses.dataclass(frozen=True)
class WorkItems:
    """A forward's work items, one per (q block position, head, batch), in
    the launch order launch_grid gives one program each (the walk's q
    blocks heaviest first). A persistent grid (`sms` set) deals them out in
    rounds of `programs`, in a snake: program p takes item p of the first
    round, the p-th from the end of the second, and so on, so a program
    that drew a heavy item early draws a light one next. On the seed masks
    at 1k-4k (64 heads, 132 programs) its longest program is estimated at
    1.00-1.08x the mean where a plain stride (p, p + programs, ...) gives
    1.03-1.12x and a greedy dispatch of one program per item 1.01-1.08x
    (experiments/lab/forward_deal.py)."""

    q_blocks: int
    heads: int
    batch: int
    heads_together: bool
    sms: int | None

    @property
    def count(self) -> int:
        return self.q_blocks * self.heads * self.batch

    @property
    def programs(self) -> int:
        return min(self.count, self.sms)

    def where(self, item):
        """(q block position in the walk's order, head, batch) of `item`."""
        inner, outer = ((self.heads, self.q_blocks) if self.heads_together
                        else (self.q_blocks, self.heads))
        fast, slow = lax.rem(item, inner), lax.rem(lax.div(item, inner), outer)
        position, head = (slow, fast) if self.heads_together else (fast, slow)
        return position, head, lax.div(item, inner * outer)

    def locate(self, order, item):
        """Item `item`'s (q block, head, batch), its q block by the walk's
        launch `order` (None: the program's own, one program per item)."""
        if item is None:
            return (order[lax.axis_index("q_seq")], lax.axis_index("heads"),
                    lax.axis_index("batch"))
        position, head, b = self.where(item)
        return order[position], head, b

    def after(self, n, body):
        """body(item) of this program's item after its n-th, if it has one
        (a persistent kernel's early loads for it)."""
        program = lax.axis_index("program")
        pl.when(n + 1 < self.share(program))(lambda: body(self.item(program, n + 1)))

    def item(self, program, n):
        """Program `program`'s n-th item (round n of the snake)."""
        reverse = lax.rem(n, 2) == 1
        return n * self.programs + jnp.where(reverse, self.programs - 1 - program, program)

    def share(self, program):
        """How many items program `program` takes: every full round, and
        the last, partial one where its place in it holds an item."""
        rounds, left = divmod(self.count, self.programs)
        place = program if rounds % 2 == 0 else self.programs - 1 - program
        return rounds + (place < left).astype(jnp.int32)

    def each(self, body):
        """body(n, item, step) -> step over this program's items, its n-th
        item `item`; step counts K/V tiles and runs on across items (the
        ring's slots)."""
        program = lax.axis_index("program")
        lax.fori_loop(0, self.share(program),
                      lambda n, step: body(n, self.item(program, n), step), jnp.int32(0))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Overlap:
    """v33: FA3's overlap inside a compute warpgroup (its IntraWGOverlap,
    on at head_dim 128 on every mask). A visit's turn on the tensor cores
    issues tile j's scores and then tile j-1's P @ V; the warpgroup waits
    for the scores alone (wgmma groups complete in order), runs tile j's
    mask and softmax while P @ V runs, then waits for it and rescales the
    output by tile j's alpha. The carry is (acc, m, l, P of the last
    visit): acc and that P are both relative to m, so acc + P V scaled by
    alpha is the output relative to the new max. An item's first visit
    issues its scores alone; after its last, `last_values` takes one more
    turn for the last P @ V. Each warpgroup syncs and arrives at the turn
    barriers as often as without the overlap: a visit's one turn covers
    [S_j, PV_(j-1)], the last P @ V's turn runs on into the next item's
    first scores (or the end's hand-over, _Turns.finish)."""

    q_smem: object
    k_smem: object
    v_smem: object
    k_loaded: object
    v_loaded: object
    k_consumed: object
    v_consumed: object
    turns: _Turns
    slot_of: object
    first_step: object  # the item's first step (its first visit's)
    softmax: object  # (s, j, first, kb, m, l) -> (m_next, alpha, p, l)
    scores_read: object  # (slot, step): release K's slot (and load the next Q)

    def _scores(self, slot, s_ref):
        plgpu.wgmma(s_ref, self.q_smem, plgpu.transpose_ref(self.k_smem.at[slot], (1, 0)))

    def visit(self, step, kb, j, first, carry):
        slot = self.slot_of(step)
        plgpu.barrier_wait(self.k_loaded.at[slot])

        def opening(carry):  # the item's first tile: its scores alone
            acc, m, l, _ = carry

            def scores(s_ref):
                self._scores(slot, s_ref)
                self.turns.scores_issued()
                return s_ref[...]

            s = pl.run_scoped(scores, plgpu.ACC(s_shape, jnp.float32))
            self.scores_read(slot, step)
            m_next, _, p, l = self.softmax(s, j, first, kb, m, l)
            return acc, m_next, l, p  # acc is still zero

        def overlapped(carry):  # tile j's scores and softmax under tile j-1's P @ V
            acc, m, l, p_last = carry
            last = self.slot_of(step - 1)
            self.turns.before_values(self.v_loaded.at[last])

            def both(refs):
                acc_ref, m_ref, l_ref, p_ref, alpha_ref = refs

                def issue(s_ref):
                    self._scores(slot, s_ref)
                    plgpu.wgmma(acc_ref, p_ref[...], self.v_smem.at[last])
                    self.turns.scores_issued()
                    return plgpu.wgmma_accumulator_load(s_ref, wait_n=1)

                s = pl.run_scoped(issue, plgpu.ACC(s_shape, jnp.float32))
                self.scores_read(slot, step)
                m_ref[...], alpha_ref[...], p_ref[...], l_ref[...] = self.softmax(
                    s, j, first, kb, m, l)

            # run_state's exit waits for P @ V; the softmax ran before it.
            acc, m_next, l, p, alpha = pl.run_state(both)(
                (plgpu.ACC.init(acc), m, l, p_last, m))
            plgpu.barrier_arrive(self.v_consumed.at[last])
            return acc * lax.broadcast_in_dim(alpha, acc.shape, [0]), m_next, l, p

        s_shape = (carry[3].shape[0], carry[3].shape[1])
        return lax.cond(step == self.first_step, opening, overlapped, carry)

    def last_values(self, seen_any, step, carry):
        """(acc, m, l) once the last visit's P @ V is added (`step`: the
        step after the last visit; `seen_any`: the item had a visit)."""
        def last_values(carry):
            acc, m, l, p_last = carry
            last = self.slot_of(step - 1)
            self.turns.before_values(self.v_loaded.at[last])
            acc = accumulate(acc, p_last, self.v_smem.at[last])
            plgpu.barrier_arrive(self.v_consumed.at[last])
            return acc, m, l

        return lax.cond(seen_any, last_values, lambda carry: carry[:3], carry)


class _Turns:
    """How the two compute warpgroups take turns on the tensor cores, so
    one's softmax runs under the other's matmuls (module doc). Warpgroup 1
    starts second; each hook is called by both."""

    def __init__(self, wg):
        self.wg = wg

    def _hand_over(self):  # to the other warpgroup, without waiting
        for wg in range(COMPUTE_WARPGROUPS):
            pl.when(self.wg == wg)(functools.partial(
                _named_barrier, "arrive", _TURN_BARRIER + 1 - wg))

    def _await_turn(self):  # until the other warpgroup hands over
        for wg in range(COMPUTE_WARPGROUPS):
            pl.when(self.wg == wg)(functools.partial(_named_barrier, "sync", _TURN_BARRIER + wg))

    def start(self):
        """Before an item's first tile."""
        pl.when(self.wg == 1)(self._await_turn)

    def scores_issued(self):
        """Right after the scores' matmul is issued."""
        self._hand_over()

    def before_values(self, v_loaded):
        """Before a turn that issues P @ V (after the softmax; with v33's
        overlap, before the next tile's scores too): the V tile loaded,
        our turn."""
        plgpu.barrier_wait(v_loaded)
        self._await_turn()

    def finish(self):
        """After an item's last tile: warpgroup 1's last wait is released."""
        pl.when(self.wg == 0)(self._hand_over)


def _named_barrier(op: str, barrier: int):
    """PTX bar.<op> on a hardware named barrier that both compute
    warpgroups meet at (256 threads): "arrive" does not wait, "sync" does."""
    threads = COMPUTE_WARPGROUPS * 128

    @plgpu.inline_mgpu()
    def ptx(_):
        llvm.inline_asm(ir.Type.parse("!llvm.void"), [], f"bar.{op} {barrier}, {threads};",
                        "", has_side_effects=True)

    ptx()


def _wait_next(step, end, k_loaded, slot_of):
    """Wait for the next visit's K tile while this visit's P @ V runs
    (`end`: the step after this item's last visit)."""
    following = step + 1

    @pl.when(following < end)
    def _():
        plgpu.barrier_wait(k_loaded.at[slot_of(following)])

