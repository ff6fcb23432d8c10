"""jax.cp_groupcast: each rank receives only the K/V chunks its queries see.

MagiAttention's zero-redundancy communication in JAX. From the mask's
slices, lcab.cp.groupcast.plan lists the chunks every rank needs from every
other; each rank picks the chunks it must send into one bucket per
destination (padded), the transfer delivers them, and the inner kernel
attends the rank's queries to [its own keys | the received buckets] under
the exact sub-mask of that layout (padding is never visible). The
backward is JAX's transpose of the same program: the transfer returns each
received chunk's partial dK/dV to its owner and the gather sums them there
(group-reduce). A chunk nobody needs never moves.

Options: `chunk`, the transfer granule (default: the largest power of two
up to 512 tokens that tiles the dispatch); `transfer` (TRANSFERS), one
all_to_all or one ppermute per ring shift. `--dispatch=groupcast` picks
the ranks' tokens so that areas are even and few chunks move.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_backends.cp import base
from jax_backends.cp.allgather import RankSubMasks, by_rank
from lcab.cp import sub_mask, sub_workload
from lcab.cp.groupcast import GroupCast, plan, transfer_chunk
from lcab.masks.mask import AttnMask


@functools.lru_cache(maxsize=16)
def cast_of(mask: AttnMask, dispatch, chunk: int | None) -> GroupCast:
    return plan(mask, dispatch, transfer_chunk(dispatch) if chunk is None else chunk)


# How the chunks travel: one all_to_all of cp buckets padded to the largest
# of any rank pair, or one ppermute per ring shift d = 1..cp-1, each padded
# to the largest bucket of its own shift (fewer padded bytes where only
# near ranks see much of each other, as on documents; cp - 1 collectives).
TRANSFERS = ("all_to_all", "shifts")


def slot_starts(cast: GroupCast, transfer: str) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """(keys a rank attends, [r][s] the local key where sender s's chunks
    begin on rank r): own keys first, then the received slots in the order
    the transfer delivers them."""
    cp, chunk, own = cast.cp, cast.chunk, cast.dispatch.tokens_per_rank
    if transfer == "all_to_all":
        bucket = cast.bucket()
        return (own + cp * bucket * chunk,
                tuple(tuple(own + s * bucket * chunk for s in range(cp)) for _ in range(cp)))
    buckets = cast.shift_buckets()
    offsets = own + chunk * (np.cumsum(buckets) - np.asarray(buckets, dtype=np.int64))
    starts = [[own] * cp for _ in range(cp)]  # [r][r]: nothing lands there
    for d in range(1, cp):
        for r in range(cp):
            starts[r][(r - d) % cp] = int(offsets[d - 1])
    return own + chunk * sum(buckets), tuple(map(tuple, starts))


@functools.lru_cache(maxsize=16)
def received_masks(mask: AttnMask, cast: GroupCast, transfer: str) -> tuple[AttnMask, ...]:
    """Per rank: its queries against [own keys | the received slots]
    (slot_starts), each slot padded at its end; padding is never visible."""
    dispatch, chunk = cast.dispatch, cast.chunk
    own = dispatch.tokens_per_rank
    width, starts = slot_starts(cast, transfer)
    masks = []
    for rank, rows in enumerate(dispatch.ranges):
        # Global key ranges, and where each lands locally: own keys first,
        # in the rank's local order.
        columns = list(rows)
        places = list(np.cumsum([0] + [hi - lo for lo, hi in rows[:-1]]))
        for sender, chunks in enumerate(cast.receives[rank]):
            for index, global_chunk in enumerate(chunks):
                columns.append((global_chunk * chunk, (global_chunk + 1) * chunk))
                places.append(starts[rank][sender] + index * chunk)
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


def send_table(cast: GroupCast, transfer: str) -> np.ndarray:
    """(cp, sent chunks) int32: row s, the local chunk indices rank s sends,
    destination after destination (all_to_all: rank 0, 1, ..., each padded
    to `bucket`; shifts: rank s + 1, s + 2, ..., each padded to its shift's
    bucket); padding sends chunk 0, whose copy no query sees."""
    dispatch, chunk, cp = cast.dispatch, cast.chunk, cast.cp
    local = {}
    for rank in range(cp):
        for index, token in enumerate(dispatch.rank_rows(rank)[::chunk]):
            local[int(token) // chunk] = index
    if transfer == "all_to_all":
        sizes = [[cast.bucket()] * cp] * cp
        targets = [list(range(cp)) for _ in range(cp)]
    else:
        sizes = [list(cast.shift_buckets())] * cp
        targets = [[(s + d) % cp for d in range(1, cp)] for s in range(cp)]
    table = np.zeros((cp, max(sum(sizes[0]), 1)), np.int32)
    for sender in range(cp):
        at = 0
        for size, receiver in zip(sizes[sender], targets[sender]):
            chunks = cast.receives[receiver][sender]
            table[sender, at:at + len(chunks)] = [local[c] for c in chunks]
            at += size
    return table


class GroupCastBackend(RankSubMasks, base.ContextParallelBackend):
    name = "jax.cp_groupcast"
    strategy = "groupcast"
    description = ("each rank receives only the K/V chunks its queries see (padded buckets: "
                   "one all_to_all or a ppermute per ring shift), then attends; the backward "
                   "returns partial dK/dV to their owners")
    options = {**base.ContextParallelBackend.options, "chunk": int, "transfer": str}

    def __init__(self, cp_size: int = 2, dispatch: str = "zigzag",
                 inner: str = base.DEFAULT_INNER, inner_options=None, chunk: int | None = None,
                 transfer: str = "all_to_all"):
        super().__init__(cp_size, dispatch, inner, inner_options)
        if chunk is not None and chunk < 1:
            raise ValueError(f"chunk={chunk} must be a positive number of tokens")
        if transfer not in TRANSFERS:
            raise ValueError(f"transfer={transfer!r} is not one of {', '.join(TRANSFERS)}")
        self.chunk, self.transfer = chunk, transfer

    def cast(self, workload, dispatch) -> GroupCast:
        return cast_of(workload.mask, dispatch, self.chunk)

    def strategy_problem(self, workload):
        try:
            self.cast(workload, self.dispatch(workload))
        except ValueError as exc:
            return str(exc)
        return None

    def sub_workloads(self, workload, dispatch):
        masks = received_masks(workload.mask, self.cast(workload, dispatch), self.transfer)
        return [(f"rank {r}", sub_workload(workload, mask)) for r, mask in enumerate(masks)]

    def sent_chunks(self, cast: GroupCast) -> int:
        """Chunks the transfer moves, padding included."""
        return cast.padded_chunks() if self.transfer == "all_to_all" else cast.shifted_chunks()

    def case_notes(self, workload) -> str:
        dispatch = self.dispatch(workload)
        cast = self.cast(workload, dispatch)
        return (f"{super().case_notes(workload)}; chunk={cast.chunk}; transfer={self.transfer}; "
                f"K/V chunks seen {cast.moved_chunks()}, moved {self.sent_chunks(cast)} with "
                f"padding, where a ring moves {cast.all_gather_chunks()}")

    def local_attention(self, workload, dispatch):
        cast = self.cast(workload, dispatch)
        cp, chunk = cast.cp, cast.chunk
        masks = received_masks(workload.mask, cast, self.transfer)
        # Per collective: (sizes in chunks, ppermute pairs or None for all_to_all).
        if self.transfer == "all_to_all":
            hops = [(cp * cast.bucket(), None)] if cast.bucket() else []
        else:
            hops = [(size, [(s, (s + d) % cp) for s in range(cp)])
                    for d, size in enumerate(cast.shift_buckets(), 1) if size]

        def received(k, v, sends):
            """[own | received slots] of k and v on this rank."""
            if not hops:  # nothing moves: every rank sees only its own keys
                return k, v
            batch, tokens, heads, dim = k.shape

            def cast_one(x):
                chunks = x.reshape(batch, tokens // chunk, chunk, heads, dim)
                picked = jnp.take(chunks, sends, axis=1)
                pieces, at = [x], 0
                for size, pairs in hops:
                    piece = picked[:, at:at + size]
                    at += size
                    if pairs is None:
                        piece = piece.reshape(batch, cp, size // cp * chunk, heads, dim)
                        piece = jax.lax.all_to_all(piece, base.AXIS, 1, 1, tiled=True)
                    else:
                        piece = jax.lax.ppermute(piece, base.AXIS, pairs)
                    pieces.append(piece.reshape(batch, size * chunk, heads, dim))
                return jnp.concatenate(pieces, axis=1)

            return cast_one(k), cast_one(v)

        sends = send_table(cast, self.transfer)
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
