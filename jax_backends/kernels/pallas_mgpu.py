"""jax.pallas_mgpu: the Mosaic GPU (Hopper) flash attention shipped in JAX.

jax.experimental.pallas.ops.gpu.attention_mgpu.attention, forward and
backward, GQA native. What its source allows, and so what is claimed:
- float16 only: the kernel stages tiles in float16 shared memory, so
  bfloat16 inputs fail to lower ('src had type bfloat16 and dst had type
  float16', seen with jax 0.11.2).
- head_dim a multiple of 64 (64, 128, 256); sequences in whole tiles.
- It has a causal forward but no causal backward ('Causal attention not
  supported in the backwards pass yet'): full is claimed in both
  directions, causal in the forward only (Support.directions).
- No softmax scale: q is multiplied by 1/sqrt(head_dim) before the call.
- sm90a only (its tests run on compute capability 9.0 alone).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from jax_backends import _shared
from jax_backends.kernels.mask_api import MaskApi, Stated, causal_flag
from lcab.backend import Backend, Support
from lcab.workloads import Workload

# Forward: q in tiles of 2 * BLOCK_Q (two compute warpgroups), kv in BLOCK_KV.
# Backward: blocks from JAX's tests; 2 warpgroups up to head_dim 128, else 1.
BLOCK_Q = 64
SEQ_MULTIPLE = 128  # covers 2 * BLOCK_Q, every BLOCK_KV and the backward tiles
_SM90 = (9, 0)
_API = MaskApi("attention_mgpu.attention", "full and (forward only) causal",
               flag=causal_flag("causal=True", keyword="causal"))


def _tuning(head_dim: int, attention_mgpu, causal: bool):
    small = head_dim <= 128
    block_kv = 128 if small else 64  # head_dim 256 overflows shared memory at 128
    backward = (64, 128, 128, 64) if small else (64, 64, 64, 64)
    block_q_dq, block_kv_dq, block_q_dkv, block_kv_dkv = backward
    return attention_mgpu.TuningConfig(
        block_q=BLOCK_Q, block_kv=block_kv, max_concurrent_steps=2, causal=causal,
        compute_wgs_bwd=2 if small else 1,
        block_q_dq=block_q_dq, block_kv_dq=block_kv_dq,
        block_q_dkv=block_q_dkv, block_kv_dkv=block_kv_dkv,
    )


class PallasMosaicGpuBackend(Backend):
    name = "jax.pallas_mgpu"
    framework = "jax"
    description = "jax.experimental.pallas.ops.gpu.attention_mgpu (Pallas, Mosaic GPU, sm90)"
    dtypes = ("float16",)
    head_dims = (64, 128, 256)
    requires = ("jax", "jax.experimental.pallas.ops.gpu.attention_mgpu")
    claimed_masks = frozenset({"full", "causal"})  # causal forward only

    @classmethod
    def environment_problem(cls) -> str | None:
        return _shared.gpu_problem(capability=_SM90, exact=True)

    def plan(self, workload: Workload) -> Stated:
        support, kwargs = _API.state(workload)
        if not support.ok:
            return support, {}
        tiles = _shared.multiple_problem(workload, SEQ_MULTIPLE, "the kernel's tiles")
        if tiles:
            return tiles, {}
        how = f"{support.how}; q scaled by 1/sqrt(head_dim) before the call"
        # 'Causal attention not supported in the backwards pass yet'.
        return Support.yes(how, ("fwd",) if kwargs["causal"] else None), kwargs

    def build(self, workload: Workload):
        causal = self.planned_kwargs(workload)["causal"]
        from jax.experimental.pallas.ops.gpu import attention_mgpu

        config = _tuning(workload.head_dim, attention_mgpu, causal)
        scale = 1.0 / math.sqrt(workload.head_dim)

        def attend(q, k, v):
            scaled = (q.astype(jnp.float32) * scale).astype(q.dtype)
            return attention_mgpu.attention(scaled, k, v, config)

        return attend
