"""jax.pallas_flex: LCAB's own flexible-mask flash attention, in Pallas.

- plan.py: the host-side tile plan of a mask (which tiles each program
  visits, full or partial), built once per mask and block size.
- triton.py: the kernels through Pallas's Triton lowering (any GPU; Pallas
  interpret mode on a CPU), with their launch Config.
- mosaic_fwd_sm90.py, mosaic_bwd_sm90.py: the forward and the backward
  through Mosaic GPU on Hopper (wgmma, TMA, warp specialised), each with
  its own Config.
- ops.py: the op: lowering chosen per direction, padding, custom VJP.
- schedule.py: how the dK/dV programs are split and launched (host
  arithmetic on a plan, without JAX); head_split.py: the split itself.
- changed_rows.py: which measured rows a registry Change can move.
- ring.py: the op as a context-parallel ring's inner kernel.
- backend.py: the registry's jax.pallas_flex and its options.

The kernel's development log, with the variants that lost and their
numbers, is docs/pallas_flex.md.
"""
