"""LCAB: the Long-Context Attention Benchmark.

The framework-neutral core: masks, workloads, FLOPs, the float64 reference,
the backend protocol and registry, the runner, results and reports.
Importing it never imports JAX or PyTorch; backends load them lazily.
"""

__version__ = "0.1.0"


def attention(q, k, v, mask, backend: str):
    """Run one backend once; see lcab.api.attention."""
    from lcab.api import attention as run

    return run(q, k, v, mask, backend)
