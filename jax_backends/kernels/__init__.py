"""JAX attention kernels behind one backend interface, one module each.

- xla.py, cudnn.py: jax.nn.dot_product_attention's XLA and cuDNN paths.
- pallas_triton.py, pallas_mgpu.py: the Pallas flash attentions shipped in
  JAX (Triton lowering; Mosaic GPU on Hopper).
- tokamax.py: tokamax.dot_product_attention, one backend per implementation.
- fa3.py: FlashAttention-3 through the flash_attn3_jax wheel.
- mask_api.py: a mask stated through an API's own flag, window or document
  arguments, or the reason it cannot be; the kernels above share it.
- ring_kernel.py: the form a kernel takes inside a context-parallel ring;
  xla_ring.py is jax.xla's (dense masks, XLA einsums).

LCAB's own kernel, jax.pallas_flex, is its own package (jax_backends/pallas_flex).
"""
