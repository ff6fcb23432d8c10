"""JAX context parallelism on a `cp` mesh axis with jax.shard_map.

Strategies: `jax.cp_allgather` (gather K/V, attend the local queries),
`jax.cp_ring` (K/V rotate with ppermute; partial results merged by
log-sum-exp; a custom_vjp backward that rotates dK/dV with them),
`jax.cp_ulysses` (all_to_all from sequence- to head-sharded, attention over
the whole sequence, and back), `jax.cp_usp` (Ulysses inside groups of
`ulysses_size` ranks, a ring across the groups, on a 2-D mesh) and
`jax.cp_double_ring` (LoongTrain's: the ring's moves stay inside windows of
consecutive ranks, then step to the next window).

Tokens go to ranks by a dispatch (lcab.cp: contiguous, zigzag or the
mask-aware balanced one). Each rank's share of the mask against each K/V
shard it meets is cut from the slices exactly (lcab.cp.sub_mask) and
handed to the inner kernel, chosen per run by the `inner` option
(jax_backends/cp_inner.py): jax.pallas_flex by default, which runs any
sub-mask exactly from plan tables that travel as a cp-sharded input (one
compiled program serves every rank; empty ring steps cost only their empty
walk), or any JAX kernel backend whose own supports() accepts every rank's
(and step's) sub-workload, UNSUPPORTED otherwise. Ring-type strategies need
an inner with a log-sum-exp: jax.pallas_flex, or jax.xla's dense ring
kernel. Called, a strategy takes natural-order arrays (the correctness
checks); timed, its inputs are first put in the dispatch order and split
over the mesh, outside the timed call (DispatchedAttention), as a training
step dispatches once per sequence, not once per layer.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_backends import cp_inner, flex_kernel, flex_plan
from jax_backends.pallas_flex import PallasFlexBackend
from lcab.backend import Backend, Support
from lcab.cp import (DISPATCH_NAMES, cached_dispatch, imbalance, sub_mask, sub_workload,
                     ulysses_heads_problem)
from lcab.workloads import Workload

AXIS = "cp"
MERGES = ("separate", "in_kernel")  # RingBackend's merge option
_SHARDED = PartitionSpec(AXIS)
_SEQUENCE = PartitionSpec(None, AXIS)  # (batch, seq, heads, dim) split on seq
_USP_SEQUENCE = PartitionSpec(None, ("ring", "ulysses"))  # ring-major, then Ulysses


def _shard_map(per_rank, mesh, in_specs, out_specs):
    # pallas_call outputs carry no varying-axes annotation, so shard_map's
    # check of them is off.
    return jax.shard_map(per_rank, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=False)


@functools.lru_cache(maxsize=16)
def _step_masks(mask, dispatch, sources) -> tuple:
    """Ring sub-masks, rank-major: at step s rank r holds rank sources[s][r]'s K/V."""
    cp = dispatch.cp
    return tuple(sub_mask(mask, dispatch.ranges[r], dispatch.ranges[sources[s][r]])
                 for r in range(cp) for s in range(cp))


@functools.lru_cache(maxsize=16)
def _gathered_masks(mask, dispatch) -> tuple:
    """All-gather sub-masks: rank r's queries against every key, in dispatch order."""
    every_key = [r for rank in dispatch.ranges for r in rank]
    return tuple(sub_mask(mask, rank, every_key) for rank in dispatch.ranges)


