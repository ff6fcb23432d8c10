"""jax.cp_groupcast: each rank receives only the K/V chunks its queries see.

MagiAttention's zero-redundancy communication in JAX. From the mask's
slices, lcab.cp.groupcast.plan lists the chunks every rank needs from every
other; each rank picks the chunks it must send into one bucket per
destination (padded to the largest bucket), one all_to_all delivers them,
and the inner kernel attends the rank's queries to [its own keys | the
received buckets] under the exact sub-mask of that layout (padding is
never visible). The backward is JAX's transpose of the same program: the
all_to_all returns each received chunk's partial dK/dV to its owner and the
gather sums them there (group-reduce). A chunk nobody needs never moves.

`chunk` (option) is the transfer granule: the largest power of two up to
512 tokens that tiles the dispatch (`--dispatch=groupcast` picks ranks'
tokens so that areas are even and few chunks move).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_backends.cp import base
from jax_backends.cp.allgather import by_rank
from lcab.backend import Support
from lcab.cp import sub_mask, sub_workload
from lcab.cp.groupcast import GroupCast, coarsest_chunk, plan
from lcab.masks.mask import AttnMask

# The transfer granule's default upper bound, in tokens.
DEFAULT_CHUNK = 512


@functools.lru_cache(maxsize=16)
def cast_of(mask: AttnMask, dispatch, chunk: int | None) -> GroupCast:
    coarsest = coarsest_chunk(dispatch)
    return plan(mask, dispatch, math.gcd(coarsest, DEFAULT_CHUNK) if chunk is None else chunk)


@functools.lru_cache(maxsize=16)
def received_masks(mask: AttnMask, cast: GroupCast) -> tuple[AttnMask, ...]:
    """Per rank: its queries against [own keys | cp buckets of `bucket`
    chunks, sender by sender, each padded at its end]."""
    dispatch, chunk, bucket = cast.dispatch, cast.chunk, cast.bucket()
    own = dispatch.tokens_per_rank
    width = own + dispatch.cp * bucket * chunk
    masks = []
    for rank, rows in enumerate(dispatch.ranges):
        columns, places = [], []  # global key ranges, and where each lands locally
        for lo, hi in rows:  # own keys first, in the rank's local order
            columns.append((lo, hi))
            places.append(sum(b - a for a, b in rows[:len(places)]))
        for sender, chunks in enumerate(cast.receives[rank]):
            start = own + sender * bucket * chunk
            for index, global_chunk in enumerate(chunks):
                columns.append((global_chunk * chunk, (global_chunk + 1) * chunk))
                places.append(start + index * chunk)
        packed = sub_mask(mask, rows, columns)
        # sub_mask packs the columns range after range; each slice piece lies
        # in one range, so moving a range's pieces to its place is exact.
        lengths = np.array([hi - lo for lo, hi in columns])
        packed_starts = np.cumsum(lengths) - lengths
        table = np.array(packed.slice_table)
        which = np.searchsorted(packed_starts, table[:, 2], side="right") - 1
        shift = np.asarray(places)[which] - packed_starts[which]
        table[:, 2] += shift
        table[:, 3] += shift
        masks.append(AttnMask(own, width, table, name=f"{mask.name}:groupcast",
                              params={"parent": mask.fingerprint()}))
    return tuple(masks)


def send_table(cast: GroupCast) -> np.ndarray:
    """(cp, cp, bucket) int32: [s, r] the local chunk indices rank s sends
    to rank r, padded with 0 (padding keys are never visible)."""
    dispatch, chunk = cast.dispatch, cast.chunk
    local = {}
    for rank in range(dispatch.cp):
        for index, token in enumerate(dispatch.rank_rows(rank)[::chunk]):
            local[int(token) // chunk] = index
    table = np.zeros((dispatch.cp, dispatch.cp, max(cast.bucket(), 1)), np.int32)
    for receiver, row in enumerate(cast.receives):
        for sender, chunks in enumerate(row):
            table[sender, receiver, :len(chunks)] = [local[c] for c in chunks]
    return table


class GroupCastBackend(base.ContextParallelBackend):
    name = "jax.cp_groupcast"
    strategy = "groupcast"
    description = ("each rank receives only the K/V chunks its queries see (one all_to_all "
                   "of padded buckets), then attends; the backward returns partial dK/dV")
    options = {**base.ContextParallelBackend.options, "chunk": int}

    def __init__(self, cp_size: int = 2, dispatch: str = "zigzag",
                 inner: str = base.DEFAULT_INNER, inner_options=None, chunk: int | None = None):
        super().__init__(cp_size, dispatch, inner, inner_options)
        if chunk is not None and chunk < 1:
            raise ValueError(f"chunk={chunk} must be a positive number of tokens")
        self.chunk = chunk

    def cast(self, workload, dispatch) -> GroupCast:
        return cast_of(workload.mask, dispatch, self.chunk)

    def strategy_problem(self, workload):
        try:
            self.cast(workload, self.dispatch(workload))
        except ValueError as exc:
            return str(exc)
        return None

    def sub_workloads(self, workload, dispatch):
        masks = received_masks(workload.mask, self.cast(workload, dispatch))
        return [(f"rank {r}", sub_workload(workload, mask)) for r, mask in enumerate(masks)]

    def inner_support(self, workload, dispatch):
        support = super().inner_support(workload, dispatch)
        if not support.ok or self.tabled_kernel() is not None:
            return support
        return Support.yes(f"{support.how}; each rank's own sub-mask (lax.switch on the rank)",
                           support.directions)

    def case_notes(self, workload) -> str:
        dispatch = self.dispatch(workload)
        cast = self.cast(workload, dispatch)
        return (f"{super().case_notes(workload)}; chunk={cast.chunk}; K/V chunks moved "
                f"{cast.moved_chunks()} (padded {cast.padded_chunks()}) where a ring moves "
                f"{cast.all_gather_chunks()}")

    def local_attention(self, workload, dispatch):
        cast = self.cast(workload, dispatch)
        cp, chunk, bucket = cast.cp, cast.chunk, cast.bucket()
        masks = received_masks(workload.mask, cast)

        def received(k, v, sends):
            """[own | received buckets] of k and v on this rank."""
            if bucket == 0:  # nothing moves: every rank sees only its own keys
                return k, v
            batch, tokens, heads, dim = k.shape

            def cast_one(x):
                chunks = x.reshape(batch, tokens // chunk, chunk, heads, dim)
                picked = jnp.take(chunks, sends.reshape(-1), axis=1)
                picked = picked.reshape(batch, cp, bucket * chunk, heads, dim)
                got = jax.lax.all_to_all(picked, base.AXIS, 1, 1, tiled=True)
                return jnp.concatenate([x, got.reshape(batch, -1, heads, dim)], axis=1)

            return cast_one(k), cast_one(v)

        sends = send_table(cast)
        kernel = self.tabled_kernel()
        if kernel is None:
            attend = by_rank(self.inner_backend,
                             [w for _, w in self.sub_workloads(workload, dispatch)], base.AXIS)

            def per_rank(q, k, v, tables):
                k, v = received(k, v, base.own(tables))
                return attend(q, k, v)

            return base.with_tables(per_rank, self.mesh(), sends)

        kernel, tables = kernel.bind(masks, workload)

        def per_rank_tabled(q, k, v, both):
            kernel_tables, own_sends = both
            k, v = received(k, v, base.own(own_sends))
            out, _ = kernel.attend(q, k, v, base.own(kernel_tables))
            return out

        return base.with_tables(per_rank_tabled, self.mesh(), (tables, sends))
