"""lcab.attention: run one backend once on framework arrays."""

from __future__ import annotations

from lcab import registry
from lcab.masks import AttnMask
from lcab.workloads import Workload


def attention(q, k, v, mask: AttnMask, backend: str):
    """Attention of (batch, seq, heads, head_dim) arrays through a named backend.

    q, k, v are arrays of the backend's framework (jax.Array for jax.*,
    torch.Tensor for torch.*); the output has q's shape and dtype. Raises
    registry.Unavailable when the backend cannot run here and ValueError when
    it cannot express this mask or shape exactly.
    """
    runner = registry.load_backend(backend)
    runtime = registry.load_runtime(runner.framework)
    batch, seqlen_q, heads_q, head_dim = q.shape
    _, seqlen_k, heads_kv, _ = k.shape
    workload = Workload(
        batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, runtime.dtype_name(q), mask
    )
    support = runner.supports(workload)
    if not support.ok:
        raise ValueError(f"{backend} cannot run this workload exactly: {support.reason}")
    fn = runner.build(workload)
    if runner.layout == "bhsd":
        q, k, v = (runtime.swap_seq_heads(x) for x in (q, k, v))
        return runtime.swap_seq_heads(runtime.forward(fn, q, k, v))
    return runtime.forward(fn, q, k, v)