class ContextParallelBackend(Backend):
    """Shared by the strategies: options, dispatch, the inner kernel, the mesh."""

    framework = "jax"
    suite = "cp"
    strategy: ClassVar[str] = ""
    requires = ("jax",)
    # jax.pallas_flex's tiling and lowering options apply to that inner only.
    options = {**PallasFlexBackend.options, "cp_size": int, "dispatch": str, "inner": str}

    def __init__(self, cp_size: int = 2, dispatch: str = "zigzag",
                 inner: str = cp_inner.DEFAULT, **kernel_options):
        if dispatch not in DISPATCH_NAMES:
            raise ValueError(f"dispatch={dispatch!r} is not one of {', '.join(DISPATCH_NAMES)}")
        self.cp_size, self.dispatch_name = cp_size, dispatch
        self.inner_name = inner
        self.inner = cp_inner.load_inner(inner, kernel_options)
        self.directions = self.inner.directions

    def mask_support(self, workload: Workload) -> Support:
        devices = jax.device_count()
        if devices < self.cp_size:
            return Support.no(f"cp_size {self.cp_size} needs {self.cp_size} devices; "
                              f"jax sees {devices}")
        if workload.seqlen_q != workload.seqlen_k:
            return Support.no("context parallelism here shards one sequence: seqlen_q == seqlen_k")
        problem = self.strategy_problem(workload)
        if problem:
            return Support.no(problem)
        try:
            dispatch = self.dispatch(workload)
        except ValueError as exc:
            return Support.no(str(exc))
        inner = self.inner_support(workload, dispatch)
        if not inner.ok:
            return inner
        return Support.yes(f"{self.strategy}; dispatch={self.dispatch_name}; "
                           f"inner {self.inner_name}: {inner.how}", inner.directions)

    @property
    def uses_pallas(self) -> bool:
        return self.inner_name == cp_inner.PALLAS

    def inner_support(self, workload: Workload, dispatch) -> Support:
        """Whether (and how) the inner kernel runs every rank's sub-workload."""
        return cp_inner.sub_support(self.inner_name, self.inner,
                                    self.sub_workloads(workload, dispatch))

    def sub_workloads(self, workload: Workload, dispatch) -> list[tuple[str, Workload]]:
        """(label, workload) of what the inner kernel runs on each rank."""
        raise NotImplementedError

    @property
    def dispatch_ranks(self) -> int:
        """How many ranks the dispatch splits tokens over."""
        return self.cp_size

    def dispatch(self, workload: Workload):
        return cached_dispatch(self.dispatch_name, workload.mask, self.dispatch_ranks)

    def case_notes(self, workload: Workload) -> str:
        dispatch = self.dispatch(workload)
        return f"imbalance={self.imbalance(workload, dispatch):.3f}"

    def strategy_problem(self, workload: Workload) -> str | None:
        return None

    def imbalance(self, workload: Workload, dispatch) -> float:
        """Max over mean of the ranks' exact attention areas."""
        return imbalance(workload.mask, dispatch)

    def mesh(self) -> Mesh:
        return Mesh(np.array(jax.devices()[: self.cp_size]), (AXIS,))

    def sequence_spec(self) -> PartitionSpec:
        """How the strategy's (batch, seq, heads, dim) inputs split over the mesh."""
        return _SEQUENCE

    def build(self, workload: Workload):
        dispatch = self.dispatch(workload)
        sharding = NamedSharding(self.mesh(), self.sequence_spec())
        return DispatchedAttention(self.local_attention(workload, dispatch), dispatch.order(),
                                   sharding)

    def local_attention(self, workload: Workload, dispatch):
        """f(q, k, v) on dispatch-ordered global arrays."""
        raise NotImplementedError


class DispatchedAttention:
    """A strategy as validation and the runtime see it.

    Called, it takes natural-order arrays and returns the natural-order
    output (the permutations run inside). Timed (jax_backends.runtime), the
    inputs are put in the dispatch order and split over the mesh first,
    outside the timed call, and `timed` runs the strategy alone: a training
    step dispatches once per sequence, not once per layer.
    """

    def __init__(self, local, order: np.ndarray, sharding: NamedSharding):
        self.local, self.sharding = local, sharding
        self.order = jnp.asarray(order)
        self.inverse = jnp.asarray(np.argsort(order))

    def __call__(self, q, k, v):
        q, k, v = (jnp.take(x, self.order, axis=1) for x in (q, k, v))
        return jnp.take(self.local(q, k, v), self.inverse, axis=1)

    def timed(self, q, k, v):
        return self.local(q, k, v)

    def timed_inputs(self, inputs):
        place = jax.jit(lambda x: jnp.take(x, self.order, axis=1), out_shardings=self.sharding)
        return [place(x) for x in inputs]


def _rank_specs(tables, spec=_SHARDED):
    return jax.tree.map(lambda _: spec, tables)


def _with_tables(per_rank, mesh, tables, sequence=_SEQUENCE, rank=_SHARDED):
    """f(q, k, v): per_rank(q, k, v, tables) on every rank, q/k/v split by
    `sequence`, the tables' first axis by `rank`."""
    sharded = _shard_map(per_rank, mesh, in_specs=(sequence, sequence, sequence,
                                                   _rank_specs(tables, rank)),
                         out_specs=sequence)
    return lambda q, k, v: sharded(q, k, v, tables)


