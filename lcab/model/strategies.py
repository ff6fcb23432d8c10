"""Predicted time of one attention call under a CP strategy, and where it goes.

Work per rank comes from the exact mask: the same dispatch code the real
runs use (lcab.cp), each rank's pairs against each key shard. Each call's
time comes from a measured kernel curve; each collective's from the
network's alpha-beta model. How the strategies overlap, as the real ones do:

- ring: cp steps; at step s rank i meets the keys of rank (i - s) mod cp
  while the next shard is in flight, so a step lasts max(compute + merge,
  transfer). Forward: each rank runs its steps back to back (the K/V it
  passes on do not wait for its compute), so the slowest rank's sum sets
  the time. Backward: the shard and its dK/dV rotate together (twice the
  bytes) and a step waits for the neighbour's previous one, so ranks move
  in lockstep (the slowest rank sets each step). Empty steps compute
  nothing but still pass the shard on.
  The merge is what each step does outside the kernel, memory-bound at
  the GPU's memory bandwidth: the log-sum-exp merge of the step's output
  into the float32 running output (forward), the step's dQ, dK and dV
  added to their float32 accumulators (backward).
- allgather: all-gather K/V (exposed), then each rank's rows against every
  key in one call. Backward: the dK/dV reduce-scatter (as many bytes,
  exposed) and the backward call.
- ulysses: all-to-all q, k, v to head shards (exposed), the whole sequence
  for heads/cp heads in one call, all-to-all back. Needs query heads
  divisible by cp; K/V heads fewer than cp are repeated first (as
  jax.cp_ulysses does), and the K/V all-to-all carries the copies.
  Backward: the gradients travel the same way (the same bytes).
- usp: Ulysses inside groups of `ulysses_size` ranks, a ring of cp /
  ulysses_size steps between groups on heads/ulysses_size heads.
- groupcast: as jax.cp_groupcast runs it: one all_to_all of the K/V chunks
  each rank's queries see (lcab.cp.groupcast.plan at the default transfer
  chunk), every bucket padded to the largest. With one stage (its default)
  the transfer is exposed, then each rank's rows meet its own and the
  received keys in one call; backward, the dK/dV all_to_all back (the same
  bytes, exposed) and the backward call. With `stages` N > 1 the own keys'
  call runs while the transfer, cut in N - 1 pieces, arrives; piece g's
  call starts when both it and call g - 1 are done. Backward, the received
  keys' calls run first, each piece of dK/dV leaving once every rank has
  finished its call, the own keys' call under the last of them.
- magi: MagiAttention's form of group-cast, which LCAB does not run:
  ragged transfers (each rank receives exactly the chunks its queries see,
  no padding), sent node-aware (a rank's bytes from its own node cross
  NVLink, the rest the inter-node links, at the same time), overlapped as
  groupcast's stages with MAGI_STAGES calls: MagiAttention's all-to-all-v
  group collectives (its "a2av" runs).
- magi_native: the same with MagiAttention's native group collectives
  (DeepEP-style, hierarchical; its "native" runs, the headline figures): a
  chunk crosses to another node once, to the rank of the same local index
  there, which forwards it over NVLink to the ranks of its node that see
  it; the two legs are pipelined, so the slower one sets the time.
  Both magi forms share the GPU's SMs as MagiAttention does (MAGI_SMS).

The breakdown adds up to the total: compute (the mean rank's kernel time),
imbalance (the slowest rank's extra kernel time), exposed communication
(the rest); the ring's merges count as compute. Not modelled: other memory
copies and launch gaps between steps.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from lcab.cp import cached_dispatch, pair_areas, rank_areas, ring_step_areas
from lcab.cp.groupcast import plan, transfer_chunk
from lcab.flops import attention_flops
from lcab.masks.mask import AttnMask
from lcab.model.kernel_curve import KernelCurve
from lcab.model.network import Network

STRATEGIES = ("ring", "allgather", "ulysses", "usp", "groupcast", "magi", "magi_native")
# The strategies LCAB runs (the magi ones are modelled only): what "our best" means.
RUN_HERE = ("ring", "allgather", "ulysses", "usp", "groupcast")
# magi's kernel calls: the own keys, then the received keys in two pieces,
# as the published MagiAttention runs overlap them (exps/dist_attn/
# benchmark_conf.py: static overlap of degree 2, a local stage and two
# remote ones).
MAGI_STAGES = 3
# How MagiAttention's kernels share the SMs with its collectives (its code
# at commit 09fc31b2). The a2av form runs its attention kernel on all but
# 4 SMs throughout (MAGI_ATTENTION_FFA_{FORWARD,BACKWARD}_SM_MARGIN's
# default where CUDA_DEVICE_MAX_CONNECTIONS > 1; the benchmark sets 8). The
# native form runs it on every SM but only after its group-collective
# kernels have taken theirs (a kernel barrier; GrpCollConfig.num_sms, 48 in
# the benchmark's configuration), so while they move data the attention
# has the rest. A Hopper SXM GPU has 132 SMs.
GPU_SMS = 132
MAGI_SM_MARGIN = 4
MAGI_NATIVE_COMM_SMS = 48
_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# An H100 SXM's HBM3 moves 3.35 TB/s (NVIDIA's figure); streaming
# elementwise kernels reach about 90 % of it.
HBM_H100 = 0.9 * 3.35e12


@dataclasses.dataclass(frozen=True)
class Shape:
    heads_q: int = 64
    heads_kv: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"
    batch: int = 1

    def token_bytes(self, heads: int) -> int:
        """Bytes of one token's vectors over `heads` heads."""
        return self.batch * heads * self.head_dim * _BYTES[self.dtype]


