"""PyTorch implementations of LCAB backends: kernels and context-parallel strategies.

Only this package (and jax_backends for JAX) imports a framework; the
registry in lcab imports these modules lazily, by name.
"""