def _own(tables):
    """This rank's tables: the sharded first axis has length 1 here."""
    return jax.tree.map(lambda t: t[0], tables)


class AllGatherBackend(ContextParallelBackend):
    name = "jax.cp_allgather"
    strategy = "allgather"
    description = "all-gather K/V over cp, then attend the local queries (inner kernel inside)"

    def sub_workloads(self, workload, dispatch):
        # K/V stay in the dispatch order they were gathered in: no kernel
        # states a rectangular (S/cp x S) mask with flags, so natural order
        # would gain nothing.
        return [(f"rank {r}", sub_workload(workload, mask))
                for r, mask in enumerate(_gathered_masks(workload.mask, dispatch))]

    def inner_support(self, workload, dispatch):
        support = super().inner_support(workload, dispatch)
        if not support.ok or self.uses_pallas:
            return support
        return Support.yes(f"{support.how}; each rank's own sub-mask (lax.switch on the rank)",
                           support.directions)

    def local_attention(self, workload, dispatch):
        if self.uses_pallas:
            return self._pallas_attention(workload, dispatch)
        subs = [w for _, w in self.sub_workloads(workload, dispatch)]
        attend = cp_inner.by_rank(self.inner, subs, AXIS)

        def per_rank(q, k, v):
            k, v = (jax.lax.all_gather(x, AXIS, axis=1, tiled=True) for x in (k, v))
            return attend(q, k, v)

        return _shard_map(per_rank, self.mesh(), in_specs=(_SEQUENCE,) * 3,
                          out_specs=_SEQUENCE)

    def _pallas_attention(self, workload, dispatch):
        kernel, tables = cp_inner.PallasRing.for_masks(
            self.inner, _gathered_masks(workload.mask, dispatch), workload)

        def per_rank(q, k, v, tables):
            k, v = (jax.lax.all_gather(x, AXIS, axis=1, tiled=True) for x in (k, v))
            out, _ = kernel.attend(q, k, v, _own(tables))
            return out

        return _with_tables(per_rank, self.mesh(), tables)


class RingBackend(ContextParallelBackend):
    name = "jax.cp_ring"
    strategy = "ring"
    description = ("ring attention: K/V rotate over cp with ppermute, log-sum-exp merge, "
                   "dK/dV rotate in the backward (inner kernel with a log-sum-exp inside)")
    # How a step's partial result joins the running one: "separate", an XLA
    # log-sum-exp merge pass over the float32 output after each step's
    # kernel; "in_kernel", the kernel starts from the running output and
    # log-sum-exp (inner jax.pallas_flex), so that pass is gone.
    options = {**ContextParallelBackend.options, "merge": str}

    def __init__(self, merge: str = "separate", **options):
        if merge == "in_kernel" and options.get("inner", cp_inner.DEFAULT) == cp_inner.PALLAS:
            # Each step's gradients are added onto the running sums, which
            # only the Triton backward does: its blocks, and its name in the notes.
            if str(options.get("backward_lowering", "triton")) not in ("auto", "triton"):
                raise ValueError("merge=in_kernel adds each step's gradients onto running sums, "
                                 "which only the Triton backward does: not backward_lowering="
                                 f"{options['backward_lowering']}")
            options = {**options, "backward_lowering": "triton"}
        super().__init__(**options)
        if merge not in MERGES:
            raise ValueError(f"merge={merge!r} is not one of {', '.join(MERGES)}")
        if merge == "in_kernel" and self.inner_name not in cp_inner.MERGES_IN_KERNEL:
            raise ValueError(f"merge=in_kernel needs inner="
                             f"{' or '.join(cp_inner.MERGES_IN_KERNEL)}, not {self.inner_name}")
        self.merge = merge

    def schedule(self, ranks: int) -> "Schedule":
        return ring_schedule(ranks)

    @property
    def head_share(self) -> int:
        """Each ring rank's share of the heads (1: all of them)."""
        return 1

    def sub_workloads(self, workload, dispatch):
        masks = _step_masks(workload.mask, dispatch, self.schedule(dispatch.cp).sources)
        cp = dispatch.cp
        return [(f"rank {i // cp} step {i % cp}",
                 sub_workload(workload, mask, self.head_share))
                for i, mask in enumerate(masks)]

    def inner_support(self, workload, dispatch):
        return cp_inner.ring_support(self.inner_name, self.inner,
                                     self.sub_workloads(workload, dispatch), dispatch.cp)

    def ring_kernel(self, workload, dispatch, schedule: "Schedule"):
        """The ring kernel and its (rank, step, ...) tables: at step s rank r
        holds the K/V shard of rank schedule.sources[s][r]."""
        cp = dispatch.cp
        kernel, tables = cp_inner.ring_kernel(self.inner_name, self.inner,
                                              _step_masks(workload.mask, dispatch,
                                                          schedule.sources),
                                              workload,
                                              merge_in_kernel=self.merge == "in_kernel")
        by_rank = lambda t: t.reshape(cp, cp, *t.shape[1:])  # noqa: E731
        return kernel, jax.tree.map(by_rank, tables)

    def local_attention(self, workload, dispatch):
        schedule = self.schedule(dispatch.cp)
        kernel, tables = self.ring_kernel(workload, dispatch, schedule)
        ring = functools.partial(_ring, AXIS, schedule, kernel)

        def per_rank(q, k, v, tables):
            return ring(q, k, v, _own(tables))

        return _with_tables(per_rank, self.mesh(), tables)


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