@dataclasses.dataclass(frozen=True)
class Prediction:
    strategy: str
    dispatch: str
    cp: int
    direction: str
    seconds: float
    compute_s: float
    imbalance_s: float
    exposed_comm_s: float
    flops: int  # the whole call's exact FLOPs
    problem: str = ""  # why the strategy cannot run this case ("" if it can)

    @property
    def tflops_per_gpu(self) -> float:
        if self.problem or self.seconds <= 0:
            return float("nan")
        return self.flops / (self.seconds * self.cp) / 1e12


def _call_seconds(curve: KernelCurve, shape: Shape, area, rows, cols, heads: int,
                  direction: str) -> np.ndarray:
    area = np.asarray(area, dtype=np.float64)
    flops = attention_flops(1, batch=shape.batch, heads_q=heads, head_dim=shape.head_dim,
                            direction=direction) * area
    density = area / max(rows * cols, 1)
    return curve.seconds_of(flops, density, direction)


def _merge_bytes(local: int, heads_q: int, heads_kv: int, shape: Shape, direction: str) -> int:
    """HBM bytes one ring step moves outside its kernel. Forward: the float32
    running output read and written, the step's output read. Backward: dQ's
    float32 accumulator read and written with the step's float32 dQ read,
    and the same for dK and dV on the K/V heads."""
    elements = shape.batch * local * shape.head_dim
    if direction == "fwd":
        return elements * heads_q * (4 + 4 + _BYTES[shape.dtype])
    return elements * (heads_q + 2 * heads_kv) * 12


def _call_merge_bytes(local: int, shape: Shape, direction: str) -> int:
    """HBM bytes merging one more kernel call's result moves: the forward's
    as a ring step's; the backward's, dQ's float32 sum read and written and
    the call's float32 dQ read (its dK/dV leave for their owners)."""
    return _merge_bytes(local, shape.heads_q, 0, shape, direction)


def _ring(mask: AttnMask, dispatch_name: str, ranks: int, heads_q: int, heads_kv: int,
          shape: Shape, curve: KernelCurve, network: Network, direction: str,
          span: int, memory_bytes_per_s: float,
          dispatch_chunks: int | None = None) -> tuple[float, float, float]:
    """(total, mean compute, max compute) of a ring of `ranks` over `span` GPUs."""
    steps = ring_step_areas(pair_areas(mask, cached_dispatch(dispatch_name, mask, ranks,
                                                             dispatch_chunks)))
    local = mask.seqlen_q // ranks
    # A ring of one rank is the kernel alone: nothing to merge.
    merge = (_merge_bytes(local, heads_q, heads_kv, shape, direction) / memory_bytes_per_s
             if ranks > 1 else 0.0)
    compute = _call_seconds(curve, shape, steps, local, local, heads_q, direction) + merge
    shard = 2 * local * shape.token_bytes(heads_kv) * (2 if direction == "bwd" else 1)
    transfer = network.seconds("ppermute", shard, span)
    in_flight = np.array([transfer if s < ranks - 1 else 0.0 for s in range(ranks)])
    if direction == "fwd":
        # Nothing a forward step sends depends on its compute (K/V only), so
        # each rank runs its steps back to back, as the profile of jax.cp_ring
        # shows; the slowest rank's sum sets the time.
        total = float(np.max(np.sum(np.maximum(compute, in_flight), axis=1)))
        slowest = float(compute.sum(axis=1).max())
    else:
        # dK/dV travel with K/V: a step starts when the neighbour's previous
        # one is done, so the slowest rank of each step sets it (lockstep).
        total = float(np.sum(np.maximum(compute.max(axis=0), in_flight)))
        slowest = float(compute.max(axis=0).sum())
    return total, float(compute.sum(axis=1).mean()), slowest


