"""jax.module: a Flax nnx attention layer around any LCAB attention backend.

- attention.py: LcabAttention (q/k/v projections, the backend's attention,
  the output projection) and its FLOPs.
- backend.py: the registry's jax.module, timing the layer forward and
  forward+backward.
"""
