"""LCAB: the Long-Context Attention Benchmark.

The framework-neutral spec layer: masks, workloads, FLOPs and the float64
reference. Importing it never imports JAX or PyTorch.
"""

__version__ = "0.1.0"
