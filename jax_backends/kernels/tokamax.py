"""jax.tokamax_*: tokamax.dot_product_attention with one implementation each.

tokamax's public attention API takes is_causal, local_window_size (a
(left, right) window it turns into a CausalMask with an offset and a window
size), padding lengths and a dense boolean mask; GQA is native. It has no
packed-document input, and a dense mask at long lengths is a different
benchmark, so documents are UNSUPPORTED. Windows are claimed only where the
implementation keeps them O(S):
- 'mosaic' folds a windowed CausalMask into per-row k_start/k_end
  (pallas_mosaic_gpu_common.decompose_mask), forward and backward, so it
  runs both sliding windows exactly;
- 'triton' (pallas_triton._decompose_mask) and 'cudnn' (jax_nn.py) take
  only the plain causal flag out of the mask and materialise a windowed one
  as a dense S x S array: full and causal only.

tokamax picks a kernel config per shape from its autotuning cache and, on a
miss, from heuristics (the default of tokamax_autotuning_cache_miss_fallback;
it logs a warning per shape, it does not autotune). build() autotunes the
shapes it will run (the forward alone, the forward with residuals and the
VJP) into tokamax's in-process autotuning cache, so the timed calls neither
autotune nor miss. It is slow (minutes per shape in one unrecorded H200
test run; 'mosaic' tries 16-17 configs per op, 'triton' up to 256) and is
recorded as setup_s.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jax_backends import _shared
from jax_backends.kernels.mask_api import MaskApi, Speaker, Stated
from lcab.backend import Backend, Support
from lcab.workloads import Workload

_NAME = "tokamax.dot_product_attention"
_JAX_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


def _local_window(linear: bool) -> Speaker:
    """local_window_size where kept O(S) ('mosaic'); refused where made dense."""

    def speak(workload: Workload, window: tuple[int, int]) -> Stated | None:
        if min(window) < 0:
            return None  # an unbounded side is no local_window_size
        if linear:
            how = f"local_window_size={_shared.window_shape(window)}"
            return Support.yes(how), {"local_window_size": window}
        return Support.no(
            f"this tokamax implementation turns local_window_size {window} into a dense "
            f"{workload.seqlen_q} x {workload.seqlen_k} boolean mask"
        ), {}

    return speak


_WINDOWED = MaskApi(_NAME, "full, causal and sliding windows", window=_local_window(True),
                    lengths_are_padding=True)
_UNWINDOWED = MaskApi(_NAME, "full and causal", window=_local_window(False),
                      lengths_are_padding=True)


class _TokamaxBackend(Backend):
    framework = "jax"
    requires = ("tokamax",)
    implementation: ClassVar[str]
    mask_api: ClassVar[MaskApi] = _UNWINDOWED
    claimed_masks = frozenset({"full", "causal"})
    autotunes: ClassVar[bool] = True  # has kernel configs to choose from

    def __init_subclass__(cls, **kwargs):
        # Minutes of autotuning per shape: only when asked for by name. Said
        # by the class, so a sweep knows it where tokamax is not installed
        # too (launch.left_out), and records no UNAVAILABLE rows for it.
        super().__init_subclass__(**kwargs)
        cls.in_default_sweep = not cls.autotunes

    @classmethod
    def environment_problem(cls) -> str | None:
        return _shared.gpu_problem()

    def plan(self, workload: Workload) -> Stated:
        return self.mask_api.state(workload)

    def build(self, workload: Workload):
        kwargs = self.planned_kwargs(workload)
        attend = _attention(self.implementation, kwargs)
        if self.autotunes:
            _autotune(attend, workload)
        return attend


def _attention(implementation: str, kwargs: dict):
    import tokamax

    def attend(q, k, v):
        return tokamax.dot_product_attention(q, k, v, implementation=implementation, **kwargs)

    return attend


def _autotune(attend, workload: Workload) -> None:
    """Autotune every tokamax op the timed functions will trace, into tokamax's cache.

    The results go to tokamax's in-process autotuning cache, where every later
    trace finds them: the backward is traced outside any scope this function
    could open (jax.vjp's pullback), so a scoped AutotuningResult would miss.
    Shapes already in the cache (tuned earlier in the process, or shipped
    with tokamax) are not tuned again.
    """
    import tokamax

    def forward_and_gradients(q, k, v):
        # The forward alone and the forward inside a VJP are separate cache
        # entries (return_residuals differs), so both are traced here.
        out, pullback = jax.vjp(attend, q, k, v)
        return attend(q, k, v), pullback(out)

    batch, dim, dtype = workload.batch, workload.head_dim, _JAX_DTYPES[workload.dtype]
    q = jax.ShapeDtypeStruct((batch, workload.seqlen_q, workload.heads_q, dim), dtype)
    kv = jax.ShapeDtypeStruct((batch, workload.seqlen_k, workload.heads_kv, dim), dtype)
    for bound in tokamax.autotuning.get_bound_args(forward_and_gradients, q, kv, kv):
        if bound.cached_autotuning_data is None:
            bound.autotune()  # caches the timings of every config; the fastest is used


class TokamaxMosaicBackend(_TokamaxBackend):
    name = "jax.tokamax_mosaic"
    description = "tokamax.dot_product_attention, implementation='mosaic' (Pallas Mosaic GPU)"
    implementation = "mosaic"
    mask_api = _WINDOWED  # local_window_size without a dense mask
    claimed_masks = frozenset({"full", "causal", "sliding_window", "sliding_window_causal"})
    # The backward takes bf16/f16 only (pallas_mosaic_gpu_vjp.py); float32
    # fails in the forward too ('Unsupported precision: TF32_TF32_F32', H200).
    dtypes = ("bfloat16", "float16")
    head_dims = (64, 128, 256)

    @classmethod
    def environment_problem(cls) -> str | None:
        # The forward runs from sm80, the backward only on sm90 and sm100.
        return _shared.gpu_problem(capability=(9, 0))


class TokamaxTritonBackend(_TokamaxBackend):
    name = "jax.tokamax_triton"
    description = "tokamax.dot_product_attention, implementation='triton' (Pallas Triton)"
    implementation = "triton"
    dtypes = ("bfloat16", "float16", "float32")
    head_dims = (32, 64, 128, 256)


class TokamaxCudnnBackend(_TokamaxBackend):
    name = "jax.tokamax_cudnn"
    description = "tokamax.dot_product_attention, implementation='cudnn' (jax.nn cuDNN)"
    implementation = "cudnn"
    autotunes = False  # jax.nn.dot_product_attention has no tokamax config
    dtypes = ("bfloat16", "float16")
    head_dims = _shared.CUDNN_HEAD_DIMS

    def supports(self, workload: Workload) -> Support:
        support = super().supports(workload)
        if not support.ok:
            return support
        return _shared.cudnn_head_dim_problem(workload) or support


class _HeuristicConfig:
    """tokamax's own behaviour on an autotuning-cache miss: a heuristic
    kernel config, no autotuning. What a user gets without tuning, and
    affordable in a short GPU session (autotuning takes minutes a shape)."""

    autotunes = False

    def plan(self, workload: Workload) -> Stated:
        support, kwargs = super().plan(workload)
        if support.ok:
            support = dataclasses.replace(support, how=f"{support.how}; heuristic config")
        return support, kwargs


class TokamaxMosaicHeuristicBackend(_HeuristicConfig, TokamaxMosaicBackend):
    name = "jax.tokamax_mosaic_heuristic"
    description = "tokamax 'mosaic' with its heuristic kernel config (not autotuned)"


class TokamaxTritonHeuristicBackend(_HeuristicConfig, TokamaxTritonBackend):
    name = "jax.tokamax_triton_heuristic"
    description = "tokamax 'triton' with its heuristic kernel config (not autotuned)"
