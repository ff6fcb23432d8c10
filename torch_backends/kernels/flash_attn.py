"""torch.flash_attn / torch.fa3 / torch.fa4: the FlashAttention packages.

- flash_attn (FA2): flash_attn_func / flash_attn_varlen_func; Ampere and newer.
- flash_attn_interface (FA3, built from the repository's hopper/): Hopper only.
- flash_attn.cute (FA4, CuTe DSL): Hopper and Blackwell.

Each is used when installed and UNAVAILABLE with the import error
otherwise. They express exactly the same families, in the same vocabulary
(torch_backends.kernels.flash_style.flash_plan): full and causal through `causal`,
sliding windows through `window_size`, packed documents through
cu_seqlens in the varlen function; nothing else. GQA is native (K/V with
fewer heads). Layout (batch, seq, heads, dim); varlen calls pack it to
(tokens, heads, dim).
"""

from __future__ import annotations

import importlib
from typing import ClassVar

import torch

from lcab.backend import Backend, Support
from lcab.workloads import Workload
from torch_backends import device
from torch_backends.kernels import flash_style


class _FlashAttnPackage(Backend):
    framework = "torch"
    layout = "bshd"
    dtypes = flash_style.LOW_PRECISION
    claimed_masks = flash_style.FLASH_FAMILIES
    no_ring_kernel = ("LCAB's torch ring has no step kernel for the flash-attn packages "
                      "(it differentiates each step's log-sum-exp through autograd)")
    module: ClassVar[str]  # where flash_attn_func and flash_attn_varlen_func live
    compute_capabilities: ClassVar[tuple[int, ...]]  # major versions the package builds for
    # How the package spells an unbounded window side.
    unbounded: ClassVar[int | None] = -1

    @classmethod
    def environment_problem(cls) -> str | None:
        problem = device.cuda_problem()
        if problem is None:
            major, minor = torch.cuda.get_device_capability()
            if major not in cls.compute_capabilities:
                problem = (
                    f"{cls.module} runs on compute capability {cls.compute_capabilities}.x, "
                    f"this GPU is sm{major}{minor}"
                )
        return problem

    def plan(self, workload: Workload) -> tuple[Support, dict]:
        gqa = "GQA native" if workload.heads_q != workload.heads_kv else ""
        return flash_style.flash_support(self.module, workload, gqa)

    def _window(self, plan: flash_style.FlashPlan) -> tuple[bool, tuple]:
        """(causal, window_size) arguments: causal by its flag, other windows as given."""
        if plan.causal:
            return True, (self.unbounded, self.unbounded)
        return False, tuple(self.unbounded if side == -1 else side for side in plan.window)

    def build(self, workload: Workload):
        plan = self.planned_kwargs(workload)["plan"]
        package = importlib.import_module(self.module)
        causal, window = self._window(plan)
        if plan.doc_cu_seqlens is None:
            dense_call = package.flash_attn_func

            def attend(q, k, v):
                return _output(dense_call(q, k, v, causal=causal, window_size=window))

            return attend
        varlen_call = package.flash_attn_varlen_func
        cu_host, longest = flash_style.batch_cu_seqlens(plan, workload.batch,
                                                        workload.seqlen_q)
        cu = torch.from_numpy(cu_host).to("cuda")

        def attend_documents(q, k, v):
            out = varlen_call(
                *(flash_style.pack_sequences(x) for x in (q, k, v)),
                cu, cu, longest, longest, causal=causal, window_size=window,
            )
            return _output(out).reshape(q.shape)

        return attend_documents


def _output(result):
    """The attention output: FA3 (older builds) and FA4 also return the LSE."""
    return result[0] if isinstance(result, tuple) else result


class FlashAttn2Backend(_FlashAttnPackage):
    name = "torch.flash_attn"
    description = "flash-attn 2 package (flash_attn_func / flash_attn_varlen_func)"
    requires = ("flash_attn",)
    module = "flash_attn"
    compute_capabilities = (8, 9, 10, 11, 12)  # Ampere and newer
    head_dims = flash_style.FLASH_HEAD_DIMS  # "all head dimensions up to 256"


class FlashAttn3Backend(_FlashAttnPackage):
    name = "torch.fa3"
    description = "FlashAttention-3 (flash_attn_interface, Hopper)"
    requires = ("flash_attn_interface",)
    module = "flash_attn_interface"
    compute_capabilities = (9,)
    head_dims = (64, 96, 128, 192, 256)  # the head dims its kernels are built for


class FlashAttn4Backend(_FlashAttnPackage):
    name = "torch.fa4"
    description = "FlashAttention-4 (flash_attn.cute, CuTe DSL)"
    requires = ("flash_attn.cute",)
    module = "flash_attn.cute"
    compute_capabilities = (9, 10, 11)
    head_dims = (64, 96, 128)  # its interface lists hdim 64, 96, 128 (192/128 is d_qk != d_v)
    unbounded = None  # FA4 spells an unbounded window side None
