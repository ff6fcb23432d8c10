"""PyTorch implementations of LCAB backends.

- kernels/: the kernel backends (SDPA, varlen, FlexAttention, flash-attn).
- cp/: the context-parallel strategies, one module each over cp/base.py.
- runtime.py (timing and checks), distributed.py (the torchrun process
  group), comm.py (the comm suite), device.py (which device torch uses).

Only this package (and jax_backends for JAX) imports a framework; the
registry in lcab imports these modules lazily, by name.
"""