def predict(strategy: str, mask: AttnMask, cp: int, shape: Shape, curve: KernelCurve,
            network: Network, *, dispatch: str = "balanced", direction: str = "fwd",
            ulysses_size: int | None = None, stages: int = 1,
            dispatch_chunks: int | None = None,
            memory_bytes_per_s: float = HBM_H100) -> Prediction:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    seqlen = mask.seqlen_q
    flops = attention_flops(mask.area(), batch=shape.batch, heads_q=shape.heads_q,
                            head_dim=shape.head_dim, direction=direction)
    result = dict(strategy=strategy, dispatch=dispatch, cp=cp, direction=direction, flops=flops)

    def refuse(reason: str) -> Prediction:
        nan = float("nan")
        return Prediction(**result, seconds=nan, compute_s=nan, imbalance_s=nan,
                          exposed_comm_s=nan, problem=reason)

    def done(total, mean, slowest) -> Prediction:
        # max() keeps float rounding from showing as a negative share.
        return Prediction(**result, seconds=total, compute_s=mean,
                          imbalance_s=max(0.0, slowest - mean),
                          exposed_comm_s=max(0.0, total - slowest))

    if seqlen % cp:
        return refuse(f"{seqlen} tokens do not split over cp {cp}")
    local = seqlen // cp
    grad = 2 if direction == "bwd" else 1
    if strategy == "ring":
        try:
            return done(*_ring(mask, dispatch, cp, shape.heads_q, shape.heads_kv, shape, curve,
                               network, direction, cp, memory_bytes_per_s, dispatch_chunks))
        except ValueError as exc:  # a dispatch that cannot split this length
            return refuse(str(exc))
    if strategy == "allgather":
        try:
            areas = rank_areas(mask, cached_dispatch(dispatch, mask, cp, dispatch_chunks))
        except ValueError as exc:
            return refuse(str(exc))
        compute = _call_seconds(curve, shape, areas, local, seqlen, shape.heads_q, direction)
        gather = network.seconds("all_gather", 2 * seqlen * shape.token_bytes(shape.heads_kv), cp)
        return done(gather + compute.max(), compute.mean(), compute.max())
    if strategy == "ulysses":
        if shape.heads_q % cp:
            return refuse(f"Ulysses splits heads over cp: {shape.heads_q} query heads do not "
                          f"divide by {cp}")
        return done(*_ulysses_part(mask, cp, cp, shape, curve, network, direction, grad))
    if strategy in ("groupcast", "magi", "magi_native"):
        try:
            split = cached_dispatch(dispatch, mask, cp, dispatch_chunks)
            cast = plan(mask, split, transfer_chunk(split))
        except ValueError as exc:
            return refuse(str(exc))
        if strategy != "groupcast":
            moving = _ragged_seconds if strategy == "magi" else _native_seconds
            return done(*_groupcast(mask, split, cast, shape, curve, network, direction,
                                    moving(cast, shape, network), MAGI_STAGES,
                                    int(cast.received().max()) * cast.chunk, memory_bytes_per_s,
                                    sms=MAGI_SMS[strategy]))
        bucket_bytes = 2 * cast.bucket() * cast.chunk * shape.token_bytes(shape.heads_kv)
        return done(*_groupcast(mask, split, cast, shape, curve, network, direction,
                                network.seconds("all_to_all", cp * bucket_bytes, cp), stages,
                                int(cast.received().max()) * cast.chunk, memory_bytes_per_s))
    # usp
    size = ulysses_size or _default_ulysses(cp, shape.heads_kv, network.gpus_per_node)
    if cp % size or shape.heads_kv % size:
        return refuse(f"ulysses_size {size} must divide cp {cp} and the {shape.heads_kv} "
                      "K/V heads")
    ranks = cp // size
    a2a = _all_to_all_seconds(local, shape, network, size, grad)
    try:
        total, mean, slowest = _ring(mask, dispatch, ranks, shape.heads_q // size,
                                     shape.heads_kv // size, shape, curve, network, direction,
                                     cp if ranks > 1 else size, memory_bytes_per_s,
                                     dispatch_chunks)
    except ValueError as exc:
        return refuse(str(exc))
    return done(total + a2a, mean, slowest)


