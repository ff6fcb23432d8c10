"""jax.cudnn: jax.nn.dot_product_attention(implementation='cudnn').

cuDNN's fused flash attention through JAX's public API. It expresses full
(no mask), causal (is_causal) and the causal sliding window
(is_causal with local_window_size=(w, 0), which JAX passes to cuDNN as
sliding_window_length = w + 1). JAX raises for a right window without
is_causal and silently drops it with is_causal (jax/_src/nn/functions.py),
so the two-sided window is not claimed. query_seq_lengths and
key_value_seq_lengths express padding, not packed documents, and a dense
mask is never used: other families are UNSUPPORTED. GQA is native.
At an odd length JAX's cuDNN front end refuses the backward
(NotImplementedError "Unsupported sequence length", measured at 3001 tokens
on an H200): such a workload runs forward only.
"""

from __future__ import annotations

import jax

from jax_backends import _shared
from jax_backends.kernels.mask_api import MaskApi, Stated
from lcab.backend import Backend, Support
from lcab.workloads import Workload

_NAME = "jax.nn.dot_product_attention(implementation='cudnn')"


def _left_window(workload: Workload, window: tuple[int, int]) -> Stated:
    left, right = window
    if right == 0 and left >= 0:
        how = "is_causal; local_window_size=(w, 0)"
        return Support.yes(how), {"is_causal": True, "local_window_size": (left, 0)}
    return Support.no(
        f"cuDNN through {_NAME} has only a left window with a causal mask; "
        f"{workload.mask.name} has window ({left}, {right})"
    ), {}


_API = MaskApi(_NAME, "full, causal and causal sliding windows (w, 0)",
               window=_left_window, lengths_are_padding=True)


class CudnnBackend(Backend):
    name = "jax.cudnn"
    framework = "jax"
    description = "jax.nn.dot_product_attention, implementation='cudnn' (cuDNN flash attention)"
    dtypes = ("bfloat16", "float16")
    head_dims = _shared.CUDNN_HEAD_DIMS
    requires = ("jax",)
    claimed_masks = frozenset({"full", "causal", "sliding_window_causal"})
    no_ring_kernel = "jax.nn.dot_product_attention returns the output only, no log-sum-exp"

    @classmethod
    def environment_problem(cls) -> str | None:
        return _shared.gpu_problem()

    def supports(self, workload: Workload) -> Support:
        support = super().supports(workload)
        if not support.ok:
            return support
        problem = _shared.cudnn_head_dim_problem(workload)
        if problem:
            return problem
        if workload.seqlen_q % 2 or workload.seqlen_k % 2:
            return Support.yes(support.how, directions=("fwd",))
        return support

    def plan(self, workload: Workload) -> Stated:
        return _API.state(workload)

    def build(self, workload: Workload):
        kwargs = self.planned_kwargs(workload)

        def attend(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, implementation="cudnn", **kwargs)

        return attend
