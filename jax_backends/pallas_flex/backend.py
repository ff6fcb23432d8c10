"""jax.pallas_flex: LCAB's own flexible-mask flash attention, in Pallas.

Every mask family runs from its slices: the host plans, once per mask and
block size, which tiles each program visits (plan.py), so the work follows
the mask's area and empty tiles are never touched; partial tiles are
masked element-wise by the slices that meet them. GQA indexes each query
head's K/V head: nothing is repeated in memory. On Hopper both directions
go through Mosaic GPU where they fit (128 x 128 backward tiles), Triton
elsewhere (64 x 64 backward tiles, Triton's best measured); on a CPU the
Triton kernels run in Pallas interpret mode.
"""

from __future__ import annotations

import dataclasses
import functools

from jax_backends import _shared
from jax_backends.pallas_flex import mosaic_bwd_sm90, mosaic_fwd_sm90, ops, plan, ring, schedule
from lcab.backend import Backend, ProbeNeeds, Support
from lcab.masks import MASK_NAMES
from lcab.workloads import Workload

# Blocks of the forward: a q block of 128 rows is the Mosaic forward's two
# warpgroups; block_k 128 was the faster measured (docs/pallas_flex.md,
# "Constants") except where programs walk long rows: there the Mosaic
# forward steps 192 keys unless block_k is set (schedule.forward_key_block).
FORWARD_BLOCKS = (128, 128)
TRITON_BACKWARD_BLOCKS = (64, 64)


def _choice(options: dict, key: str, choices, default):
    """Option `key` as set (else default), refused unless one of choices."""
    value = options.get(key, default)
    if value not in choices:
        raise ValueError(f"{key}={value!r}: choose one of {', '.join(map(str, choices))}")
    return value


@functools.lru_cache(maxsize=32)
def _geometry(mask, blocks: tuple[int, int]) -> plan.Geometry:
    """A plan's geometry, kept: the key block's choice asks it on every
    call about a workload (support, probe, launch, plans), and a plan at
    128k tokens takes a few tenths of a second."""
    return plan.make_plan(mask, *blocks).geometry


