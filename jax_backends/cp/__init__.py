"""JAX context parallelism on a `cp` mesh axis with jax.shard_map, one
module per strategy:

- base.py: what every strategy shares (options, dispatch, the inner
  kernel and its support of every rank's sub-mask, the mesh, the
  dispatched call the runtime times).
- allgather.py: jax.cp_allgather (gather K/V, attend the local queries).
- ring.py: jax.cp_ring and jax.cp_double_ring (K/V rotate with ppermute,
  partial results merged by log-sum-exp, dK/dV travel home in the
  backward), and the (ring x Ulysses) mesh USP shares.
- ulysses.py: jax.cp_ulysses (all_to_all from sequence- to head-sharded).
- usp.py: jax.cp_usp (Ulysses inside groups, a ring across them).

Strategies ask their inner kernel what it can do (Backend.supports,
Backend.ring_kernel); none names a kernel.
"""