def _step(tables, s):
    return jax.tree.map(lambda t: t[s], tables)


def _merge(out, lse, step_out, step_lse):
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
        if kernel.merge_in_kernel:
            partial = None if out is None else (out, lse)
            out, lse = kernel.attend_onto(q, *kv, partial, _step(tables, s))
        else:
            step_out, step_lse = kernel.attend(q, *kv, _step(tables, s))
            out, lse = _merge(out, lse, step_out, step_lse)
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
        if kernel.merge_in_kernel:
            dq, *summed = kernel.gradients_onto(q, *kv, out, lse, dout, (dq, *dkv),
                                                _step(tables, s))
        else:
            step_dq, step_dk, step_dv = kernel.gradients(q, *kv, out, lse, dout,
                                                         _step(tables, s))
            dq, summed = dq + step_dq, (dkv[0] + step_dk, dkv[1] + step_dv)
        dkv = jax.lax.ppermute(tuple(summed), axis, moves)
        kv = arriving
    return (dq.astype(q.dtype), dkv[0].astype(k.dtype), dkv[1].astype(v.dtype),
            cp_inner.no_gradients(tables))


_ring.defvjp(_ring_fwd, _ring_bwd)


def _is_identity(order) -> bool:
    return np.array_equal(order, np.arange(len(order)))


class UlyssesBackend(ContextParallelBackend):
    name = "jax.cp_ulysses"
    strategy = "ulysses"
    description = ("Ulysses: all_to_all from sequence- to head-sharded, attention over the "
                   "whole sequence, all_to_all back (inner kernel inside)")

    def probe_heads_kv(self, workload):
        return min(workload.heads_kv, self.cp_size)  # a smaller count would not split

    def strategy_problem(self, workload):
        return ulysses_heads_problem(workload, self.cp_size, "cp_size")

    def imbalance(self, workload, dispatch) -> float:
        return 1.0  # every rank attends the whole sequence for its share of the heads

    def sequence_mask(self, workload, dispatch):
        """The mask the inner sees: jax.pallas_flex takes the tokens in dispatch
        order; other inners get them back in natural order (a local gather),
        so kernels with flags see the plain mask."""
        if not self.uses_pallas:
            return workload.mask
        every_token = [r for rank in dispatch.ranges for r in rank]
        return sub_mask(workload.mask, every_token, every_token)

    def sub_workloads(self, workload, dispatch):
        mask = self.sequence_mask(workload, dispatch)
        return [("every rank", sub_workload(workload, mask, self.cp_size))]

    def inner_support(self, workload, dispatch):
        support = super().inner_support(workload, dispatch)
        if not support.ok or self.uses_pallas or _is_identity(dispatch.order()):
            return support
        return Support.yes(f"{support.how}; tokens gathered back to natural order",
                           support.directions)

    def local_attention(self, workload, dispatch):
        if self.uses_pallas:
            attend = self._pallas_attention(workload, dispatch)
        else:
            attend = self._natural_order(self.inner.build(self.sub_workloads(workload,
                                                                              dispatch)[0][1]),
                                         dispatch)

        def per_rank(q, k, v):
            # (b, S/cp, h, d) -> (b, S, h/cp, d): a contiguous block of heads
            # keeps every query head with its K/V head.
            q, k, v = (jax.lax.all_to_all(x, AXIS, 2, 1, tiled=True) for x in (q, k, v))
            return jax.lax.all_to_all(attend(q, k, v), AXIS, 1, 2, tiled=True)

        return _shard_map(per_rank, self.mesh(), in_specs=(_SEQUENCE,) * 3,
                          out_specs=_SEQUENCE)

    def _pallas_attention(self, workload, dispatch):
        mask = self.sequence_mask(workload, dispatch)
        tiling, lowering = self.inner.tiling, self.inner.lowering
        forward = flex_plan.make_plan(mask, tiling.block_q, tiling.block_k)
        backward = flex_plan.make_plan(
            mask, *self.inner.backward_blocks(workload.dtype, workload.head_dim))
        return lambda q, k, v: flex_kernel.flex_attention(q, k, v, forward, backward,
                                                          lowering)[0]

    @staticmethod
    def _natural_order(attend, dispatch):
        """attend on tokens put back in natural order, its output back in dispatch order."""
        order = dispatch.order()
        if _is_identity(order):
            return attend  # contiguous: already natural
        natural, back = jnp.asarray(np.argsort(order)), jnp.asarray(order)

        def reordered(q, k, v):
            q, k, v = (jnp.take(x, natural, axis=1) for x in (q, k, v))
            return jnp.take(attend(q, k, v), back, axis=1)

        return reordered


