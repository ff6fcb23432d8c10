"""Helpers shared by the torch kernel backends (no backend lives here).

- `cuda_problem`: the UNAVAILABLE reason of GPU-only backends.
- `FlashPlan` / `flash_plan`: a mask in FlashAttention's vocabulary (a
  window over packed sequences), shared by torch.varlen and the flash-attn
  packages, which express exactly the same families.
- `pack_sequences`: (batch, seq, heads, dim) -> (tokens, heads, dim) plus
  the cu_seqlens of every document of every batch row.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from lcab import expressions
from lcab.masks import AttnMask

# Head dims the FlashAttention-2 kernels take (theirs and torch's built-in
# copy): multiples of 8 up to 256.
FLASH_HEAD_DIMS = tuple(range(8, 257, 8))
LOW_PRECISION = ("bfloat16", "float16")


def device_name() -> str:
    """Where this process's tensors go: its CUDA device (under torchrun the
    rank's own), else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def cuda_problem() -> str | None:
    """None when a CUDA GPU is visible to torch; otherwise why not."""
    if torch.cuda.is_available():
        return None
    build = f"torch {torch.__version__}" + (
        f" (CUDA {torch.version.cuda})" if torch.version.cuda else " (a CPU-only build)"
    )
    return f"needs a CUDA GPU, and {build} sees none (torch.cuda.is_available() is False)"


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


def flash_refusal(backend: str, mask: AttnMask) -> str:
    return (
        f"{backend} expresses full, causal, sliding-window (window_size) and packed-document "
        f"(cu_seqlens) masks only; the {mask.name} mask ({mask.seqlen_q} x {mask.seqlen_k}) "
        "is none of these"
    )


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