class PallasFlexBackend(Backend):
    name = "jax.pallas_flex"
    framework = "jax"
    description = ("LCAB's flexible-mask flash attention (Pallas: Mosaic GPU on Hopper, "
                   "Triton elsewhere), any mask")
    dtypes = ("bfloat16", "float16", "float32")
    head_dims = (16, 32, 64, 128)  # Triton tiles are powers of two
    requires = ("jax", "jax.experimental.pallas", "jax.experimental.pallas.triton")
    claimed_masks = frozenset(MASK_NAMES)
    # What a user may choose: tile sizes (None: the lowering's own) and,
    # per direction, the lowering ("auto": Mosaic GPU where it fits).
    # The launch orders (ops.Lowering) are for measuring them: dkv_launch
    # "auto" decides per plan; rows_launch is the Mosaic forward's and dQ's
    # ("auto": the forward's by plan, dQ's heads together);
    # dkv_split the dK/dV programs a K/V head's block (head_split);
    # forward_grid the Mosaic forward's programs, one per item or one per SM
    # ("auto" decides per plan; the Triton forward has one grid);
    # forward_overlap whether a Mosaic forward warpgroup runs a tile's
    # softmax under the last tile's P @ V: "none" or "intra" (v33, FA3's).
    # forward_registers: the Mosaic forward's compute warpgroups' registers a
    # thread, "232" (the memory warpgroup 40) or "240" (24: FA3's split).
    options = {"block_q": int, "block_k": int, "backward_block_q": int,
               "backward_block_k": int, "forward_lowering": str, "backward_lowering": str,
               "dkv_launch": str, "rows_launch": str, "dkv_split": str, "forward_grid": str,
               "forward_overlap": str, "forward_registers": str}
    # dkv_split, forward_grid, rows_launch "auto" and the key block by plan
    # were measured on whole single-GPU passes, not on ring steps or CP
    # ranks' sub-masks: inside CP the dK/dV programs stay whole and the
    # forward keeps a program per item, every head of a q block together,
    # 128 keys a step.
    cp_inner_defaults = {"dkv_split": "1", "forward_grid": "per_item",
                         "rows_launch": "heads_together", "block_k": "128"}

    def __init__(self, **options):
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise ValueError(f"{self.name} has no option {unknown[0]!r}; its options: "
                             f"{', '.join(sorted(self.options))}")
        self.set_options = dict(sorted(options.items()))  # the row's notes name them
        self.forward_blocks = (options.get("block_q", FORWARD_BLOCKS[0]),
                               options.get("block_k", FORWARD_BLOCKS[1]))
        self.key_block_set = "block_k" in options
        self.chosen_backward_blocks = (options.get("backward_block_q"),
                                       options.get("backward_block_k"))
        wide = mosaic_fwd_sm90.WIDE_BLOCK_K
        for key, size in zip(("block_q", "block_k", "backward_block_q", "backward_block_k"),
                             (*self.forward_blocks, *self.chosen_backward_blocks)):
            if (size is not None and (size < 16 or size & (size - 1))
                    and (key, size) != ("block_k", wide)):
                raise ValueError(f"{key}={size}: blocks are powers of two from 16 (Triton "
                                 f"tiles), or block_k={wide} (the Mosaic forward's alone)")
        self.lowerings = tuple(_choice(options, key, ops.LOWERINGS, "auto")
                               for key in ("forward_lowering", "backward_lowering"))
        self.launches = {key: _choice(options, key, choices, None)
                         for key, choices in (("dkv_launch", schedule.DKV_LAUNCHES),
                                              ("rows_launch", schedule.ROWS_LAUNCHES),
                                              ("dkv_split", schedule.DKV_SPLITS),
                                              ("forward_grid", schedule.FORWARD_GRIDS))
                         if key in options}
        overlap = _choice(options, "forward_overlap", mosaic_fwd_sm90.OVERLAPS, "none")
        registers = _choice(options, "forward_registers", mosaic_fwd_sm90.REGISTER_SPLITS, "232")
        self.mosaic_forward = mosaic_fwd_sm90.Config(
            overlap=overlap == "intra", registers=mosaic_fwd_sm90.REGISTER_SPLITS[registers])

    @functools.cached_property
    def lowering(self) -> ops.Lowering:
        # Asked of JAX on first use, not in __init__ (the CLI constructs
        # backends to check options before any framework starts). The
        # Mosaic kernels have no interpret mode; mask_support says so on a CPU.
        forward, backward = self.lowerings
        mosaic = "mosaic" in (forward, backward)
        return ops.Lowering(forward=forward, backward=backward,
                            interpret=_shared.interpret_mode() and not mosaic,
                            mosaic_forward=self.mosaic_forward, **self.launches)

    @classmethod
    def environment_problem(cls) -> str | None:
        return _shared.pallas_platform_problem()

    def backward_blocks(self, dtype: str, head_dim: int) -> tuple[int, int]:
        """The backward's (block_q, block_k): as set, else the Mosaic
        backward's 128 x 128 where it runs, else Triton's 64 x 64."""
        mosaic = (mosaic_bwd_sm90.BLOCK,) * 2
        fits = not self.lowering.mosaic_problem("backward", *mosaic, dtype, head_dim)
        chosen = mosaic if fits else TRITON_BACKWARD_BLOCKS
        given_q, given_k = self.chosen_backward_blocks
        return given_q or chosen[0], given_k or chosen[1]

    def forward_blocks_for(self, workload: Workload) -> tuple[int, int]:
        """The forward's (block_q, block_k) on `workload`: as set, else with
        the key block schedule.forward_key_block picks where the Mosaic
        forward runs 192-key steps here (not on the persistent grid)."""
        if self.key_block_set:
            return self.forward_blocks
        wide = (self.forward_blocks[0], mosaic_fwd_sm90.WIDE_BLOCK_K)
        if self.lowering.mosaic_problem("forward", *wide, workload.dtype, workload.head_dim):
            return self.forward_blocks
        geometry = _geometry(workload.mask, self.forward_blocks)
        return (self.forward_blocks[0],
                schedule.forward_key_block(geometry, workload.head_dim, wide[1]))

    def mask_support(self, workload: Workload) -> Support:
        lowering = self.lowering
        chosen = {}
        forward_blocks = self.forward_blocks_for(workload)
        backward_blocks = self.backward_blocks(workload.dtype, workload.head_dim)
        for direction, blocks in (("forward", forward_blocks),
                                  ("backward", backward_blocks)):
            problem = lowering.mosaic_problem(direction, *blocks, workload.dtype,
                                              workload.head_dim)
            if getattr(lowering, direction) == "mosaic" and problem:
                return Support.no(f"{direction}_lowering=mosaic: {problem}")
            if problem and direction == "forward" and blocks[1] == mosaic_fwd_sm90.WIDE_BLOCK_K:
                return Support.no(f"block_k={blocks[1]} takes the Mosaic forward (Triton "
                                  f"tiles are powers of two), which cannot run here: {problem}")
            chosen[direction] = "Triton" if problem else "Mosaic GPU"
        if forward_blocks != self.forward_blocks:
            chosen["forward"] += f" ({forward_blocks[1]}-key steps)"
        mode = "interpret mode" if lowering.interpret else "compiled"
        mode += f"; forward {chosen['forward']}, backward {chosen['backward']}"
        if workload.dtype == "float32" and not lowering.interpret:
            mode += ", float32 in TF32 matmuls"
        options = "".join(f"; {key}={value}" for key, value in self.set_options.items())
        mosaic_only = [key for key in ("forward_overlap", "forward_registers")
                       if key in self.set_options]
        if mosaic_only and chosen["forward"] == "Triton":
            options += f" ({', '.join(mosaic_only)} unused: the Mosaic forward's)"
        return Support.yes(f"block plan from the mask's slices; GQA unrepeated; {mode}{options}")

    def probe_needs(self, workload: Workload) -> ProbeNeeds:
        # The Mosaic kernels' two-slot K/V rings wrap from the third tile;
        # four per program wrap them twice, on every pass and tiling.
        return ProbeNeeds(tilings=(self.forward_blocks_for(workload),
                                   self.backward_blocks(workload.dtype, workload.head_dim)))

    def launch_order(self, workload: Workload) -> tuple[str, int]:
        """The dK/dV launch order and split the backward takes on `workload`."""
        blocks = self.backward_blocks(workload.dtype, workload.head_dim)
        backward = plan.make_plan(workload.mask, *blocks)
        mosaic = self.lowering.mosaic_problem("backward", *blocks, workload.dtype,
                                              workload.head_dim) is None
        return schedule.dkv_schedule(backward.geometry, workload.heads_kv * workload.batch,
                                     workload.heads_q // workload.heads_kv,
                                     self.lowering.dkv_launch, self.lowering.dkv_split, mosaic)

    def forward_launch(self, workload: Workload) -> tuple[str | None, str]:
        """The Mosaic forward's grid and rows order on `workload` (None and
        the asked order: the forward runs Triton, which has one grid and
        launches rows head after head)."""
        lowering = self.lowering
        blocks = self.forward_blocks_for(workload)
        if lowering.mosaic_problem("forward", *blocks, workload.dtype, workload.head_dim):
            return None, lowering.rows_launch
        forward = plan.make_plan(workload.mask, *blocks).geometry
        config = lowering.mosaic_forward_for(forward, workload.dtype, workload.head_dim)
        return ("persistent" if config.persistent else "per_item",
                schedule.rows_launch(forward, lowering.rows_launch))

    def pinned_to(self, workload: Workload):
        # A probe has fewer heads and a shorter mask, from which "auto"
        # could choose another forward grid, rows order, key block, dK/dV
        # launch order or split: pin the timed ones (a probe pinned to rows
        # head after head runs its dQ so too: an order, not arithmetic).
        order, split = self.launch_order(workload)
        grid, rows = self.forward_launch(workload)
        head_major = grid is not None and rows == "head_major"
        pinned = type(self)(**self.set_options)
        pinned.forward_blocks = self.forward_blocks_for(workload)
        pinned.key_block_set = True
        pinned.__dict__["lowering"] = dataclasses.replace(
            self.lowering, dkv_launch=order, dkv_split=str(split),
            forward_grid=grid or self.lowering.forward_grid,
            rows_launch="head_major" if head_major else self.lowering.rows_launch)
        grid_note = (", the forward one program per SM walking its items"
                     if grid == "persistent" else "")
        rows_note = ", the forward's rows head after head" if head_major else ""
        if pinned.forward_blocks != self.forward_blocks:
            rows_note += f", {pinned.forward_blocks[1]} keys a step"
        split_note = (f", each K/V head's block in {split} dK/dV programs (K/V repeated "
                      f"{split}x for them)" if split > 1 else "")
        return pinned, f"probed with the dK/dV launch {order}{split_note}{grid_note}{rows_note}"

    def plans(self, workload: Workload) -> tuple[plan.FlexPlan, plan.FlexPlan]:
        return (plan.make_plan(workload.mask, *self.forward_blocks_for(workload)),
                plan.make_plan(workload.mask,
                               *self.backward_blocks(workload.dtype, workload.head_dim)))

    def build(self, workload: Workload):
        forward_plan, backward_plan = self.plans(workload)
        lowering = self.lowering

        def attend(q, k, v):
            out, _ = ops.flex_attention(q, k, v, forward_plan, backward_plan, lowering)
            return out

        return attend

    def ring_kernel(self) -> ring.PallasRing:
        return ring.PallasRing(self.forward_blocks,
                               lambda w: self.backward_blocks(w.dtype, w.head_dim),
                               self.lowering)
