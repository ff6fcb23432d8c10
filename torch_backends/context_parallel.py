"""PyTorch context parallelism, one process per rank (torchrun).

The strategies that run an LCAB kernel inside, on any mask:
`torch.cp_ulysses` (yunchang's all_to_all from sequence- to head-sharded,
the inner kernel over the whole sequence, and back) and `torch.cp_allgather`
(all-gather K/V, then the rank's queries against every key, Llama-3 style).
The inner kernel is any torch kernel backend (`inner` option, default
torch.flex); it must express the rank's exact share of the mask (its own
`supports()` decides), so nothing quietly runs a different mask.

Tokens go to ranks by an lcab.cp dispatch (contiguous, zigzag, balanced),
the same as the JAX strategies use. The function takes the global inputs
and returns the rank's rows (torch_backends.distributed.ShardedFunction);
the timed call is the strategy on the rank's shards.

Library strategies that compute only some masks (yunchang's ring and USP,
ring-flash-attn, torch's native CP) live in torch_backends/cp_libraries.py.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import torch
import torch.distributed as dist

from lcab import registry
from lcab.backend import Backend, Support
from lcab.cp import (DISPATCH_NAMES, cached_dispatch, imbalance, sub_mask, sub_workload,
                     ulysses_heads_problem)
from lcab.workloads import Workload
from torch_backends import _shared, distributed
from torch_backends.distributed import AllGatherSeq, ShardedFunction

DEFAULT_INNER = "torch.flex"


def inner_kernel_names() -> list[str]:
    return registry.backend_names(framework="torch", suite="kernel")


class TorchCpBackend(Backend):
    """Shared by the torch strategies: options, the process group, dispatch."""

    framework = "torch"
    suite = "cp"
    layout = "bshd"
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    strategy: ClassVar[str] = ""
    options = {"cp_size": int, "dispatch": str}

    def __init__(self, cp_size: int = 2, dispatch: str = "zigzag"):
        if dispatch not in DISPATCH_NAMES:
            raise ValueError(f"dispatch={dispatch!r} is not one of {', '.join(DISPATCH_NAMES)}")
        self.cp_size, self.dispatch_name = cp_size, dispatch
        # FlexAttention's GPU kernels failed to lower for 64 tokens per rank
        # (Inductor: "No choices to select", H100, cp 4): the probe gives
        # every rank at least 128.
        self.probe_seqlen = max(type(self).probe_seqlen, 128 * cp_size)

    @classmethod
    def environment_problem(cls) -> str | None:
        if not distributed.launched():
            return ("runs one process per rank under torchrun; `python -m lcab.experiments "
                    "--framework=torch --suite=cp --cp_size=N` starts it")
        return None

    def mask_support(self, workload: Workload) -> Support:
        ranks = distributed.world_size()
        if ranks != self.cp_size:
            return Support.no(f"cp_size {self.cp_size} needs {self.cp_size} processes; "
                              f"torchrun started {ranks}")
        if workload.seqlen_q != workload.seqlen_k:
            return Support.no("context parallelism here shards one sequence: seqlen_q == seqlen_k")
        try:
            dispatch = self.dispatch(workload)
        except ValueError as exc:
            return Support.no(str(exc))
        return self.strategy_support(workload, dispatch)

    def dispatch(self, workload: Workload):
        return cached_dispatch(self.dispatch_name, workload.mask, self.cp_size)

    def case_notes(self, workload: Workload) -> str:
        return f"imbalance={self.imbalance(workload, self.dispatch(workload)):.3f}"

    def imbalance(self, workload: Workload, dispatch) -> float:
        """Max over mean of the ranks' exact attention areas."""
        return imbalance(workload.mask, dispatch)

    def strategy_support(self, workload: Workload, dispatch) -> Support:
        raise NotImplementedError

    def sharded(self, local_fn, dispatch) -> ShardedFunction:
        device = _shared.device_name()
        return ShardedFunction(local_fn, dispatch.rank_rows(distributed.rank()),
                               dispatch.order(), device)


