"""jax.cp_allgather: gather K/V over cp, then attend the local queries.

Each rank's queries meet every key, in the dispatch order the keys were
gathered in (no kernel states a rectangular S/cp x S mask with flags, so
natural order would gain nothing). An inner whose ring kernel runs from
tables (jax.pallas_flex) serves every rank from one compiled program;
any other inner builds each rank's own sub-workload, the rank choosing
its branch (lax.switch), so an inner that builds a dense mask (jax.xla)
holds every rank's S/cp x S mask as constants on each device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from jax_backends.cp import base
from lcab.backend import Backend, Support
from lcab.cp import sub_mask, sub_workload
from lcab.workloads import Workload


@functools.lru_cache(maxsize=16)
def gathered_masks(mask, dispatch) -> tuple:
    """All-gather sub-masks: rank r's queries against every key, in dispatch order."""
    every_key = [r for rank in dispatch.ranges for r in rank]
    return tuple(sub_mask(mask, rank, every_key) for rank in dispatch.ranges)


def by_rank(inner: Backend, workloads: Sequence[Workload], axis) -> Callable:
    """f(q, k, v) inside shard_map: rank r runs inner.build(workloads[r]).

    shard_map runs one program, so ranks with different sub-masks select
    their branch by jax.lax.axis_index; equal sub-workloads share one.
    """
    distinct = list(dict.fromkeys(workloads))
    functions = [(lambda q, k, v: jnp.zeros_like(q)) if base.empty(w) else inner.build(w)
                 for w in distinct]
    if len(functions) == 1:
        return functions[0]
    branch = jnp.asarray([distinct.index(workload) for workload in workloads], jnp.int32)

    def attend(q, k, v):
        return jax.lax.switch(branch[jax.lax.axis_index(axis)], functions, q, k, v)

    return attend


class RankSubMasks:
    """For a strategy whose ranks each run their own sub-mask in one call:
    without a tabled kernel, each rank's branch is chosen by lax.switch
    (by_rank), and the support says so."""

    def inner_support(self, workload, dispatch):
        support = super().inner_support(workload, dispatch)
        if not support.ok or self.tabled_kernel() is not None:
            return support
        return Support.yes(f"{support.how}; each rank's own sub-mask (lax.switch on the rank)",
                           support.directions)


class AllGatherBackend(RankSubMasks, base.ContextParallelBackend):
    name = "jax.cp_allgather"
    strategy = "allgather"
    description = "all-gather K/V over cp, then attend the local queries (inner kernel inside)"

    def sub_workloads(self, workload, dispatch):
        return [(f"rank {r}", sub_workload(workload, mask))
                for r, mask in enumerate(gathered_masks(workload.mask, dispatch))]

    def local_attention(self, workload, dispatch):
        kernel = self.tabled_kernel()
        if kernel is None:
            subs = [w for _, w in self.sub_workloads(workload, dispatch)]
            attend = by_rank(self.inner_backend, subs, base.AXIS)

            def per_rank(q, k, v):
                k, v = (jax.lax.all_gather(x, base.AXIS, axis=1, tiled=True) for x in (k, v))
                return attend(q, k, v)

            return base.shard_map(per_rank, self.mesh(), in_specs=(base.SEQUENCE,) * 3,
                                  out_specs=base.SEQUENCE)

        kernel, tables = kernel.bind(gathered_masks(workload.mask, dispatch), workload)

        def per_rank_tabled(q, k, v, tables):
            k, v = (jax.lax.all_gather(x, base.AXIS, axis=1, tiled=True) for x in (k, v))
            out, _ = kernel.attend(q, k, v, base.own(tables))
            return out

        return base.with_tables(per_rank_tabled, self.mesh(), tables)
