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

With `stages` > 1 the work is split so the transfer can hide under the
kernel (MagiAttention's overlap): the own keys' kernel call needs nothing
from the transfer and runs first; the received keys follow in stages - 1
calls (the all_to_all cut into as many smaller ones, or the shifts'
ppermutes dealt out in ring order), the calls' results merged by
log-sum-exp; the backward (a custom_vjp) takes each call's gradients from
the final out and lse, the received keys' first. This needs the inner's
ring kernel (out and lse).

Options: `chunk`, the transfer granule (default: the largest power of two
up to 512 tokens that tiles the dispatch); `transfer` (TRANSFERS), one
all_to_all or one ppermute per ring shift; `stages` (default 1: one call
after the transfer); `transpose` (TRANSPOSES), how the backward sums a
chunk's returned dK/dV: JAX's scatter-add (default) or fixed-table
gathers. `--dispatch=groupcast` picks the ranks' tokens so that areas are
even and few chunks move.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from jax_backends.cp import base
from jax_backends.cp.allgather import RankSubMasks, by_rank
from jax_backends.cp.ring import merge
from lcab.backend import Support
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
# How the backward returns each received chunk's dK/dV to its chunk: JAX's
# transpose of the send gather (a scatter-add), or gather_chunks' fixed
# table (one gather per copy a chunk was sent, no scatter).
TRANSPOSES = ("scatter", "gather")
# A bucket's empty slots: Layout.sends marks them PADDING; the backend
# indexes them past the rank's chunks (send_table), so they carry zeros and
# the backward's scatter drops them. No query sees them.
PADDING = -1  # a padded slot in Layout.sends


@dataclasses.dataclass(frozen=True)
class Hop:
    """One collective of the transfer: `size` chunks leave each rank (an
    all_to_all's cp buckets of size / cp, or one ppermute's bucket to
    `pairs`), read by kernel call `stage`."""

    size: int
    pairs: tuple[tuple[int, int], ...] | None  # None: an all_to_all
    stage: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where every moved chunk goes, and what each kernel call attends.

    With one stage, rank r attends [own keys | every hop's piece] in one
    call once the transfer is done. With more, call 0 attends the own keys
    alone (it needs nothing from the transfer, so the transfer runs under
    it) and call g >= 1 the pieces of the hops of stage g, concatenated;
    the calls' results merge by log-sum-exp.
    """

    hops: tuple[Hop, ...]
    stages: int  # kernel calls
    # landing[r][h]: (global chunk, place in hop h's piece) of what rank r receives.
    landing: tuple[tuple[tuple[tuple[int, int], ...], ...], ...]
    # sends[s]: the local chunk indices rank s sends, hop after hop; PADDING
    # where a bucket has nothing to carry (the backend fills it: `padding`).
    sends: np.ndarray

    def widths(self, own: int, chunk: int) -> tuple[int, ...]:
        """Keys of each kernel call."""
        if self.stages == 1:
            return (own + chunk * sum(h.size for h in self.hops),)
        return (own,) + tuple(chunk * sum(h.size for h in self.hops if h.stage == g)
                              for g in range(1, self.stages))

    def hop_offsets(self, own: int, chunk: int) -> tuple[int, ...]:
        """Where each hop's piece starts among its call's keys."""
        offsets, at = [], {}
        for hop in self.hops:
            start = at.get(hop.stage, own if self.stages == 1 else 0)
            offsets.append(start)
            at[hop.stage] = start + hop.size * chunk
        return tuple(offsets)


def _split(total: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of `parts` near-equal pieces of range(total), none empty."""
    parts = max(1, min(parts, total))
    edges = [round(i * total / parts) for i in range(parts + 1)]
    return list(itertools.pairwise(edges))


@functools.lru_cache(maxsize=16)
def transfer_layout(cast: GroupCast, transfer: str, stages: int = 1) -> Layout:
    """The hops of `transfer` for `stages` kernel calls: the all_to_all's
    buckets cut into stages - 1 pieces (one all_to_all each), the shifts'
    ppermutes dealt to stages - 1 calls in ring order; fewer where there is
    less to cut."""
    cp, dispatch = cast.cp, cast.dispatch
    local = {}
    for rank in range(cp):
        for index, token in enumerate(dispatch.rank_rows(rank)[::cast.chunk]):
            local[int(token) // cast.chunk] = index
    # Per hop: its size, pairs, and per (receiver, sender) the slice of
    # receives[receiver][sender] it carries and where that lands.
    hops, routes = [], []
    if transfer == "all_to_all":
        pieces = _split(cast.bucket(), stages - 1 if stages > 1 else 1) if cast.bucket() else []
        for index, (lo, hi) in enumerate(pieces):
            hops.append(Hop(cp * (hi - lo), None, 1 + index if stages > 1 else 1))
            routes.append({(r, s): (lo, hi, s * (hi - lo)) for r in range(cp) for s in range(cp)})
    else:
        shifts = [(d, size) for d, size in enumerate(cast.shift_buckets(), 1) if size]
        groups = _split(len(shifts), stages - 1 if stages > 1 else 1)
        for group, (lo, hi) in enumerate(groups):
            for d, size in shifts[lo:hi]:
                hops.append(Hop(size, tuple((s, (s + d) % cp) for s in range(cp)),
                                1 + group if stages > 1 else 1))
                routes.append({(r, (r - d) % cp): (0, size, 0) for r in range(cp)})
    landing = [[[] for _ in hops] for _ in range(cp)]
    sends = np.full((cp, max(sum(h.size for h in hops), 1)), PADDING, np.int32)
    at = [0] * cp
    for h, (hop, route) in enumerate(zip(hops, routes)):
        for (receiver, sender), (lo, hi, place) in route.items():
            chunks = cast.receives[receiver][sender][lo:hi]
            landing[receiver][h].extend((c, place + i) for i, c in enumerate(chunks))
        for sender in range(cp):
            # Destination after destination, as the collective reads them.
            width = hop.size if hop.pairs is not None else hop.size // cp
            targets = ([t for s, t in hop.pairs if s == sender] if hop.pairs is not None
                       else list(range(cp)))
            for target in targets:
                lo, hi, _ = route.get((target, sender), (0, 0, 0))
                chunks = cast.receives[target][sender][lo:hi]
                sends[sender, at[sender]:at[sender] + len(chunks)] = [local[c] for c in chunks]
                at[sender] += width
    called = max((h.stage for h in hops), default=0)
    return Layout(tuple(hops), 1 if stages == 1 else 1 + called,
                  tuple(tuple(map(tuple, rank)) for rank in landing), sends)


def _placed(mask: AttnMask, rows, columns, places, width: int) -> AttnMask:
    """Rows against key ranges `columns` (global), each placed at its local
    key `places[i]` in a call of `width` keys; other keys are padding."""
    if not columns:
        empty = np.zeros((0, np.asarray(mask.slice_table).shape[1]), np.int64)
        return AttnMask(sum(hi - lo for lo, hi in rows), width, empty,
                        name=f"{mask.name}:groupcast", params={"parent": mask.fingerprint()})
    packed = sub_mask(mask, rows, columns)
    # sub_mask packs the columns range after range; each slice piece lies in
    # one range, so moving a range's pieces to its place is exact.
    lengths = np.array([hi - lo for lo, hi in columns])
    packed_starts = np.cumsum(lengths) - lengths
    table = np.array(packed.slice_table)
    which = np.searchsorted(packed_starts, table[:, 2], side="right") - 1
    shift = np.asarray(places)[which] - packed_starts[which]
    table[:, 2] += shift
    table[:, 3] += shift
    return AttnMask(packed.seqlen_q, width, table, name=f"{mask.name}:groupcast",
                    params={"parent": mask.fingerprint()})


@functools.lru_cache(maxsize=16)
def call_masks(mask: AttnMask, cast: GroupCast, transfer: str,
               stages: int = 1) -> tuple[tuple[AttnMask, ...], ...]:
    """[call][rank]: what rank r's queries attend in each kernel call of
    transfer_layout(cast, transfer, stages); padding is never visible."""
    plan_ = transfer_layout(cast, transfer, stages)
    chunk, own = cast.chunk, cast.dispatch.tokens_per_rank
    widths, offsets = plan_.widths(own, chunk), plan_.hop_offsets(own, chunk)
    calls = []
    for call, width in enumerate(widths):
        masks = []
        for rank, rows in enumerate(cast.dispatch.ranges):
            columns, places = [], []
            if call == 0:  # own keys, in the rank's local order
                columns = list(rows)
                places = list(np.cumsum([0] + [hi - lo for lo, hi in rows[:-1]]))
            for h, hop in enumerate(plan_.hops):
                if (plan_.stages == 1) or hop.stage == call:
                    for global_chunk, place in plan_.landing[rank][h]:
                        columns.append((global_chunk * chunk, (global_chunk + 1) * chunk))
                        places.append(offsets[h] + place * chunk)
            masks.append(_placed(mask, rows, columns, places, width))
        calls.append(tuple(masks))
    return tuple(calls)


class GroupCastBackend(RankSubMasks, base.ContextParallelBackend):
    name = "jax.cp_groupcast"
    strategy = "groupcast"
    description = ("each rank receives only the K/V chunks its queries see (padded buckets: "
                   "one all_to_all or a ppermute per ring shift), then attends; with stages > 1 "
                   "the own keys' kernel runs while they travel; the backward returns partial "
                   "dK/dV to their owners")
    options = {**base.ContextParallelBackend.options, "chunk": int, "transfer": str,
               "stages": int, "transpose": str}

    def __init__(self, cp_size: int = 2, dispatch: str = "zigzag",
                 inner: str = base.DEFAULT_INNER, inner_options=None, chunk: int | None = None,
                 transfer: str = "all_to_all", stages: int = 1, transpose: str = "scatter",
                 dispatch_chunks: int | None = None):
        super().__init__(cp_size, dispatch, inner, inner_options, dispatch_chunks)
        if chunk is not None and chunk < 1:
            raise ValueError(f"chunk={chunk} must be a positive number of tokens")
        if transfer not in TRANSFERS:
            raise ValueError(f"transfer={transfer!r} is not one of {', '.join(TRANSFERS)}")
        if stages < 1:
            raise ValueError(f"stages={stages} must be 1 (one kernel call after the transfer) "
                             "or more (the own keys first, the received keys in stages - 1 calls)")
        if transpose not in TRANSPOSES:
            raise ValueError(f"transpose={transpose!r} is not one of {', '.join(TRANSPOSES)}")
        self.chunk, self.transfer, self.stages = chunk, transfer, stages
        self.transpose = transpose

    def cast(self, workload, dispatch) -> GroupCast:
        return cast_of(workload.mask, dispatch, self.chunk)

    # Not `layout`: that is Backend's array layout (bshd), which the
    # correctness gate reads.
    def transfer_layout(self, workload, dispatch) -> Layout:
        return transfer_layout(self.cast(workload, dispatch), self.transfer, self.stages)

    def strategy_problem(self, workload):
        try:
            self.cast(workload, self.dispatch(workload))
        except ValueError as exc:
            return str(exc)
        return None

    def calls(self, workload, dispatch) -> tuple[tuple[AttnMask, ...], ...]:
        return call_masks(workload.mask, self.cast(workload, dispatch), self.transfer,
                          self.stages)

    def sub_workloads(self, workload, dispatch):
        calls = self.calls(workload, dispatch)
        return [(f"rank {r}" + (f" call {c}" if len(calls) > 1 else ""), sub_workload(workload, m))
                for c, masks in enumerate(calls) for r, m in enumerate(masks)]

    def inner_support(self, workload, dispatch):
        if self.stages == 1:
            return super().inner_support(workload, dispatch)
        kernel = self.inner_backend.ring_kernel()
        if kernel is None:
            return Support.no(f"stages={self.stages} merge the calls' partial results by "
                              f"log-sum-exp; inner {self.inner_name}: "
                              f"{self.inner_backend.no_ring_kernel}")
        support = base.sub_support(self.inner_name, self.inner_backend,
                                   self.sub_workloads(workload, dispatch))
        if not support.ok:
            return support
        calls = self.calls(workload, dispatch)
        for rank in range(dispatch.cp):
            problem = kernel.problem([masks[rank] for masks in calls])
            if problem:
                return Support.no(problem)
        return Support.yes(kernel.how or support.how, support.directions)

    def send_table(self, workload, dispatch) -> np.ndarray:
        """Layout.sends with each padded slot indexing one past the rank's
        chunks: the gather fills it with zeros and its transpose drops it.
        Filled with a copy of chunk 0 instead, the backward scatter-added
        every padded slot onto that chunk: 5 % slower at cp 4 on
        causal_document (docs/context_parallel.md)."""
        sends = self.transfer_layout(workload, dispatch).sends
        past_the_end = dispatch.tokens_per_rank // self.cast(workload, dispatch).chunk
        return np.where(sends == PADDING, past_the_end, sends).astype(np.int32)

    def routes(self, workload, dispatch) -> tuple[np.ndarray, np.ndarray]:
        """(send_table, return_table): what each rank's slots carry, and for
        each of its chunks the slots that carried it (return_table)."""
        sends = self.send_table(workload, dispatch)
        chunks = dispatch.tokens_per_rank // self.cast(workload, dispatch).chunk
        return sends, return_table(sends, chunks)

    def sent_chunks(self, cast: GroupCast) -> int:
        """Chunks the transfer moves, padding included."""
        return cast.padded_chunks() if self.transfer == "all_to_all" else cast.shifted_chunks()

    def case_notes(self, workload) -> str:
        dispatch = self.dispatch(workload)
        cast = self.cast(workload, dispatch)
        return (f"{super().case_notes(workload)}; chunk={cast.chunk}; transfer={self.transfer}; "
                f"stages={self.transfer_layout(workload, dispatch).stages}; "
                f"K/V chunks seen {cast.moved_chunks()}, moved {self.sent_chunks(cast)} with "
                f"padding, where a ring moves {cast.all_gather_chunks()}")

    def local_attention(self, workload, dispatch):
        cast = self.cast(workload, dispatch)
        plan_ = self.transfer_layout(workload, dispatch)
        cp, chunk = cast.cp, cast.chunk
        # The scatter's program takes the send table alone, as before the option.
        send_table = (self.routes(workload, dispatch) if self.transpose == "gather"
                      else (self.send_table(workload, dispatch),))

        def pieces(x, routes):
            """Each hop's received piece of x on this rank, in hop order."""
            batch, tokens, heads, dim = x.shape
            chunks = x.reshape(batch, tokens // chunk, chunk, heads, dim)
            if self.transpose == "gather":
                picked = gather_chunks(chunks, *routes)
            else:  # padded slots index past the end: zeros, dropped by the scatter-add
                picked = jnp.take(chunks, routes[0], axis=1, mode="fill", fill_value=0)
            out, at = [], 0
            for hop in plan_.hops:
                piece = picked[:, at:at + hop.size]
                at += hop.size
                if hop.pairs is None:
                    piece = piece.reshape(batch, cp, hop.size // cp * chunk, heads, dim)
                    piece = jax.lax.all_to_all(piece, base.AXIS, 1, 1, tiled=True)
                else:
                    piece = jax.lax.ppermute(piece, base.AXIS, hop.pairs)
                out.append(piece.reshape(batch, hop.size * chunk, heads, dim))
            return out

        def call_keys(x, routes):
            """The keys (or values) of each kernel call on this rank."""
            received = pieces(x, routes)
            if plan_.stages == 1:
                return (jnp.concatenate([x, *received], axis=1),)
            return (x,) + tuple(
                jnp.concatenate([p for p, hop in zip(received, plan_.hops) if hop.stage == g],
                                axis=1) for g in range(1, plan_.stages))

        calls = self.calls(workload, dispatch)
        if plan_.stages > 1:
            bound = [self.inner_backend.ring_kernel().bind(masks, workload) for masks in calls]
            kernels = tuple(kernel for kernel, _ in bound)

            def per_rank_staged(q, k, v, both):
                call_tables, routes = both
                routes = base.own(routes)
                return _staged(kernels, q, call_keys(k, routes), call_keys(v, routes),
                               base.own(call_tables))

            return base.with_tables(per_rank_staged, self.mesh(),
                                    (tuple(tables for _, tables in bound), send_table))

        kernel = self.tabled_kernel()
        if kernel is None:
            attend = by_rank(self.inner_backend,
                             [w for _, w in self.sub_workloads(workload, dispatch)], base.AXIS)

            def per_rank(q, k, v, routes):
                routes = base.own(routes)
                (k,), (v,) = call_keys(k, routes), call_keys(v, routes)
                return attend(q, k, v)

            return base.with_tables(per_rank, self.mesh(), send_table)

        kernel, tables = kernel.bind(calls[0], workload)

        def per_rank_tabled(q, k, v, both):
            kernel_tables, routes = both
            routes = base.own(routes)
            (k,), (v,) = call_keys(k, routes), call_keys(v, routes)
            out, _ = kernel.attend(q, k, v, base.own(kernel_tables))
            return out

        return base.with_tables(per_rank_tabled, self.mesh(), (tables, send_table))


def return_table(sends: np.ndarray, chunks: int) -> np.ndarray:
    """(cp, chunks, most) int32: for each rank's chunk, the slots of its
    send table that carry it, padded with one past the last slot (read as
    zeros). `most` is the most slots any chunk fills (a chunk goes to every
    rank that sees it)."""
    cp, slots = sends.shape
    carried = [[[] for _ in range(chunks)] for _ in range(cp)]
    for rank, slot in zip(*np.nonzero(sends < chunks)):
        carried[rank][sends[rank, slot]].append(slot)
    most = max([1] + [len(c) for rank in carried for c in rank])
    table = np.full((cp, chunks, most), slots, np.int32)
    for rank, by_chunk in enumerate(carried):
        for chunk, found in enumerate(by_chunk):
            table[rank, chunk, :len(found)] = found
    return table


@jax.custom_vjp
def gather_chunks(chunks, sends, returns):
    """The send buckets' slots (axis 1) from a rank's chunks; a slot past the
    end carries zeros. Its transpose sums each chunk's slots by `returns`
    (return_table) in `most` gathers, where JAX's own transpose of the gather
    scatter-adds them (a chunk sent to several ranks adds in one place)."""
    return jnp.take(chunks, sends, axis=1, mode="fill", fill_value=0)


def _gather_chunks_fwd(chunks, sends, returns):
    return gather_chunks(chunks, sends, returns), (sends, returns)


def _gather_chunks_bwd(residuals, slots):
    sends, returns = residuals
    total = jnp.take(slots, returns[:, 0], axis=1, mode="fill", fill_value=0)
    if returns.shape[-1] > 1:  # a chunk several ranks received: its parts added in float32
        total = total.astype(jnp.float32)
        for j in range(1, returns.shape[-1]):
            total += jnp.take(slots, returns[:, j], axis=1, mode="fill", fill_value=0)
        total = total.astype(slots.dtype)
    return total, *base.no_gradients((sends, returns))


gather_chunks.defvjp(_gather_chunks_fwd, _gather_chunks_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _staged(kernels, q, ks, vs, tables):
    """Attention of q over the calls' keys, merged by log-sum-exp."""
    return _staged_forward(kernels, q, ks, vs, tables)[0]


def _staged_forward(kernels, q, ks, vs, tables):
    out = lse = None
    for kernel, k, v, call_tables in zip(kernels, ks, vs, tables):
        out, lse = merge(out, lse, *kernel.attend(q, k, v, call_tables))
    return out.astype(q.dtype), lse


def _staged_fwd(kernels, q, ks, vs, tables):
    out, lse = _staged_forward(kernels, q, ks, vs, tables)
    return out, (q, ks, vs, out, lse, tables)


def _staged_bwd(kernels, residuals, dout):
    """Each call's share of the gradients from the final out and lse; the
    received keys' first, so their dK/dV can travel home while the own
    keys' gradients run."""
    q, ks, vs, out, lse, tables = residuals
    dq = jnp.zeros(q.shape, jnp.float32)
    dks, dvs = [None] * len(ks), [None] * len(vs)
    for call in reversed(range(len(kernels))):
        call_dq, dk, dv = kernels[call].gradients(q, ks[call], vs[call], out, lse, dout,
                                                  tables[call])
        dq = dq + call_dq
        dks[call], dvs[call] = dk.astype(ks[call].dtype), dv.astype(vs[call].dtype)
    return dq.astype(q.dtype), tuple(dks), tuple(dvs), base.no_gradients(tables)


_staged.defvjp(_staged_fwd, _staged_bwd)
