"""jax.cp_ring and jax.cp_double_ring: K/V rotate over the ring with
ppermute while each step's kernel runs; partial results merge by
log-sum-exp; a custom_vjp backward takes each step's share of the
gradients from the final out and lse, and dK/dV travel with their shard
and end at its owner.

The inner kernel must offer a ring kernel (Backend.ring_kernel: (out, lse)
and per-block gradients); every rank and step attends its own exact
sub-mask. With `ulysses_size` > 1 the ranks form a (ring, ulysses) mesh:
Ulysses all_to_all inside each group, the ring across the groups (USP's
layout, jax_backends/cp/usp.py). The double ring (LoongTrain's) moves
shards inside windows of consecutive ring ranks, then to the next window.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from jax_backends.cp import base
from lcab.backend import Support
from lcab.cp import sub_mask, sub_workload, ulysses_heads_problem
from lcab.workloads import Workload

_USP_SEQUENCE = PartitionSpec(None, ("ring", "ulysses"))  # ring-major, then Ulysses


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Which K/V shard every rank holds at each step, and how shards move.

    moves[s] are the (from, to) ppermute pairs after step s; home the pairs
    that take every shard from its last holder back to its owner (dK/dV
    travel with their shard and end there); sources[s][r] the owner of the
    shard rank r holds at step s.
    """

    moves: tuple[tuple[tuple[int, int], ...], ...]
    home: tuple[tuple[int, int], ...]
    sources: tuple[tuple[int, ...], ...]


def _schedule(ranks: int, moves) -> Schedule:
    holder = list(range(ranks))  # holder[r]: owner of the shard at rank r
    sources = [tuple(holder)]
    for pairs in moves:
        moved = list(holder)
        for source, target in pairs:
            moved[target] = holder[source]
        holder = moved
        sources.append(tuple(holder))
    for rank in range(ranks):
        if sorted(step[rank] for step in sources) != list(range(ranks)):
            raise ValueError(f"rank {rank} does not meet every shard exactly once")
    home = tuple((rank, holder[rank]) for rank in range(ranks))
    return Schedule(tuple(tuple(p) for p in moves), home, tuple(sources))


def ring_schedule(ranks: int) -> Schedule:
    shift = tuple((r, (r + 1) % ranks) for r in range(ranks))
    return _schedule(ranks, [shift] * (ranks - 1))


def double_ring_schedule(ranks: int, window: int) -> Schedule:
    """LoongTrain's double ring: shards circle inside windows of `window`
    consecutive ranks (the fast links), then step to the next window."""
    if window < 1 or ranks % window:
        raise ValueError(f"window {window} does not divide {ranks} ranks")
    windows = ranks // window

    def rank(a, b):
        return (a % windows) * window + b % window

    inner = tuple((rank(a, b), rank(a, b + 1)) for a in range(windows) for b in range(window))
    outer = tuple((rank(a, b), rank(a + 1, b + 1)) for a in range(windows)
                  for b in range(window))
    moves = [outer if (step + 1) % window == 0 else inner for step in range(ranks - 1)]
    return _schedule(ranks, moves)


@functools.lru_cache(maxsize=16)
def step_masks(mask, dispatch, sources) -> tuple:
    """Ring sub-masks, rank-major: at step s rank r holds rank sources[s][r]'s K/V."""
    cp = dispatch.cp
    return tuple(sub_mask(mask, dispatch.ranges[r], dispatch.ranges[sources[s][r]])
                 for r in range(cp) for s in range(cp))


class RingBackend(base.ContextParallelBackend):
    name = "jax.cp_ring"
    strategy = "ring"
    description = ("ring attention: K/V rotate over cp with ppermute, log-sum-exp merge, "
                   "dK/dV rotate in the backward (inner kernel with a log-sum-exp inside)")
    # Ranks on a (ring, ulysses) mesh, even with groups of one (USP's
    # layout); the plain ring uses the one-axis `cp` mesh.
    grouped: ClassVar[bool] = False
    ulysses_size = 1

    def schedule(self, ranks: int) -> Schedule:
        return ring_schedule(ranks)

    @property
    def dispatch_ranks(self) -> int:
        return self.cp_size // self.ulysses_size  # the ring's ranks

    def strategy_problem(self, workload):
        if not self.grouped:
            return None
        u = self.ulysses_size
        if u < 1 or self.cp_size % u:
            return f"ulysses_size {u} does not divide cp_size {self.cp_size}"
        return ulysses_heads_problem(workload, u, "ulysses_size")

    def sub_workloads(self, workload, dispatch):
        masks = step_masks(workload.mask, dispatch, self.schedule(dispatch.cp).sources)
        cp = dispatch.cp
        return [(f"rank {i // cp} step {i % cp}",
                 sub_workload(workload, mask, self.ulysses_size))
                for i, mask in enumerate(masks)]

    def inner_support(self, workload, dispatch):
        kernel = self.inner_backend.ring_kernel()
        if kernel is None:
            return Support.no(f"a ring merges partial results by log-sum-exp and takes each "
                              f"step's gradients from the final out and lse; inner "
                              f"{self.inner_name}: {self.inner_backend.no_ring_kernel}")
        labelled = self.sub_workloads(workload, dispatch)
        support = base.sub_support(self.inner_name, self.inner_backend, labelled)
        if not support.ok:
            return support
        problem = kernel.problem([w.mask for _, w in labelled[:dispatch.cp]])  # rank 0's steps
        if problem:
            return Support.no(problem)
        return Support.yes(kernel.how or support.how, support.directions)

    def mesh(self) -> Mesh:
        devices = np.array(jax.devices()[: self.cp_size])
        if not self.grouped:
            return Mesh(devices, (base.AXIS,))
        return Mesh(devices.reshape(self.dispatch_ranks, self.ulysses_size), ("ring", "ulysses"))

    def sequence_spec(self) -> PartitionSpec:
        return _USP_SEQUENCE if self.grouped else base.SEQUENCE

    def local_attention(self, workload, dispatch):
        cp = dispatch.cp
        schedule = self.schedule(cp)
        kernel, tables = self.inner_backend.ring_kernel().bind(
            step_masks(workload.mask, dispatch, schedule.sources), workload)
        # (rank, step, ...): at step s rank r holds the K/V of schedule.sources[s][r].
        tables = jax.tree.map(lambda t: t.reshape(cp, cp, *t.shape[1:]), tables)
        axis = "ring" if self.grouped else base.AXIS
        ring = functools.partial(_ring, axis, schedule, kernel)
        ulysses = self.ulysses_size > 1

        def per_rank(q, k, v, tables):
            if not ulysses:  # no all_to_all over groups of one rank
                return ring(q, k, v, base.own(tables))
            # Within a group: (b, S/cp, h, d) -> (b, S/ring, h/u, d), the
            # group's tokens in the ring rank's order.
            q, k, v = (jax.lax.all_to_all(x, "ulysses", 2, 1, tiled=True) for x in (q, k, v))
            out = ring(q, k, v, base.own(tables))
            return jax.lax.all_to_all(out, "ulysses", 1, 2, tiled=True)

        if not self.grouped:
            return base.with_tables(per_rank, self.mesh(), tables)
        return base.with_tables(per_rank, self.mesh(), tables, sequence=_USP_SEQUENCE,
                                rank=PartitionSpec("ring"))


