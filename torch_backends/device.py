"""Which device this process's torch uses, and why a GPU-only backend cannot run."""

from __future__ import annotations

import torch


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
