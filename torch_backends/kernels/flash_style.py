"""What the FlashAttention-style torch kernels share (no backend lives here).

- `FLASH_HEAD_DIMS`, `LOW_PRECISION`: their head dims and dtypes.
- `FlashPlan` / `flash_plan` / `flash_support`: a mask in FlashAttention's
  vocabulary (a window over packed sequences), shared by torch.varlen and
  the flash-attn packages, which express exactly the same families
  (`FLASH_FAMILIES`).
- `pack_sequences` / `batch_cu_seqlens`: (batch, seq, heads, dim) ->
  (tokens, heads, dim) plus the cu_seqlens of every document of every row.
- `repeat_kv_heads`: GQA for a kernel that takes none.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from lcab import expressions
from lcab.backend import Support
from lcab.masks import AttnMask
from lcab.workloads import Workload

# Head dims the FlashAttention-2 kernels take (theirs and torch's built-in
# copy): multiples of 8 up to 256.
FLASH_HEAD_DIMS = tuple(range(8, 257, 8))
LOW_PRECISION = ("bfloat16", "float16")
# The mask families a window over packed documents expresses.
FLASH_FAMILIES = frozenset({"full", "causal", "sliding_window", "sliding_window_causal",
                            "full_document", "causal_document"})


@dataclasses.dataclass(frozen=True)
class FlashPlan:
    """How a FlashAttention-style kernel runs a mask exactly.

    `window` is (left, right) in FlashAttention's convention (-1 unbounded;
    (-1, 0) is causal, (-1, -1) no mask); `doc_cu_seqlens` lists the
    documents of one batch row (None: the row is one sequence). `how` names
    the code path, never a size: the correctness probe must take the same
    path at a smaller size (lcab.validation.choose_probe).
    """

    window: tuple[int, int]
    doc_cu_seqlens: np.ndarray | None
    how: str

    @property
    def causal(self) -> bool:
        return self.window == (-1, 0)


def flash_plan(mask: AttnMask) -> FlashPlan | None:
    """The plan for `mask`, or None when no window over documents is it."""
    causal = expressions.causal_flag(mask)
    if causal is not None:
        return FlashPlan((-1, 0) if causal else (-1, -1), None, "causal" if causal else "no mask")
    window = expressions.sliding_window(mask)
    if window is not None:
        return FlashPlan(window, None, "window_size")
    documents = expressions.cu_seqlens(mask)
    if documents is not None:
        cu, causal = documents
        inside = "causal" if causal else "full"
        return FlashPlan((-1, 0) if causal else (-1, -1), cu, f"cu_seqlens ({inside} documents)")
    return None


def flash_support(kernel: str, workload: Workload, gqa_how: str) -> tuple[Support, dict]:
    """A FlashAttention-style backend's Backend.plan: (Support, {"plan": FlashPlan})."""
    plan = flash_plan(workload.mask)
    if plan is None:
        mask = workload.mask
        return Support.no(
            f"{kernel} expresses full, causal, sliding-window (window_size) and packed-document "
            f"(cu_seqlens) masks only; the {mask.name} mask ({mask.seqlen_q} x {mask.seqlen_k}) "
            "is none of these"), {}
    return Support.yes("; ".join(part for part in (plan.how, gqa_how) if part)), {"plan": plan}


def batch_cu_seqlens(plan: FlashPlan, batch: int, seqlen: int) -> tuple[np.ndarray, int]:
    """(cu_seqlens over all batch rows, longest sequence) for a packed call.

    Every batch row repeats the same documents (or is one sequence), shifted
    by seqlen tokens per row.
    """
    one_row = plan.doc_cu_seqlens
    if one_row is None:
        one_row = np.array([0, seqlen], dtype=np.int64)
    starts = one_row[:-1][None, :] + seqlen * np.arange(batch)[:, None]
    cu = np.append(starts.reshape(-1), batch * seqlen).astype(np.int32)
    return cu, int(np.max(np.diff(one_row)))


def pack_sequences(x: torch.Tensor) -> torch.Tensor:
    """(batch, seq, heads, dim) -> (batch * seq, heads, dim), a view when contiguous."""
    batch, seqlen, heads, dim = x.shape
    return x.reshape(batch * seqlen, heads, dim)


def repeat_kv_heads(x: torch.Tensor, ratio: int, head_axis: int) -> torch.Tensor:
    """Each K/V head repeated `ratio` times, in the query heads' order."""
    return x if ratio == 1 else x.repeat_interleave(ratio, dim=head_axis)