class InnerKernelBackend(TorchCpBackend):
    """A strategy with an LCAB torch kernel backend inside."""

    options = {**TorchCpBackend.options, "inner": str}

    def __init__(self, inner: str = DEFAULT_INNER, **options):
        super().__init__(**options)
        names = inner_kernel_names()
        if inner not in names:
            raise ValueError(f"inner={inner!r} is not a torch kernel backend; choose one of "
                             f"{', '.join(names)}")
        self.inner_name = inner

    @functools.cached_property
    def inner(self) -> Backend | str:
        """The inner kernel backend, or why it cannot run here."""
        try:
            return registry.load_backend(self.inner_name)
        except registry.Unavailable as exc:
            return str(exc)

    def inner_support(self, workloads: list[Workload], what: str) -> Support:
        """The inner kernel's support of every rank's sub-workload (every rank
        must decide alike, or the collectives of the others would wait)."""
        if isinstance(self.inner, str):
            return Support.no(f"inner kernel {self.inner_name} is unavailable: {self.inner}")
        directions = set(self.inner.directions)
        hows = []
        for rank, sub in enumerate(workloads):
            support = self.inner.supports(sub)
            if not support.ok:
                return Support.no(f"inner kernel {self.inner_name} cannot run rank {rank}'s "
                                  f"{what}: {support.reason}")
            directions &= set(support.directions or self.inner.directions)
            hows.append(support.how)
        how = hows[0] if len(set(hows)) == 1 else " / ".join(sorted(set(hows)))
        kept = tuple(d for d in self.directions if d in directions)
        return Support.yes(f"{self.strategy}; dispatch={self.dispatch_name}; "
                           f"inner {self.inner_name} ({how})",
                           directions=None if kept == self.directions else kept)

    def inner_function(self, workload: Workload):
        """The inner kernel's f(q, k, v) on (batch, seq, heads, dim) tensors."""
        fn = self.inner.build(workload)
        if self.inner.layout == "bshd":
            return fn
        return lambda q, k, v: fn(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)


def _natural_order(x, positions):
    """Tokens of the sequence axis put back in natural order (None: already)."""
    return x if positions is None else x.index_select(1, positions)


def _positions(dispatch, inverse: bool, device):
    """Index tensor that reorders rank-major dispatch order to natural order
    (inverse) or back; None for the contiguous dispatch, which needs neither."""
    order = dispatch.order()
    if (order == range(len(order))).all():
        return None
    index = order.argsort() if inverse else order
    return torch.as_tensor(index, dtype=torch.long, device=device)


class UlyssesBackend(InnerKernelBackend):
    name = "torch.cp_ulysses"
    strategy = "ulysses"
    requires = ("torch", "yunchang")
    description = ("Ulysses with yunchang's all_to_all (sequence- to head-sharded and back), "
                   "any torch kernel inside (inner option)")

    def probe_heads_kv(self, workload):
        return min(workload.heads_kv, self.cp_size)  # fewer would not split

    def imbalance(self, workload, dispatch) -> float:
        return 1.0  # every rank attends the whole sequence for its share of the heads

    def head_workload(self, workload: Workload) -> Workload:
        return sub_workload(workload, workload.mask, head_share=self.cp_size)

    def strategy_support(self, workload, dispatch):
        problem = ulysses_heads_problem(workload, self.cp_size, "cp_size")
        if problem:
            return Support.no(problem)
        return self.inner_support([self.head_workload(workload)], "heads")

    def build(self, workload):
        from yunchang.comm.all_to_all import SeqAllToAll4D

        dispatch = self.dispatch(workload)
        attend = self.inner_function(self.head_workload(workload))
        device = _shared.device_name()
        to_natural = _positions(dispatch, True, device)
        to_dispatch = _positions(dispatch, False, device)
        group = dist.group.WORLD

        def local(q, k, v):
            # (b, S/cp, h, d) -> (b, S, h/cp, d): ranks' tokens, rank-major;
            # a contiguous block of heads keeps each query head with its K/V head.
            q, k, v = (_natural_order(SeqAllToAll4D.apply(group, x, 2, 1, False), to_natural)
                       for x in (q, k, v))
            out = _natural_order(attend(q, k, v), to_dispatch)
            return SeqAllToAll4D.apply(group, out, 1, 2, False)

        return self.sharded(local, dispatch)


