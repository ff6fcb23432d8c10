"""torch.varlen: torch.nn.attention.varlen.varlen_attn (built-in FlashAttention-2).

Packed (total_tokens, heads, dim) inputs with cu_seqlens: documents are
the cu_seqlens themselves; full, causal and sliding windows are one
sequence per batch row with window_size ((-1, 0) is causal: varlen_attn
derives is_causal from exactly that tuple). GQA through enable_gqa where the
installed varlen_attn takes it (torch 2.13 does); otherwise K/V heads are
repeated inside the timed function, and Support.how says which. CUDA only:
the kernel is aten's _flash_attention_forward.
"""

from __future__ import annotations

import inspect

import torch

from lcab.backend import Backend, Support
from lcab.workloads import Workload
from torch_backends import device
from torch_backends.kernels import flash_style


def _varlen_attn():
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn


def takes_enable_gqa() -> bool:
    """Whether the installed varlen_attn has an enable_gqa argument."""
    return "enable_gqa" in inspect.signature(_varlen_attn()).parameters


class VarlenBackend(Backend):
    name = "torch.varlen"
    framework = "torch"
    description = "torch.nn.attention.varlen.varlen_attn (built-in FlashAttention-2, cu_seqlens)"
    layout = "bshd"
    dtypes = flash_style.LOW_PRECISION
    head_dims = flash_style.FLASH_HEAD_DIMS
    requires = ("torch.nn.attention.varlen",)
    claimed_masks = flash_style.FLASH_FAMILIES
    no_ring_kernel = ("varlen_attn's log-sum-exp (return_aux) carries no gradient, and the "
                      "torch ring differentiates each step's")

    @classmethod
    def environment_problem(cls) -> str | None:
        problem = device.cuda_problem()
        if problem is None and not torch.backends.cuda.is_flash_attention_available():
            problem = f"torch {torch.__version__} was built without FlashAttention"
        return problem

    @staticmethod
    def _gqa_how(workload: Workload) -> str:
        if workload.heads_q == workload.heads_kv:
            return ""
        return "enable_gqa" if takes_enable_gqa() else "K/V heads repeated (no enable_gqa here)"

    def plan(self, workload: Workload) -> tuple[Support, dict]:
        return flash_style.flash_support("varlen_attn", workload, self._gqa_how(workload))

    def build(self, workload: Workload):
        plan = self.planned_kwargs(workload)["plan"]
        varlen_attn = _varlen_attn()
        batch, seqlen = workload.batch, workload.seqlen_q
        cu_host, longest = flash_style.batch_cu_seqlens(plan, batch, seqlen)
        cu = torch.from_numpy(cu_host).to("cuda")
        native_gqa = workload.gqa_ratio > 1 and takes_enable_gqa()
        repeat = 1 if native_gqa else workload.gqa_ratio
        extra = {"enable_gqa": True} if native_gqa else {}
        window = tuple(plan.window)  # a tuple: varlen_attn compares it with (-1, 0)

        def attend(q, k, v):
            k = flash_style.repeat_kv_heads(k, repeat, head_axis=2)
            v = flash_style.repeat_kv_heads(v, repeat, head_axis=2)
            out = varlen_attn(
                *(flash_style.pack_sequences(x) for x in (q, k, v)),
                cu, cu, longest, longest, window_size=window, **extra,
            )
            return out.reshape(q.shape)

        return attend
