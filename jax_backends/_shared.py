"""Small helpers the JAX kernel backends share: device checks and reasons."""

from __future__ import annotations

import jax

from lcab.backend import Support
from lcab.workloads import Workload


def gpu_problem(*, capability: tuple[int, int] | None = None, exact: bool = False) -> str | None:
    """None on a CUDA GPU of the given compute capability (at least, or exactly)."""
    device = jax.devices()[0]
    if device.platform != "gpu":
        return f"needs a CUDA GPU (jax sees only {device.platform})"
    if capability is None:
        return None
    found = compute_capability(device)
    if found is None:
        return f"needs an {_sm(capability)} GPU; {device.device_kind} reports no compute capability"
    if (found != capability) if exact else (found < capability):
        wanted = _sm(capability) if exact else f"{_sm(capability)} or newer"
        return f"needs a {wanted} GPU; {device.device_kind} is {_sm(found)}"
    return None


def interpret_mode() -> bool:
    """Pallas interpret mode where jax's default platform is the CPU."""
    return jax.default_backend() == "cpu"


def pallas_platform_problem() -> str | None:
    """None where a Triton-lowered Pallas kernel runs: a CUDA GPU, or a CPU
    in interpret mode."""
    platform = jax.default_backend()
    if platform not in ("cpu", "gpu"):
        return f"runs on a CUDA GPU or, interpreted, on a CPU; jax's default is {platform}"
    return None


def compute_capability(device=None) -> tuple[int, int] | None:
    """(major, minor) of a CUDA device, None elsewhere."""
    device = device or jax.devices()[0]
    text = getattr(device, "compute_capability", None)
    if not text:
        return None
    major, minor = str(text).split(".")[:2]
    return int(major), int(minor)


def _sm(capability: tuple[int, int]) -> str:
    return f"sm{capability[0]}{capability[1]}"


# cuDNN flash attention (jax/_src/cudnn/fused_attention_stablehlo.py,
# check_is_flash_attention): head_dim a multiple of 8, up to 128, or up to 256
# from Hopper (sm90) on.
CUDNN_HEAD_DIMS = tuple(range(8, 257, 8))


def cudnn_head_dim_problem(workload: Workload) -> Support | None:
    """UNSUPPORTED for a head_dim above 128 where the GPU is older than Hopper."""
    if workload.head_dim > 128 and (compute_capability() or (0, 0)) < (9, 0):
        return Support.no(
            f"head_dim {workload.head_dim} > 128 needs an sm90 (Hopper) GPU or newer for cuDNN"
        )
    return None


def multiple_problem(workload: Workload, block: int, why: str) -> Support | None:
    """UNSUPPORTED when the sequence does not split into whole `block`-token tiles."""
    if workload.seqlen_q % block or workload.seqlen_k % block:
        return Support.no(
            f"seqlen {workload.seqlen_q} x {workload.seqlen_k} is not a multiple of {block} "
            f"({why})"
        )
    return None


def not_expressible(workload: Workload, api: str, expresses: str) -> Support:
    """The reason for a family the API cannot state exactly (no dense-mask fallback)."""
    return Support.no(
        f"{workload.mask.name} is not expressible exactly through {api}, which expresses only "
        f"{expresses}"
    )


def no_packed_documents(api: str) -> Support:
    """The reason jax.nn-style APIs give for packed documents."""
    return Support.no(
        f"{api} has no packed-document input (query_seq_lengths and "
        f"key_value_seq_lengths express padding only)"
    )


def window_shape(window: tuple[int, int]) -> str:
    """'(w, 0)', '(w, w)' or '(left, right)': the code path, not the sizes.

    Support.how names the path a case takes, and the correctness probe must
    take the same one at a smaller window, so the sizes stay out of it.
    """
    left, right = window
    if right == 0:
        return "(w, 0)"
    return "(w, w)" if left == right else "(left, right)"