class AllGatherBackend(InnerKernelBackend):
    name = "torch.cp_allgather"
    strategy = "allgather"
    description = ("all-gather K/V over the process group, then the rank's queries against "
                   "every key (Llama-3 style), any torch kernel inside (inner option)")

    def rank_workloads(self, workload: Workload, dispatch) -> list[Workload]:
        every_key = ((0, workload.seqlen_k),)
        return [sub_workload(workload, sub_mask(workload.mask, ranges, every_key))
                for ranges in dispatch.ranges]

    def strategy_support(self, workload, dispatch):
        return self.inner_support(self.rank_workloads(workload, dispatch), "queries")

    def build(self, workload):
        dispatch = self.dispatch(workload)
        mine = self.rank_workloads(workload, dispatch)[distributed.rank()]
        attend = self.inner_function(mine)
        device = _shared.device_name()
        to_natural = _positions(dispatch, True, device)
        group = dist.group.WORLD

        def local(q, k, v):
            k, v = (_natural_order(AllGatherSeq.apply(x, group), to_natural) for x in (k, v))
            return attend(q, k, v)

        return self.sharded(local, dispatch)


# ----- ring attention on any mask --------------------------------------------
INNER_WITH_LSE = ("flex", "math")
_NEVER_SEEN = -1e30  # a finite log-sum-exp for rows no shard has shown yet


def _start_shift(x, direction: int, group):
    """Start sending x `direction` ranks on around the ring: (the buffer
    that will hold what arrives, the requests to wait on before reading it)."""
    size, me = dist.get_world_size(group), dist.get_rank(group)
    x = x.contiguous()
    received = torch.empty_like(x, memory_format=torch.contiguous_format)
    peer = functools.partial(dist.get_global_rank, group)
    requests = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, x, peer((me + direction) % size), group),
        dist.P2POp(dist.irecv, received, peer((me - direction) % size), group)])
    return received, requests


def _shift(x, direction: int, group):
    received, requests = _start_shift(x, direction, group)
    for request in requests:
        request.wait()
    return received


class _StartRotation(torch.autograd.Function):
    """One ring step, started: the previous rank's tensor will arrive in the
    returned buffer once the requests appended to `pending` are waited on
    (so a step's compute can be enqueued meanwhile); the gradient travels
    back the other way, synchronously."""

    @staticmethod
    def forward(ctx, x, group, pending: list):
        ctx.group = group
        received, requests = _start_shift(x, 1, group)
        pending.append(requests)
        return received

    @staticmethod
    def backward(ctx, grad):
        return _shift(grad, -1, ctx.group), None, None


def _merge(out, lse, step_out, step_lse):
    """Two partial attentions of the same rows combined by log-sum-exp
    ((b, h, s, d) float32 and (b, h, s)); differentiable, finite everywhere."""
    step_out, step_lse = step_out.float(), step_lse.float().clamp(min=_NEVER_SEEN)
    if out is None:
        return step_out, step_lse
    both = torch.logaddexp(lse, step_lse)
    weight = lambda part: torch.exp(part - both).unsqueeze(-1)  # noqa: E731
    return out * weight(lse) + step_out * weight(step_lse), both