class DoubleRingBackend(RingBackend):
    name = "jax.cp_double_ring"
    strategy = "double_ring"
    description = ("LoongTrain's double ring: K/V circle inside windows of consecutive ring "
                   "ranks, then step to the next window; with ulysses_size > 1, Ulysses inside "
                   "groups and the double ring across them (inner kernel with a log-sum-exp)")
    grouped = True
    options = {**RingBackend.options, "window": int, "ulysses_size": int}

    def __init__(self, window: int = 2, ulysses_size: int = 1, **options):
        super().__init__(**options)
        self.window, self.ulysses_size = window, ulysses_size

    def probe_heads_kv(self, workload: Workload) -> int:
        return min(workload.heads_kv, max(2, self.ulysses_size))

    def strategy_problem(self, workload):
        problem = super().strategy_problem(workload)
        if problem:
            return problem
        ring = self.dispatch_ranks
        if self.window < 1 or ring % self.window:
            return (f"window {self.window} does not divide the ring's {ring} ranks "
                    f"(cp_size / ulysses_size)")
        return None

    def schedule(self, ranks: int) -> Schedule:
        return double_ring_schedule(ranks, self.window)


def _step(tables, s):
    return jax.tree.map(lambda t: t[s], tables)


def merge(out, lse, step_out, step_lse):
    """Combine two partial attentions of the same rows by their log-sum-exp."""
    if out is None:
        return step_out.astype(jnp.float32), step_lse
    both = jnp.logaddexp(lse, step_lse)
    safe = jnp.where(jnp.isneginf(both), 0.0, both)  # rows that saw nothing yet
    weight = lambda part: jnp.swapaxes(jnp.exp(part - safe), 1, 2)[..., None]  # noqa: E731
    return out * weight(lse) + step_out.astype(jnp.float32) * weight(step_lse), both


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _ring(axis, schedule, kernel, q, k, v, tables):
    return _ring_forward(axis, schedule, kernel, q, k, v, tables)[0]


def _ring_forward(axis, schedule, kernel, q, k, v, tables):
    out = lse = None
    kv = (k, v)
    for s in range(len(schedule.sources)):
        # Start the next shard's transfer first: nothing in this step's
        # compute depends on it, so the two can overlap.
        arriving = jax.lax.ppermute(kv, axis, schedule.moves[s]) if s < len(schedule.moves) \
            else None
        step_out, step_lse = kernel.attend(q, *kv, _step(tables, s))
        out, lse = merge(out, lse, step_out, step_lse)
        kv = arriving
    return out.astype(q.dtype), lse


def _ring_fwd(axis, schedule, kernel, q, k, v, tables):
    out, lse = _ring_forward(axis, schedule, kernel, q, k, v, tables)
    return out, (q, k, v, out, lse, tables)


def _ring_bwd(axis, schedule, kernel, residuals, dout):
    """Each step's share of the gradients from the final out and lse; dK/dV
    accumulate on the shard they belong to and travel with it, then go home."""
    q, k, v, out, lse, tables = residuals
    dq = jnp.zeros(q.shape, jnp.float32)
    kv = (k, v)
    dkv = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    for s in range(len(schedule.sources)):
        moves = schedule.moves[s] if s < len(schedule.moves) else schedule.home
        arriving = jax.lax.ppermute(kv, axis, moves) if s < len(schedule.moves) else None
        step_dq, step_dk, step_dv = kernel.gradients(q, *kv, out, lse, dout, _step(tables, s))
        dq, summed = dq + step_dq, (dkv[0] + step_dk, dkv[1] + step_dv)
        dkv = jax.lax.ppermute(tuple(summed), axis, moves)
        kv = arriving
    return (dq.astype(q.dtype), dkv[0].astype(k.dtype), dkv[1].astype(v.dtype),
            base.no_gradients(tables))


_ring.defvjp(_ring_fwd, _ring_bwd)
