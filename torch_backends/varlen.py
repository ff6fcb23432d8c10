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
from torch_backends import _shared


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
    dtypes = _shared.LOW_PRECISION
    head_dims = _shared.FLASH_HEAD_DIMS
    requires = ("torch.nn.attention.varlen",)

    @classmethod
    def environment_problem(cls) -> str | None:
        problem = _shared.cuda_problem()
        if problem is None and not torch.backends.cuda.is_flash_attention_available():
            problem = f"torch {torch.__version__} was built without FlashAttention"
        return problem

    @staticmethod
    def _gqa_how(workload: Workload) -> str:
        if workload.heads_q == workload.heads_kv:
            return ""
        return "enable_gqa" if takes_enable_gqa() else "K/V heads repeated (no enable_gqa here)"

    def mask_support(self, workload: Workload) -> Support:
        plan = _shared.flash_plan(workload.mask)
        if plan is None:
            return Support.no(_shared.flash_refusal("varlen_attn", workload.mask))
        gqa = self._gqa_how(workload)
        return Support.yes("; ".join(part for part in (plan.how, gqa) if part))

    def build(self, workload: Workload):
        plan = _shared.flash_plan(workload.mask)
        if plan is None:
            raise ValueError(_shared.flash_refusal("varlen_attn", workload.mask))
        varlen_attn = _varlen_attn()
        batch, seqlen = workload.batch, workload.seqlen_q
        cu_host, longest = _shared.batch_cu_seqlens(plan, batch, seqlen)
        cu = torch.from_numpy(cu_host).to("cuda")
        native_gqa = workload.gqa_ratio > 1 and takes_enable_gqa()
        repeat = 1 if native_gqa else workload.gqa_ratio
        extra = {"enable_gqa": True} if native_gqa else {}
        window = tuple(plan.window)  # a tuple: varlen_attn compares it with (-1, 0)

        def attend(q, k, v):
            k = _shared.repeat_kv_heads(k, repeat, head_axis=2)
            v = _shared.repeat_kv_heads(v, repeat, head_axis=2)
            out = varlen_attn(
                _shared.pack_sequences(q), _shared.pack_sequences(k), _shared.pack_sequences(v),
                cu, cu, longest, longest, window_size=window, **extra,
            )
            return out.reshape(q.shape)

        return attend
