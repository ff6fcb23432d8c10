"""jax.pallas_flex: LCAB's own flexible-mask flash attention, in Pallas.

Every mask family runs from its slices: the host plans, once per mask and
block size, which tiles each program visits (jax_backends/flex_plan.py), so
the work follows the mask's area and empty tiles are never touched; partial
tiles are masked element-wise by the slices that meet them
(jax_backends/flex_kernel.py). GQA indexes each query head's K/V head:
nothing is repeated in memory (dK/dV programs read K/V once per group,
forward and dQ programs once per query head). The kernels are lowered
through Triton (on a CPU they run in Pallas interpret mode); on Hopper the
forward goes through Mosaic GPU where it fits (`forward_lowering=auto`,
jax_backends/flex_kernel_mosaic.py) and so does the backward
(`backward_lowering=auto`, jax_backends/flex_backward_mosaic.py, on
128 x 128 backward tiles; the Triton backward takes 64 x 64).
"""

from __future__ import annotations

import dataclasses

from jax_backends import _shared, flex_backward_mosaic, flex_kernel, flex_plan
from lcab.backend import Backend, Support
from lcab.workloads import Workload


@dataclasses.dataclass(frozen=True)
class Tiling:
    """Block sizes of the forward and of the backward (dQ and dK/dV)."""

    block_q: int = 128
    block_k: int = 128  # 64 read 344 forward at full 32k on an H100, 128 read 403
    # None: 128 x 128 where the Mosaic backward runs, else 64 x 64 (Triton's
    # best on an H100): PallasFlexBackend.backward_blocks.
    backward_block_q: int | None = None
    backward_block_k: int | None = None


class PallasFlexBackend(Backend):
    name = "jax.pallas_flex"
    framework = "jax"
    description = ("LCAB's flexible-mask flash attention (Pallas: Mosaic GPU on Hopper, "
                   "Triton elsewhere), any mask")
    dtypes = ("bfloat16", "float16", "float32")
    head_dims = (16, 32, 64, 128)  # Triton tiles are powers of two
    requires = ("jax", "jax.experimental.pallas", "jax.experimental.pallas.triton")
    options = {
        **{field.name: int for field in dataclasses.fields(Tiling)},
        **{field.name: {"bool": bool, "str": str}.get(str(field.type), int)
           for field in dataclasses.fields(flex_kernel.Lowering)},
    }

    def __init__(self, **options):
        tiling_keys = {field.name for field in dataclasses.fields(Tiling)}
        tiling = {k: v for k, v in options.items() if k in tiling_keys}
        self.tiling = Tiling(**tiling)
        for key in tiling_keys:
            size = getattr(self.tiling, key)
            if size is not None and (size < 16 or size & (size - 1)):
                raise ValueError(f"{key}={size}: blocks are powers of two from 16 (Triton tiles)")
        lowering = {k: v for k, v in options.items() if k not in tiling_keys}
        # The Mosaic kernels have no interpret mode; mask_support says so on a CPU.
        mosaic = "mosaic" in (lowering.get("forward_lowering"), lowering.get("backward_lowering"))
        lowering.setdefault("interpret", _shared.interpret_mode() and not mosaic)
        self.lowering = flex_kernel.Lowering(**lowering)
        self.set_options = dict(sorted(options.items()))

    @classmethod
    def environment_problem(cls) -> str | None:
        return _shared.pallas_platform_problem()

    def backward_blocks(self, dtype: str, head_dim: int) -> tuple[int, int]:
        """The backward's (block_q, block_k): as set, else the Mosaic
        backward's 128 x 128 where it runs, else 64 x 64. (A ring that adds
        each step onto running sums builds its inner with the Triton
        backward: jax.cp_ring's merge=in_kernel.)"""
        tiling = self.tiling
        if tiling.backward_block_q is not None and tiling.backward_block_k is not None:
            return tiling.backward_block_q, tiling.backward_block_k
        mosaic = (flex_backward_mosaic.BLOCK,) * 2
        if self.lowering.mosaic_problem("backward", *mosaic, dtype, head_dim):
            chosen = (64, 64)
        else:
            chosen = mosaic
        return tiling.backward_block_q or chosen[0], tiling.backward_block_k or chosen[1]

    def mask_support(self, workload: Workload) -> Support:
        tiling, lowering = self.tiling, self.lowering
        chosen = {}
        backward_blocks = self.backward_blocks(workload.dtype, workload.head_dim)
        for direction, blocks in (("forward", (tiling.block_q, tiling.block_k)),
                                  ("backward", backward_blocks)):
            problem = lowering.mosaic_problem(direction, *blocks, workload.dtype,
                                              workload.head_dim)
            if getattr(lowering, f"{direction}_lowering") == "mosaic" and problem:
                return Support.no(f"{direction}_lowering=mosaic: {problem}")
            chosen[direction] = "Triton" if problem else "Mosaic GPU"
        mode = "interpret mode" if lowering.interpret else "compiled"
        mode += f"; forward {chosen['forward']}, backward {chosen['backward']}"
        if workload.dtype == "float32" and not self.lowering.interpret:
            mode += ", float32 in TF32 matmuls"
        options = "".join(f"; {key}={value}" for key, value in self.set_options.items())
        return Support.yes(f"block plan from the mask's slices; GQA unrepeated; {mode}{options}")

    def plans(self, workload: Workload) -> tuple[flex_plan.FlexPlan, flex_plan.FlexPlan]:
        tiling = self.tiling
        return (
            flex_plan.make_plan(workload.mask, tiling.block_q, tiling.block_k),
            flex_plan.make_plan(workload.mask,
                                *self.backward_blocks(workload.dtype, workload.head_dim)),
        )

    def build(self, workload: Workload):
        forward_plan, backward_plan = self.plans(workload)
        lowering = self.lowering

        def attend(q, k, v):
            out, _ = flex_kernel.flex_attention(q, k, v, forward_plan, backward_plan, lowering)
            return out

        return attend
