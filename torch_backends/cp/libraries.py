"""PyTorch CP strategies of established libraries, on the masks they compute.

- `torch.cp_ring` / `torch.cp_usp`: yunchang's LongContextAttention (a ring,
  or Ulysses inside groups of `ulysses_size` ranks with a ring across them)
  with flash-attn inside. yunchang's torch SDPA attention types are not
  usable for a ring in yunchang 0.6.4: the math and cuDNN types return a
  zero log-sum-exp (so the ring's merge is wrong) and every torch type's
  backward raises NotImplemented; so flash_attn is required.
- `torch.cp_ring_flash_attn`: ring-flash-attn's ring and zigzag ring (full,
  causal) and its Llama-3 varlen all-gather for packed documents.
- `torch.cp_native`: torch's own context parallel (DTensor dispatch of the
  CUDA SDPA kernels to a ring; K/V rotated by all-gather or all-to-all),
  with its head-tail load balancer for the zigzag dispatch.

These libraries take a causal flag (and a window applied per block without
a global offset), so each states exactly which masks and dispatches it
computes; everything else is UNSUPPORTED, never approximated. They need
CUDA (flash-attn, or the CUDA SDPA kernels).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import numpy as np
import torch

from lcab import expressions
from lcab.backend import Support
from lcab.cp import Dispatch, ulysses_heads_problem
from lcab.workloads import Workload
from torch_backends import distributed
from torch_backends.cp.base import TorchCpBackend
from torch_backends.device import cuda_problem
from torch_backends.kernels.flash_style import LOW_PRECISION, pack_sequences, repeat_kv_heads

_LAYOUT_BY_DISPATCH = {"contiguous": "basic", "zigzag": "zigzag"}


def causal_or_full(mask) -> bool | None:
    """True for causal, False for full, None for any other mask."""
    return expressions.causal_flag(mask)


def _refusal(library: str, what: str, mask) -> str:
    return (f"{library} computes {what} only (its causal/window flags apply per block, "
            f"without a global offset); the {mask.name} mask is not one of them")


def usp_dispatch(layout: str, seqlen: int, ring: int, ulysses: int) -> Dispatch:
    """yunchang's token layout as an lcab Dispatch: world rank w is ring rank
    w // ulysses and Ulysses rank w % ulysses (consecutive ranks form a
    Ulysses group); `basic` gives each rank a contiguous piece, `zigzag`
    gives ring rank r chunks r and 2 ring - 1 - r, split among its group."""
    ranks = ring * ulysses
    ranges = []
    for world in range(ranks):
        r, u = divmod(world, ulysses)
        if layout == "basic":
            piece = seqlen // ranks
            ranges.append(((world * piece, (world + 1) * piece),))
            continue
        chunk = seqlen // (2 * ring)
        held = np.concatenate([np.arange(r * chunk, (r + 1) * chunk),
                               np.arange((2 * ring - 1 - r) * chunk, (2 * ring - r) * chunk)])
        mine = np.array_split(held, ulysses)[u]
        ranges.append(_as_ranges(mine))
    return Dispatch(f"yunchang_{layout}", ranks, seqlen, tuple(ranges))


def _as_ranges(tokens: np.ndarray) -> tuple[tuple[int, int], ...]:
    breaks = np.flatnonzero(np.diff(tokens) != 1) + 1
    return tuple((int(part[0]), int(part[-1]) + 1) for part in np.split(tokens, breaks))


class _LibraryBackend(TorchCpBackend):
    """CUDA-only library strategies: low precision, flash-attn (FA2) inside
    unless said otherwise; `dispatch()` refuses the layouts a library lacks."""

    dtypes = LOW_PRECISION

    @classmethod
    def environment_problem(cls) -> str | None:
        return cuda_problem() or super().environment_problem()

    def inner(self) -> tuple[str, dict[str, str]]:
        return "torch.flash_attn", {}


# ----- yunchang -------------------------------------------------------------
_groups: dict[tuple[int, int], tuple] = {}


def _yunchang_groups(ulysses: int, ring: int) -> None:
    """Point yunchang's global process groups at a (ulysses, ring) split,
    creating them once: every rank must create the same groups in order."""
    from yunchang import set_seq_parallel_pg
    from yunchang.globals import PROCESS_GROUP

    key = (ulysses, ring)
    if key not in _groups:
        set_seq_parallel_pg(ulysses, ring, distributed.rank(), distributed.world_size())
        _groups[key] = (PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG)
    PROCESS_GROUP.ULYSSES_PG, PROCESS_GROUP.RING_PG = _groups[key]


class YunchangRingBackend(_LibraryBackend):
    name = "torch.cp_ring"
    strategy = "ring"
    requires = ("torch", "yunchang", "flash_attn")
    description = ("yunchang's ring attention (LongContextAttention, ring_impl_type basic for "
                   "the contiguous dispatch, zigzag for zigzag), flash-attn inside")

    @property
    def ulysses_size(self) -> int:
        return 1

    def dispatch(self, workload):
        layout = _LAYOUT_BY_DISPATCH.get(self.dispatch_name)
        if layout is None:
            raise ValueError(f"yunchang lays tokens out contiguously (basic) or zigzag, not "
                             f"{self.dispatch_name}")
        ring = self.cp_size // self.ulysses_size
        if workload.seqlen_q % (2 * ring * self.ulysses_size):
            raise ValueError(f"seqlen {workload.seqlen_q} does not split into yunchang's chunks")
        return usp_dispatch(layout, workload.seqlen_q, ring, self.ulysses_size)

    def strategy_support(self, workload, dispatch):
        if causal_or_full(workload.mask) is None:
            return Support.no(_refusal("yunchang's ring", "full and causal masks", workload.mask))
        u = self.ulysses_size
        if self.cp_size % u:
            return Support.no(f"ulysses_size {u} does not divide cp_size {self.cp_size}")
        problem = ulysses_heads_problem(workload, u, "ulysses_size")
        if problem:
            return Support.no(problem)
        ring = _LAYOUT_BY_DISPATCH[self.dispatch_name]
        return Support.yes(self.describe(f"yunchang ring_impl_type={ring}, ulysses {u} x ring "
                                         f"{self.cp_size // u}; flash-attn inside"))

    def build(self, workload):
        from yunchang import LongContextAttention
        from yunchang.kernels import AttnType

        dispatch = self.dispatch(workload)
        u = self.ulysses_size
        _yunchang_groups(u, self.cp_size // u)
        attention = LongContextAttention(ring_impl_type=_LAYOUT_BY_DISPATCH[self.dispatch_name],
                                         attn_type=AttnType.FA)
        causal = bool(causal_or_full(workload.mask))
        scale = workload.head_dim ** -0.5

        def local(q, k, v):
            return attention(q, k, v, softmax_scale=scale, causal=causal)

        return self.sharded(local, dispatch)


class YunchangUspBackend(YunchangRingBackend):
    name = "torch.cp_usp"
    strategy = "usp"
    options = {**YunchangRingBackend.options, "ulysses_size": int}
    description = ("yunchang's USP: Ulysses inside groups of ulysses_size consecutive ranks, "
                   "its ring across the groups, flash-attn inside")

    def __init__(self, ulysses_size: int = 2, **options):
        super().__init__(**options)
        self._ulysses_size = ulysses_size

    @property
    def ulysses_size(self) -> int:
        return self._ulysses_size

    def probe_heads_kv(self, workload):
        return min(workload.heads_kv, self.ulysses_size)

    def imbalance(self, workload, dispatch, *, by_tiles: bool = False) -> float:
        # Work is spread by ring rank: a Ulysses group attends its tokens together.
        ring = self.cp_size // self.ulysses_size
        grouped = usp_dispatch(_LAYOUT_BY_DISPATCH[self.dispatch_name], workload.seqlen_q,
                               ring, 1)
        return super().imbalance(workload, grouped, by_tiles=by_tiles)


# ----- ring-flash-attn ------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _RingFlashPlan:
    function: str  # ring_flash_attn_func, zigzag_ring_flash_attn_func, llama3_...
    causal: bool
    doc_cu_seqlens: np.ndarray | None = None


class RingFlashAttnBackend(_LibraryBackend):
    name = "torch.cp_ring_flash_attn"
    strategy = "ring_flash_attn"
    requires = ("torch", "ring_flash_attn", "flash_attn")
    description = ("ring-flash-attn: ring (contiguous) and zigzag ring for full and causal; "
                   "Llama-3 varlen all-gather for packed documents (contiguous)")

    def dispatch(self, workload):
        if self.dispatch_name not in ("contiguous", "zigzag"):
            raise ValueError(f"ring-flash-attn lays tokens out contiguously or zigzag, not "
                             f"{self.dispatch_name}")
        return super().dispatch(workload)

    def ring_plan(self, workload: Workload) -> _RingFlashPlan | str:
        causal = causal_or_full(workload.mask)
        if causal is not None:
            function = {"contiguous": "ring_flash_attn_func",
                        "zigzag": "zigzag_ring_flash_attn_func"}[self.dispatch_name]
            return _RingFlashPlan(function, causal)
        documents = expressions.cu_seqlens(workload.mask)
        if documents is None:
            return _refusal("ring-flash-attn", "full, causal and packed-document masks",
                            workload.mask)
        if self.dispatch_name != "contiguous":
            return "ring-flash-attn's Llama-3 varlen path needs the contiguous dispatch"
        if workload.batch != 1:
            return "ring-flash-attn's Llama-3 varlen path packs one sequence: batch must be 1"
        cu, causal = documents
        return _RingFlashPlan("llama3_flash_attn_varlen_func", causal, np.asarray(cu))

    def strategy_support(self, workload, dispatch):
        plan = self.ring_plan(workload)
        if isinstance(plan, str):
            return Support.no(plan)
        return Support.yes(self.describe(f"{plan.function} "
                                         f"({'causal' if plan.causal else 'full'})"))

    def build(self, workload):
        import ring_flash_attn

        plan = self.ring_plan(workload)
        dispatch = self.dispatch(workload)
        function = getattr(ring_flash_attn, plan.function)
        scale = workload.head_dim ** -0.5
        if plan.doc_cu_seqlens is None:
            def local(q, k, v):
                return function(q, k, v, softmax_scale=scale, causal=plan.causal)

            return self.sharded(local, dispatch)

        device = torch.device("cuda", torch.cuda.current_device())
        cu = torch.as_tensor(plan.doc_cu_seqlens, dtype=torch.int32, device=device)
        cu_q, cu_k, max_q, max_k, k_slice = ring_flash_attn.llama3_flash_attn_prepare_cu_seqlens(
            cu, causal=plan.causal, rank=distributed.rank(), world_size=self.cp_size)

        def local(q, k, v):
            packed = [pack_sequences(x) for x in (q, k, v)]
            out = function(*packed, cu_q, cu_k, max_q, max_k, heads_k_stride=k.shape[2],
                           local_k_slice=k_slice, softmax_scale=scale, causal=plan.causal)
            return out.reshape(q.shape)

        return self.sharded(local, dispatch)


# ----- torch's native context parallel ---------------------------------------
_SDPA_KERNELS = ("cudnn", "flash", "efficient")
_ROTATE_METHODS = ("allgather", "alltoall")


class NativeCpBackend(_LibraryBackend):
    name = "torch.cp_native"
    strategy = "native"
    requires = ("torch",)
    options = {**TorchCpBackend.options, "rotate": str, "sdpa": str}
    description = ("torch.distributed.tensor.experimental context parallel: DTensor dispatch "
                   "of the CUDA SDPA kernel (sdpa option) to a ring, K/V rotated by "
                   "all-gather or all-to-all (rotate option), head-tail balance for zigzag")
    # torch's ring assumes head-tail order exactly when load balancing is on.
    _balanced_by: ClassVar[dict[str, bool]] = {"contiguous": False, "zigzag": True}

    def __init__(self, rotate: str = "allgather", sdpa: str = "cudnn", **options):
        super().__init__(**options)
        if rotate not in _ROTATE_METHODS:
            raise ValueError(f"rotate={rotate!r} is not one of {', '.join(_ROTATE_METHODS)}")
        if sdpa not in _SDPA_KERNELS:
            raise ValueError(f"sdpa={sdpa!r} is not one of {', '.join(_SDPA_KERNELS)}")
        self.rotate, self.sdpa = rotate, sdpa

    def dispatch(self, workload):
        if self.dispatch_name not in self._balanced_by:
            raise ValueError("torch's context parallel shards contiguously or head-tail "
                             f"(zigzag), not {self.dispatch_name}")
        return super().dispatch(workload)

    def inner(self) -> tuple[str, dict[str, str]]:
        return f"torch.sdpa_{self.sdpa}", {}

    def strategy_support(self, workload, dispatch):
        if causal_or_full(workload.mask) is None:
            return Support.no(_refusal("torch's context parallel", "full and causal masks",
                                       workload.mask))
        repeat = "; K/V heads repeated" if workload.heads_q != workload.heads_kv else ""
        return Support.yes(self.describe(f"rotate={self.rotate}; inner torch.sdpa_{self.sdpa}"
                                         f"{repeat}"))

    def build(self, workload):
        from torch.distributed.tensor.experimental import _attention as cp
        from torch.distributed.tensor.parallel import parallelize_module
        from torch.nn.attention import SDPBackend, sdpa_kernel

        dispatch = self.dispatch(workload)
        mesh = _device_mesh(self.cp_size)
        cp.set_rotate_method(self.rotate)
        causal = bool(causal_or_full(workload.mask))
        # torch's load balancer takes causal masks only ("Load balancing
        # requires is_causal=True"). A full mask does not care where a key
        # sits, so its zigzag-ordered shards run as contiguous ones, exactly.
        balance = self._balanced_by[self.dispatch_name] and causal
        # Module-wrapper mode: the module's inputs become DTensors sharded on
        # the sequence, and the DTensor dispatcher runs SDPA as a ring.
        attention = parallelize_module(_Sdpa(), mesh, cp._ContextParallel(
            seq_dim=2, attention_type=cp._ContextParallel.AttentionType.SDPA))
        cp._enable_context_parallel_dispatcher()
        kernel = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                  "efficient": SDPBackend.EFFICIENT_ATTENTION}[self.sdpa]
        ratio = workload.gqa_ratio

        def local(q, k, v):
            cp._cp_options.enable_load_balance = balance  # a global; other cases set it too
            k, v = (repeat_kv_heads(x, ratio, head_axis=2) for x in (k, v))
            with sdpa_kernel([kernel]):
                out = attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=causal)
            return out.transpose(1, 2)

        return self.sharded(local, dispatch)


@functools.lru_cache(maxsize=4)
def _device_mesh(size: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cuda", (size,), mesh_dim_names=("cp",))


class _Sdpa(torch.nn.Module):
    def forward(self, q, k, v, is_causal=False):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
