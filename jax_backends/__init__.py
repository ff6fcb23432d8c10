"""JAX implementations of LCAB backends: kernels and context-parallel strategies.

Only this package (and torch_backends for PyTorch) imports a framework; the
registry in lcab imports these modules lazily, by name.
"""
