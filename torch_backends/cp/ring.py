"""torch.cp_ring_flex: LCAB's ring on any mask.

K/V rotate around the ranks with P2P sends; at each step a rank attends the
shard it holds under that step's exact sub-mask, with the inner kernel's
ring form (`Backend.ring_kernel()`, the `RingKernel` below: torch.flex's
FlexAttention with return_lse, torch.sdpa_math's dense kernel), and the
partial results merge by log-sum-exp. Autograd runs the backward through
the merges and the rotations. An inner without a ring form is UNSUPPORTED
with its own `no_ring_kernel` reason.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist

from lcab.backend import Support
from lcab.cp import sub_mask, sub_workload
from lcab.masks import AttnMask
from torch_backends import distributed
from torch_backends.cp.base import InnerKernelBackend

_NEVER_SEEN = -1e30  # a finite log-sum-exp for rows no shard has shown yet

StepFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                        tuple[torch.Tensor, torch.Tensor]]


class RingKernel(Protocol):
    """What a kernel backend's ring_kernel() returns for this ring.

    A step attends the rank's queries to the K/V shard it holds, under the
    step's exact sub-mask, on (batch, heads, seq, dim) tensors, and returns
    (out, lse): lse (batch, heads, seq_q), natural log, -inf on rows that see
    nothing. Both must carry autograd's gradients: the ring differentiates
    its log-sum-exp merge as a whole.
    """

    how: str  # what runs each step, for the row's notes

    def refusal(self, mask: AttnMask) -> str | None:
        """Why a step on `mask` cannot run, beyond what the backend's own
        supports() says (None: it can)."""

    def step(self, mask: AttnMask, gqa_ratio: int) -> StepFunction:
        """The step's function, with its mask prepared on the host once."""


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


class RingBackend(InnerKernelBackend):
    name = "torch.cp_ring_flex"
    strategy = "ring"
    description = ("LCAB's ring on any mask: K/V rotate with P2P sends, the inner kernel's "
                   "ring form (torch.flex: FlexAttention with return_lse; torch.sdpa_math: "
                   "dense) on each step's exact sub-mask, log-sum-exp merge")

    def step_masks(self, workload, dispatch, rank: int) -> list[AttnMask | None]:
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
        kernel = self.inner_backend.ring_kernel()
        if kernel is None:
            return Support.no(f"inner kernel {self.inner_name} cannot run inside a ring: "
                              f"{self.inner_backend.no_ring_kernel}")
        steps = [(f"rank {rank}'s step {step}", sub_workload(workload, mask))
                 for rank in range(self.cp_size)
                 for step, mask in enumerate(self.step_masks(workload, dispatch, rank))
                 if mask is not None]
        for label, sub in steps:
            refusal = kernel.refusal(sub.mask)
            if refusal:
                return Support.no(f"inner kernel {self.inner_name} cannot run {label}: "
                                  f"{refusal}")
        support = self.inner_support(steps, how=kernel.how)
        if not support.ok:
            return support
        return dataclasses.replace(support, how=support.how + "; the next shard's transfer is "
                                   "started before each step's compute")

    def build(self, workload):
        dispatch = self.dispatch(workload)
        kernel = self.inner_backend.ring_kernel()
        steps = [None if mask is None else kernel.step(mask, workload.gqa_ratio)
                 for mask in self.step_masks(workload, dispatch, distributed.rank())]
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
