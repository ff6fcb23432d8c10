"""torch.sdpa_*: scaled_dot_product_attention pinned to one SDPA backend.

Full and causal masks use the native is_causal flag (only on square
documents: torch's is_causal is top-left aligned, which for seqlen_q !=
seqlen_k is not LCAB's bottom-right causal, so such masks go the dense way).
Every other family needs a dense boolean attn_mask: the honest way the math,
efficient and cuDNN backends express it, labelled so in the row's notes.
FLASH_ATTENTION takes no attn_mask at all, and the fused GPU backends get a
dense mask only up to 8k x 8k (it is an S x S tensor in memory and traffic).

GQA: enable_gqa where the backend takes it; otherwise K/V heads are repeated
inside the timed function, and Support.how says so. On a GPU the installed
torch is asked (torch.backends.cuda.can_use_*_attention on tiny tensors)
which of the two it accepts, so an unavailable kernel for a dtype/head_dim
becomes UNSUPPORTED with torch's reason instead of a crash; without a GPU
the class's static declaration (what torch 2.11 does) is used.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from lcab import expressions
from lcab.backend import Backend, Support
from lcab.masks import DENSE_LIMIT, MASK_NAMES, AttnMask
from lcab.workloads import Workload
from torch_backends.device import cuda_problem, device_name
from torch_backends.kernels.flash_style import FLASH_HEAD_DIMS, LOW_PRECISION, repeat_kv_heads

DENSE_MASK_CELLS = 1 << 28  # math backend: 16k x 16k
FUSED_DENSE_MASK_CELLS = DENSE_LIMIT  # fused GPU backends: 8k x 8k
_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_CHECK_SEQLEN = 128  # sequence length of the tiny tensors a GPU capability check uses


@dataclasses.dataclass(frozen=True)
class _MaskPlan:
    is_causal: bool
    dense: bool  # a dense boolean attn_mask
    how: str


class _SdpaBackend(Backend):
    """scaled_dot_product_attention pinned to `sdpa_backend`."""

    framework = "torch"
    layout = "bhsd"
    requires = ("torch",)
    sdpa_backend: ClassVar[SDPBackend]
    takes_attn_mask: ClassVar[bool] = True
    dense_mask_cells: ClassVar[int] = DENSE_MASK_CELLS
    # Whether the backend takes enable_gqa, where no GPU can be asked.
    static_enable_gqa: ClassVar[bool] = True
    # Every family goes through a dense attn_mask at small sizes.
    claimed_masks = frozenset(MASK_NAMES)
    no_ring_kernel = "scaled_dot_product_attention returns the output only, no log-sum-exp"

    # ----- capability -----------------------------------------------------
    def _mask_plan(self, workload: Workload) -> _MaskPlan | str:
        """How the mask is expressed, or why it cannot be (a reason string)."""
        native = expressions.flag_path(workload.mask)
        if native:
            return _MaskPlan(native == "is_causal", False, native)
        kernel = self.sdpa_backend.name
        if not self.takes_attn_mask:
            return (
                f"{kernel} takes no attn_mask: it runs full and causal (is_causal) masks only, "
                f"and the {workload.mask.name} mask "
                f"({workload.seqlen_q} x {workload.seqlen_k}) is neither"
            )
        cells = workload.seqlen_q * workload.seqlen_k
        if cells > self.dense_mask_cells:
            return (
                f"a dense mask of {workload.seqlen_q} x {workload.seqlen_k} exceeds "
                f"{self.dense_mask_cells} cells, the most {kernel} is given"
            )
        return _MaskPlan(False, True, "dense boolean attn_mask")

    def _gqa(self, workload: Workload, plan: _MaskPlan) -> tuple[bool, str] | str:
        """(enable_gqa?, note) for this workload, or why no kernel runs it."""
        if workload.heads_q == workload.heads_kv:
            refusal = self._kernel_refusal(workload, plan, gqa=False)
            return refusal if refusal else (False, "")
        if self._kernel_refusal(workload, plan, gqa=True) is None:
            return True, "enable_gqa"
        refusal = self._kernel_refusal(workload, plan, gqa=False)
        if refusal:
            return refusal
        return False, f"K/V heads repeated ({self.sdpa_backend.name} takes no enable_gqa)"

    def _kernel_refusal(self, workload: Workload, plan: _MaskPlan, *, gqa: bool) -> str | None:
        """None when the pinned kernel runs this shape; the math kernel runs all."""
        return None

    def plan(self, workload: Workload) -> tuple[Support, dict]:
        mask_plan = self._mask_plan(workload)
        if isinstance(mask_plan, str):
            return Support.no(mask_plan), {}
        gqa = self._gqa(workload, mask_plan)
        if isinstance(gqa, str):
            return Support.no(gqa), {}
        enable_gqa, note = gqa
        how = "; ".join(part for part in (mask_plan.how, note) if part)
        return Support.yes(how), {"plan": mask_plan, "enable_gqa": enable_gqa}

    # ----- the function ---------------------------------------------------
    def build(self, workload: Workload):
        planned = self.planned_kwargs(workload)
        plan, enable_gqa = planned["plan"], planned["enable_gqa"]
        repeat = 1 if enable_gqa else workload.gqa_ratio
        mask = None
        if plan.dense:
            dense = workload.mask.to_dense(max_elements=self.dense_mask_cells)
            mask = torch.from_numpy(dense).to(device_name())
        backend, is_causal = self.sdpa_backend, plan.is_causal

        def attend(q, k, v):
            # K/V heads repeated where the kernel has no GQA, as its users must.
            k, v = repeat_kv_heads(k, repeat, head_axis=1), repeat_kv_heads(v, repeat, head_axis=1)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=enable_gqa
                )

        return attend


class SdpaMathBackend(_SdpaBackend):
    name = "torch.sdpa_math"
    description = "torch SDPA, MATH backend (reference-grade, dense scores)"
    sdpa_backend = SDPBackend.MATH

    def ring_kernel(self) -> "DenseRingKernel":
        return DenseRingKernel()


class DenseRingKernel:
    """torch.sdpa_math's ring form (torch_backends.cp.ring.RingKernel): the
    math backend's dense scores, kept to give the log-sum-exp SDPA does not
    return; float32 out and lse, (batch, heads, seq, dim) layout."""

    how = "dense math with lse"

    def refusal(self, mask: AttnMask) -> str | None:
        # Every step is a dense mask and dense float32 scores, also where
        # SDPA itself would take is_causal: lcab's small-dense limit applies.
        if mask.seqlen_q * mask.seqlen_k > DENSE_LIMIT:
            return (f"the dense ring kernel scores a {mask.seqlen_q} x {mask.seqlen_k} step, "
                    f"more than {DENSE_LIMIT} cells")
        return None

    def step(self, mask: AttnMask, gqa_ratio: int):
        visible = torch.as_tensor(mask.to_dense(DENSE_LIMIT), device=device_name())

        def attend(q, k, v):
            k, v = (repeat_kv_heads(x, gqa_ratio, head_axis=1) for x in (k, v))
            scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
            scores = scores.masked_fill(~visible, float("-inf"))
            lse = torch.logsumexp(scores, dim=-1)
            # A row that sees nothing gets weights 0 (not NaN) and keeps lse -inf.
            seen = lse.masked_fill(lse == float("-inf"), 0.0)
            weights = torch.exp(scores - seen.unsqueeze(-1))
            return weights @ v.float(), lse  # float32 into the ring's merge

        return attend


class _FusedSdpaBackend(_SdpaBackend):
    """A fused GPU SDPA kernel; the installed torch says what it accepts."""

    dense_mask_cells = FUSED_DENSE_MASK_CELLS
    head_dims = FLASH_HEAD_DIMS

    # (torch's check that this build has the kernel, its name), if any.
    built_with: ClassVar[tuple[Callable[[], bool], str] | None] = None

    @classmethod
    def environment_problem(cls) -> str | None:
        problem = cuda_problem()
        if problem is None and cls.built_with is not None:
            available, kernel = cls.built_with
            if not available():
                problem = f"torch {torch.__version__} was built without {kernel}"
        return problem

    def _kernel_refusal(self, workload: Workload, plan: _MaskPlan, *, gqa: bool) -> str | None:
        if not torch.cuda.is_available():
            # No device to ask: the static declaration decides.
            if gqa and not self.static_enable_gqa:
                return f"{self.sdpa_backend.name} takes no enable_gqa"
            return None
        heads_kv = workload.heads_kv if gqa else workload.heads_q
        return _ask_torch(
            self.sdpa_backend, workload.dtype, workload.head_dim,
            workload.heads_q, heads_kv, plan.is_causal, plan.dense,
        )


@functools.lru_cache(maxsize=None)
def _ask_torch(backend, dtype, head_dim, heads_q, heads_kv, is_causal, dense) -> str | None:
    """torch.backends.cuda.can_use_*_attention on tiny tensors of this shape.

    The tensors require grad, so the backward's constraints are asked too.
    None when the kernel accepts it; otherwise torch's own debug reasons
    (torch 2.11 prints them to stderr rather than as Python warnings) or, when
    it gives none, the parameters that were refused.
    """
    can_use = {
        SDPBackend.FLASH_ATTENTION: torch.backends.cuda.can_use_flash_attention,
        SDPBackend.EFFICIENT_ATTENTION: torch.backends.cuda.can_use_efficient_attention,
        SDPBackend.CUDNN_ATTENTION: torch.backends.cuda.can_use_cudnn_attention,
    }[backend]
    torch_dtype = _TORCH_DTYPES[dtype]

    def tensor(heads):
        shape = (1, heads, _CHECK_SEQLEN, head_dim)
        return torch.zeros(shape, dtype=torch_dtype, device="cuda", requires_grad=True)

    q, k, v = tensor(heads_q), tensor(heads_kv), tensor(heads_kv)
    mask = None
    if dense:  # SDPA turns a boolean mask into an additive bias of q's dtype
        mask = torch.zeros(1, 1, _CHECK_SEQLEN, _CHECK_SEQLEN, dtype=torch_dtype, device="cuda")
    params = torch.backends.cuda.SDPAParams(q, k, v, mask, 0.0, is_causal, heads_q != heads_kv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if can_use(params, True):
            return None
    said = "; ".join(str(w.message).strip() for w in caught)
    asked = (
        f"{dtype}, head_dim {head_dim}, heads {heads_q}:{heads_kv}, is_causal={is_causal}, "
        f"attn_mask={'dense' if dense else 'none'}"
    )
    return f"{backend.name} refuses {asked}" + (f": {said}" if said else "")


class SdpaFlashBackend(_FusedSdpaBackend):
    name = "torch.sdpa_flash"
    description = "torch SDPA, FLASH_ATTENTION backend (built-in FlashAttention-2)"
    sdpa_backend = SDPBackend.FLASH_ATTENTION
    dtypes = LOW_PRECISION
    takes_attn_mask = False
    claimed_masks = frozenset({"full", "causal"})
    static_enable_gqa = True  # torch 2.11 takes enable_gqa here (asked on an H200)
    built_with = (torch.backends.cuda.is_flash_attention_available, "FlashAttention")


class SdpaEfficientBackend(_FusedSdpaBackend):
    name = "torch.sdpa_efficient"
    description = "torch SDPA, EFFICIENT_ATTENTION backend (memory-efficient, xFormers-style)"
    sdpa_backend = SDPBackend.EFFICIENT_ATTENTION
    static_enable_gqa = False  # torch 2.11 refuses enable_gqa here (asked on an H200)


class SdpaCudnnBackend(_FusedSdpaBackend):
    name = "torch.sdpa_cudnn"
    description = "torch SDPA, CUDNN_ATTENTION backend (cuDNN fused attention)"
    sdpa_backend = SDPBackend.CUDNN_ATTENTION
    dtypes = LOW_PRECISION
    # 256 only where torch says so on the GPU (torch 2.11 with cuDNN 9.19 on an H200 does).
    head_dims = (*range(8, 129, 8), 256)
    static_enable_gqa = True
    built_with = (torch.backends.cudnn.is_available, "cuDNN")