@dataclasses.dataclass(frozen=True)
class SmShare:
    """The SMs an attention call leaves to communication: `always` for the
    whole call, `while_moving` while a transfer is in flight (of GPU_SMS)."""

    always: int = 0
    while_moving: int = 0

    @property
    def call_factor(self) -> float:
        """How much longer a call takes on the SMs left to it throughout."""
        return GPU_SMS / (GPU_SMS - self.always)

    def lost_seconds(self, transfer: float, compute: float) -> float:
        """The attention work a transfer of `transfer` seconds displaces
        from the SMs it takes, to be done after it: the share of the SMs
        taken, over the time the two overlap."""
        return self.while_moving / (GPU_SMS - self.always) * min(transfer, compute)


MAGI_SMS = {"magi": SmShare(always=MAGI_SM_MARGIN),
            "magi_native": SmShare(while_moving=MAGI_NATIVE_COMM_SMS)}


def _groupcast(mask, split, cast, shape, curve, network, direction, transfer: float,
               stages: int, received_keys: int, memory_bytes_per_s: float = HBM_H100,
               sms: SmShare = SmShare()) -> tuple[float, float, float]:
    """(total, mean compute, max compute) of group-cast whose transfer (one
    way) takes `transfer` seconds and whose received keys number
    `received_keys` per rank, in `stages` kernel calls. Each call after the
    first is merged into the running result outside the kernel (forward:
    the log-sum-exp merge; backward: dQ added to its float32 sum), at the
    GPU's memory bandwidth: the merge fusions the profile of stages=2
    shows (results/gpu/2026-11-28-h200x2-groupcast-stages). `sms`: what
    the calls leave to the communication (SmShare), none where nothing
    moves (cp 1); the work a transfer displaces counts as exposed
    communication."""
    if received_keys == 0:
        sms = SmShare()
    local = mask.seqlen_q // cast.cp
    areas = pair_areas(mask, split)
    own_area = np.diag(areas)
    heads = shape.heads_q

    def calls(area, cols):
        return sms.call_factor * _call_seconds(curve, shape, area, local, cols, heads, direction)

    if stages == 1 or received_keys == 0:
        # The transfer is exposed before the call: it displaces no work.
        compute = calls(areas.sum(axis=1), local + received_keys)
        return transfer + float(compute.max()), float(compute.mean()), float(compute.max())
    pieces = stages - 1
    own = calls(own_area, local)
    # Each received call: an even share of the received keys and their area.
    merge = _call_merge_bytes(local, shape, direction) / memory_bytes_per_s
    rest = pieces * (calls((areas.sum(axis=1) - own_area) / pieces,
                           max(received_keys // pieces, 1)) + merge)
    piece = transfer / pieces
    if direction == "fwd":
        finish = own.copy()
        for g in range(1, pieces + 1):
            finish = np.maximum(finish, g * piece) + rest / pieces
        total = float(finish.max())
    else:
        done_calls, sent = np.zeros_like(own), 0.0
        for _ in range(pieces):
            done_calls = done_calls + rest / pieces
            # A collective leaves when every rank has its piece ready.
            sent = max(sent, float(done_calls.max())) + piece
        total = max(float((done_calls + own).max()), sent)
    compute = own + rest
    slowest = float(compute.max())
    return total + sms.lost_seconds(transfer, slowest), float(compute.mean()), slowest


def _ragged_seconds(cast, shape: Shape, network: Network) -> float:
    """The slowest rank's ragged group-cast, each rank receiving and sending
    exactly its chunks: bytes between GPUs of one node over NVLink, the
    rest over the inter-node links, both at once."""
    cp, per_node = cast.cp, network.gpus_per_node
    chunk_bytes = 2 * cast.chunk * shape.token_bytes(shape.heads_kv)
    counts = cast.counts() * chunk_bytes  # [r, s]: bytes r receives from s
    node = np.arange(cp) // per_node
    same = node[:, None] == node[None, :]
    return _slowest_leg([(np.where(same, moved, 0).sum(axis=1),
                          np.where(same, 0, moved).sum(axis=1))
                         for moved in (counts, counts.T)], network)  # received, sent


def _slowest_leg(legs, network: Network) -> float:
    """The slowest rank's transfer: per leg (received, sent), each rank's
    bytes over NVLink and over the inter-node links, both at once."""
    link, inter = network.intra["all_to_all"], network.inter
    slowest = 0.0
    for inside, outside in legs:
        alpha = np.where(outside > 0, inter.alpha_s, link.alpha_s)
        seconds = alpha + np.maximum(inside / link.beta_bytes_per_s,
                                     outside / inter.beta_bytes_per_s)
        busy = (inside + outside) > 0  # a rank that moves nothing pays no latency
        slowest = max(slowest, float(seconds[busy].max(initial=0.0)))
    return slowest


def _native_seconds(cast, shape: Shape, network: Network) -> float:
    """The slowest rank's hierarchical group-cast (MagiAttention's native
    group collectives): chunks between GPUs of one node go over NVLink; a
    chunk that ranks of another node see crosses the inter-node link once,
    to the rank of that node with the sender's local index, which forwards
    it over NVLink to each of them. Each rank's inter-node and NVLink legs,
    sent and received, run at once (pipelined in pieces)."""
    cp, per_node = cast.cp, network.gpus_per_node
    chunk_bytes = 2 * cast.chunk * shape.token_bytes(shape.heads_kv)
    node = np.arange(cp) // per_node
    # [rank]: chunks sent and received over each kind of link
    across_out, across_in, inside_out, inside_in = (np.zeros(cp) for _ in range(4))
    for sender in range(cp):
        for there in range(int(node[-1]) + 1):
            members = np.flatnonzero(node == there)
            if there == node[sender]:
                relay = sender  # its own node: straight over NVLink
            else:
                seen = set().union(*(cast.receives[r][sender] for r in members))
                if not seen:
                    continue
                relay = int(members[(sender % per_node) % len(members)])
                across_out[sender] += len(seen)
                across_in[relay] += len(seen)
            for r in members:
                if r != relay and r != sender:
                    moved = len(cast.receives[r][sender])
                    inside_out[relay] += moved
                    inside_in[r] += moved
    return _slowest_leg([(chunk_bytes * inside_in, chunk_bytes * across_in),
                         (chunk_bytes * inside_out, chunk_bytes * across_out)], network)


def _default_ulysses(cp: int, heads_kv: int, gpus_per_node: int) -> int:
    """The largest Ulysses group that divides cp and the K/V heads and stays in a node."""
    return max(u for u in range(1, min(cp, heads_kv, gpus_per_node) + 1)
               if cp % u == 0 and heads_kv % u == 0)


def layout(strategy: str, cp: int, heads_kv: int, gpus_per_node: int,
           ulysses_size: int | None = None) -> str:
    """How `strategy` lays cp GPUs out, in words: "Ulysses 8 inside a node x
    ring 8 across" (USP's group as predict() picks it where not given)."""
    nodes = -(-cp // gpus_per_node)
    across = f" GPUs on {nodes} nodes" if nodes > 1 else " GPUs"
    if strategy == "usp":
        size = ulysses_size or _default_ulysses(cp, heads_kv, gpus_per_node)
        where = "inside a node" if size <= gpus_per_node else "across nodes"
        return f"Ulysses {size} {where} x ring {cp // size}" + (" across" if nodes > 1 else "")
    words = {"ring": "ring of", "allgather": "all-gather over", "ulysses": "Ulysses (heads) over",
             "groupcast": "group-cast over", "magi": "MagiAttention group-cast (a2av) over",
             "magi_native": "MagiAttention group-cast (native) over"}
    return f"{words[strategy]} {cp}{across}"


def _all_to_all_seconds(local: int, shape: Shape, network: Network, ranks: int,
                        grad: int) -> float:
    """q, k, v to head shards and the output back (the backward's gradients
    travel the same bytes), for `local` tokens per rank; K/V heads fewer
    than the ranks travel repeated (lcm(heads_kv, ranks) of them)."""
    kv_heads = math.lcm(shape.heads_kv, ranks)
    there = local * shape.token_bytes(shape.heads_q + 2 * kv_heads)
    back = local * shape.token_bytes(shape.heads_q)
    return grad * (network.seconds("all_to_all", there, ranks)
                   + network.seconds("all_to_all", back, ranks))


def _ulysses_part(mask, cp, size, shape, curve, network, direction, grad):
    compute = float(_call_seconds(curve, shape, mask.area(), mask.seqlen_q, mask.seqlen_k,
                                  shape.heads_q // size, direction))
    a2a = _all_to_all_seconds(mask.seqlen_q // cp, shape, network, size, grad)
    return compute + a2a, compute, compute