class UspBackend(RingBackend):
    name = "jax.cp_usp"
    strategy = "usp"
    description = ("USP: Ulysses all_to_all inside groups of ulysses_size ranks, ring attention "
                   "across the groups, on a (ring, ulysses) mesh (inner kernel with a "
                   "log-sum-exp inside)")
    options = {**RingBackend.options, "ulysses_size": int}

    def __init__(self, ulysses_size: int = 2, **options):
        super().__init__(**options)
        self.ulysses_size = ulysses_size

    @property
    def dispatch_ranks(self) -> int:
        return self.cp_size // self.ulysses_size  # the ring's ranks

    @property
    def head_share(self) -> int:
        return self.ulysses_size

    def strategy_problem(self, workload):
        u = self.ulysses_size
        if u < 1 or self.cp_size % u:
            return f"ulysses_size {u} does not divide cp_size {self.cp_size}"
        return ulysses_heads_problem(workload, u, "ulysses_size")

    def probe_heads_kv(self, workload):
        return min(workload.heads_kv, self.ulysses_size)

    def mesh(self) -> Mesh:
        devices = np.array(jax.devices()[: self.cp_size])
        return Mesh(devices.reshape(self.dispatch_ranks, self.ulysses_size), ("ring", "ulysses"))

    def sequence_spec(self) -> PartitionSpec:
        return _USP_SEQUENCE

    def local_attention(self, workload, dispatch):
        schedule = self.schedule(dispatch.cp)
        kernel, tables = self.ring_kernel(workload, dispatch, schedule)
        ring = functools.partial(_ring, "ring", schedule, kernel)
        ulysses = self.ulysses_size > 1

        def per_rank(q, k, v, tables):
            # Within a group: (b, S/cp, h, d) -> (b, S/ring, h/u, d), the
            # group's tokens in the ring rank's order.
            if not ulysses:  # a plain (double) ring: no all_to_all over one rank
                return ring(q, k, v, _own(tables))
            q, k, v = (jax.lax.all_to_all(x, "ulysses", 2, 1, tiled=True) for x in (q, k, v))
            out = ring(q, k, v, _own(tables))
            return jax.lax.all_to_all(out, "ulysses", 1, 2, tiled=True)

        return _with_tables(per_rank, self.mesh(), tables,
                            sequence=_USP_SEQUENCE,
                            rank=PartitionSpec("ring"))


class DoubleRingBackend(UspBackend):
    name = "jax.cp_double_ring"
    strategy = "double_ring"
    description = ("LoongTrain's double ring: K/V circle inside windows of consecutive ring "
                   "ranks, then step to the next window; with ulysses_size > 1, Ulysses inside "
                   "groups and the double ring across them (inner kernel with a log-sum-exp)")
    options = {**UspBackend.options, "window": int}

    def __init__(self, window: int = 2, ulysses_size: int = 1, **options):
        super().__init__(ulysses_size=ulysses_size, **options)
        self.window = window

    def probe_heads_kv(self, workload):
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
