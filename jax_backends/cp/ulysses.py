"""jax.cp_ulysses: all_to_all from sequence- to head-sharded, the inner
kernel over the whole sequence for the rank's share of the heads, and
all_to_all back. Where cp exceeds the K/V heads, each K/V head is first
repeated (lcab.cp.ulysses_kv_repeat) so that every rank holds the K/V head
of its query heads, as the seed blog runs Ulysses at cp 16-64 with 8 K/V
heads; the K/V all_to_all then moves that many more bytes.

An inner whose ring kernel runs from tables (any sub-mask from its
slices) takes the tokens in dispatch order; any other inner gets them back
in natural order (a local gather), so kernels with flags see the plain
mask.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_backends.cp import base
from lcab.backend import Support
from lcab.cp import sub_mask, sub_workload, ulysses_heads_problem, ulysses_kv_repeat


def is_identity(order) -> bool:
    return np.array_equal(order, np.arange(len(order)))


class UlyssesBackend(base.ContextParallelBackend):
    name = "jax.cp_ulysses"
    strategy = "ulysses"
    description = ("Ulysses: all_to_all from sequence- to head-sharded, attention over the "
                   "whole sequence, all_to_all back (inner kernel inside)")

    def probe_heads_kv(self, workload):
        return min(workload.heads_kv, self.cp_size)  # a smaller count would not split

    def strategy_problem(self, workload):
        return ulysses_heads_problem(workload, self.cp_size, "cp_size", repeat_kv=True)

    def imbalance(self, workload, dispatch, *, by_tiles: bool = False) -> float:
        return 1.0  # every rank attends the whole sequence for its share of the heads

    def in_dispatch_order(self) -> bool:
        return self.tabled_kernel() is not None

    def sequence_mask(self, workload, dispatch):
        """The mask the inner sees: the tokens in dispatch order, or in
        natural order (the plain mask)."""
        if not self.in_dispatch_order():
            return workload.mask
        every_token = [r for rank in dispatch.ranges for r in rank]
        return sub_mask(workload.mask, every_token, every_token)

    def sub_workloads(self, workload, dispatch):
        mask = self.sequence_mask(workload, dispatch)
        repeated = dataclasses.replace(
            workload, heads_kv=workload.heads_kv * ulysses_kv_repeat(workload, self.cp_size))
        return [("every rank", sub_workload(repeated, mask, self.cp_size))]

    def inner_support(self, workload, dispatch):
        support = super().inner_support(workload, dispatch)
        if not support.ok:
            return support
        how = support.how
        if (repeat := ulysses_kv_repeat(workload, self.cp_size)) > 1:
            how += f"; each K/V head repeated {repeat}x (cp {self.cp_size} > " \
                   f"{workload.heads_kv} K/V heads)"
        if not self.in_dispatch_order() and not is_identity(dispatch.order()):
            how += "; tokens gathered back to natural order"
        return Support.yes(how, support.directions)

    def local_attention(self, workload, dispatch):
        attend = self.inner_backend.build(self.sub_workloads(workload, dispatch)[0][1])
        if not self.in_dispatch_order():
            attend = natural_order(attend, dispatch.order())

        repeat = ulysses_kv_repeat(workload, self.cp_size)

        def per_rank(q, k, v):
            if repeat > 1:  # copies side by side: head j serves query group j // repeat
                k, v = (jnp.repeat(x, repeat, axis=2) for x in (k, v))
            # (b, S/cp, h, d) -> (b, S, h/cp, d): a contiguous block of heads
            # keeps every query head with its K/V head.
            q, k, v = (jax.lax.all_to_all(x, base.AXIS, 2, 1, tiled=True) for x in (q, k, v))
            return jax.lax.all_to_all(attend(q, k, v), base.AXIS, 1, 2, tiled=True)

        return base.shard_map(per_rank, self.mesh(), in_specs=(base.SEQUENCE,) * 3,
                              out_specs=base.SEQUENCE)


def natural_order(attend, order):
    """attend on tokens put back in natural order, its output back in dispatch order."""
    if is_identity(order):
        return attend  # contiguous: already natural
    natural, back = jnp.asarray(np.argsort(order)), jnp.asarray(order)

    def reordered(q, k, v):
        q, k, v = (jnp.take(x, natural, axis=1) for x in (q, k, v))
        return jnp.take(attend(q, k, v), back, axis=1)

    return reordered
