"""FLOP counts: the one place LCAB's convention lives (design.md section 3).

Forward attention does two matmuls (Q K^T and P V) of 2 * head_dim FLOPs per
visible (q, k) pair and query head; backward counts 2.5x that (the four
gradient matmuls plus half a recompute), as FlashAttention's benchmarks do.
"""

from __future__ import annotations

DIRECTIONS = ("fwd", "bwd", "fwd_bwd")
TIMED_DIRECTIONS = ("fwd", "bwd")  # what rows report; fwd_bwd is only measured
# Multiples of the forward count; bwd is exactly 5/2 and stays integral.
_TIMES_FORWARD_X2 = {"fwd": 2, "bwd": 5, "fwd_bwd": 7}


def attention_flops(
    area: int, *, batch: int, heads_q: int, head_dim: int, direction: str = "fwd"
) -> int:
    """Exact FLOPs of attention over `area` visible (q, k) pairs."""
    if direction not in _TIMES_FORWARD_X2:
        raise ValueError(f"direction={direction!r} is not one of {DIRECTIONS}")
    forward = 4 * batch * heads_q * head_dim * int(area)
    return forward * _TIMES_FORWARD_X2[direction] // 2


def tflops_per_second(flops: int, seconds: float, devices: int = 1) -> float:
    """TFLOP/s per device: FLOPs / (seconds * devices) / 1e12."""
    if seconds <= 0 or devices <= 0:
        raise ValueError(f"{seconds=} and {devices=} must be positive")
    return flops / (seconds * devices) / 1e12