def _math_with_lse(mask_dense: torch.Tensor, ratio: int):
    """Dense attention returning (out, lse), (b, h, s, d) layout: the CPU
    inner kernel of the ring, where FlexAttention has no backward."""

    def attend(q, k, v):
        k, v = (x.repeat_interleave(ratio, dim=1) for x in (k, v))
        scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
        scores = scores.masked_fill(~mask_dense, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        weights = torch.exp(scores - lse.clamp(min=_NEVER_SEEN).unsqueeze(-1))
        return weights @ v.float(), lse  # float32 into the merge

    return attend


class RingFlexBackend(TorchCpBackend):
    name = "torch.cp_ring_flex"
    strategy = "ring"
    options = {**TorchCpBackend.options, "inner": str}
    description = ("LCAB's ring on any mask: K/V rotate with P2P sends, FlexAttention "
                   "(return_lse) on each step's exact sub-mask, log-sum-exp merge; inner=math "
                   "is a dense kernel for CPU checks")

    def __init__(self, inner: str = "flex", **options):
        super().__init__(**options)
        if inner not in INNER_WITH_LSE:
            raise ValueError(f"inner={inner!r} is not one of {', '.join(INNER_WITH_LSE)}")
        self.inner_name = inner
        if inner == "flex" and not torch.cuda.is_available():
            self.directions = ("fwd",)  # FlexAttention has no CPU backward

    def step_masks(self, workload, dispatch, rank: int) -> list:
        """Rank's queries against the shard it holds at each step (the
        shard of rank - step), None where nothing is visible."""
        cp = self.cp_size
        masks = []
        for step in range(cp):
            sub = sub_mask(workload.mask, dispatch.ranges[rank],
                           dispatch.ranges[(rank - step) % cp])
            masks.append(sub if sub.area() else None)
        return masks

    def strategy_support(self, workload, dispatch):
        if self.inner_name == "flex":
            from torch_backends.flex import unsupported_reason

            for rank in range(self.cp_size):
                for sub in filter(None, self.step_masks(workload, dispatch, rank)):
                    reason = unsupported_reason(sub)
                    if reason:
                        return Support.no(f"FlexAttention cannot run a ring step of rank "
                                          f"{rank}: {reason}")
            how = "torch.flex (FlexAttention with return_lse" + (
                ", torch.compile)" if torch.cuda.is_available() else ", uncompiled)")
        else:
            shard = workload.seqlen_q // self.cp_size
            if shard * shard > (1 << 26):
                return Support.no(f"inner=math scores a dense {shard} x {shard} step")
            how = "dense math kernel with lse"
        return Support.yes(f"{self.strategy}; dispatch={self.dispatch_name}; inner {how}; "
                           "the next shard's transfer is started before each step's compute")

    def build(self, workload):
        dispatch = self.dispatch(workload)
        attention = None
        if self.inner_name == "flex":
            from torch_backends import flex

            # One compiled function for every step (compiling resets Dynamo).
            attention = flex.compiled_flex_attention() if torch.cuda.is_available() \
                else flex.flex_attention
        steps = [self._step_function(workload, sub, attention)
                 for sub in self.step_masks(workload, dispatch, distributed.rank())]
        group = dist.group.WORLD

        def local(q, k, v):
            q = q.transpose(1, 2)
            # K and V travel as one tensor: one chain of rotations, whose
            # backward every rank then runs in the same order (two chains
            # could interleave differently per rank and cross their sends).
            kv = torch.stack((k, v)).transpose(2, 3).contiguous()
            out = lse = None
            for step, attend in enumerate(steps):
                # The next shard's transfer starts first, so this step's
                # compute is enqueued while it runs; then wait for it.
                pending = []
                arriving = (_StartRotation.apply(kv, group, pending)
                            if step + 1 < len(steps) else None)
                if attend is not None:
                    out, lse = _merge(out, lse, *attend(q, kv[0], kv[1]))
                for request in (r for requests in pending for r in requests):
                    request.wait()
                kv = kv if arriving is None else arriving
            # Every rank must run every rotation's backward (its peers wait
            # for those sends), also those whose later shards it never
            # attends: the last shard joins the graph with weight zero.
            unused = 0 * kv.float().sum()
            out = unused + (0 * q.float() if out is None else out)
            return out.to(q.dtype).transpose(1, 2)

        return self.sharded(local, dispatch)

    def _step_function(self, workload, sub, attention):
        if sub is None:
            return None
        ratio = workload.gqa_ratio
        device = _shared.device_name()
        if attention is None:
            return _math_with_lse(torch.as_tensor(sub.to_dense(), device=device), ratio)
        from torch_backends import flex

        block_mask = flex.build_block_mask(sub, device)
        return lambda q, k, v: attention(q, k, v, block_mask=block_mask,
                                         enable_gqa=ratio > 1, return_lse=True)
