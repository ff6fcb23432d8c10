"""torch.distributed for the CP suite: the process group and sharded functions.

A torch CP run is one process per GPU, started by torchrun (or by
`python -m lcab.experiments --framework=torch --suite=cp`, which starts
torchrun). Every process runs the same sweep in the same order; the
inputs are generated identically on every rank (same seed), so a CP
strategy's function takes the *global* q, k, v and returns this rank's
share of the output. `ShardedFunction` is that function plus what the
runtime needs to check it: gather the output, sum the gradients.

Only rank 0 writes rows (its times are the maximum over ranks).
"""

from __future__ import annotations

import atexit
import datetime
import functools
import os

import numpy as np
import torch
import torch.distributed as dist

SEQ_AXIS = 1  # CP functions take (batch, seq, heads, dim)


def launched() -> bool:
    """Whether this process was started by torchrun (or any launcher that
    sets its environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def ensure_process_group() -> None:
    """Join the launcher's process group once: NCCL on GPUs, gloo on CPUs."""
    if not dist.is_initialized() and launched():
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank())
            backend = "nccl"
        else:
            backend = "gloo"
        # A rank that fails (an OOM it cannot share) leaves the others waiting
        # in a collective; the timeout turns that into an error, not a hang.
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    if dist.is_initialized():  # ours, or one the caller started
        leave_at_exit()


@functools.lru_cache(maxsize=None)
def leave_at_exit() -> None:
    """Take the process groups down at interpreter exit (once): gloo's
    threads (the default group's, yunchang's and the comm suite's
    subgroups) otherwise can abort the process as it exits ("terminate
    called without an active exception"), which fails a finished run."""
    atexit.register(lambda: dist.destroy_process_group() if dist.is_initialized() else None)


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def uses_gloo(group=None) -> bool:
    return dist.get_backend(group) == "gloo"


class _TakeRows(torch.autograd.Function):
    """x[:, rows] of a global tensor; the gradient lands on those rows only,
    with no communication (the runtime sums the ranks' parts to check them)."""

    @staticmethod
    def forward(ctx, x, rows):
        ctx.shape, ctx.rows = x.shape, rows
        return x.index_select(SEQ_AXIS, rows)

    @staticmethod
    def backward(ctx, grad):
        whole = grad.new_zeros(ctx.shape)
        return whole.index_add_(SEQ_AXIS, ctx.rows, grad), None


class AllGatherSeq(torch.autograd.Function):
    """Every rank's shard, concatenated on the sequence axis in rank order;
    the backward hands each rank the summed gradient of its own shard."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        size = dist.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=SEQ_AXIS)

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        size, me = dist.get_world_size(group), dist.get_rank(group)
        grad = grad.contiguous()
        if uses_gloo(group):  # gloo has no reduce_scatter
            dist.all_reduce(grad, group=group)
            return grad.chunk(size, dim=SEQ_AXIS)[me].contiguous(), None
        parts = [p.contiguous() for p in grad.chunk(size, dim=SEQ_AXIS)]
        mine = torch.empty_like(parts[me])
        dist.reduce_scatter(mine, parts, group=group)
        return mine, None


class ShardedFunction:
    """A CP strategy as the runtime sees it.

    `__call__(q, k, v)` takes the global inputs and returns this rank's
    output rows (in `rows` order); only `local_fn` -- the strategy on the
    rank's shards -- and the local row selection are timed. `gather` and
    `reduce` assemble global results for the correctness checks.
    """

    def __init__(self, local_fn, rows: np.ndarray, order: np.ndarray, device, group=None):
        self.local_fn = local_fn
        self.group = group
        self.rows = torch.as_tensor(rows, dtype=torch.long, device=device)
        self.inverse = torch.as_tensor(np.argsort(order), dtype=torch.long, device=device)

    def __call__(self, q, k, v):
        return self.local_fn(*(_TakeRows.apply(x, self.rows) for x in (q, k, v)))

    def local(self, x):
        """This rank's rows of a global tensor (e.g. the output cotangent)."""
        return x.index_select(SEQ_AXIS, self.rows)

    def gather(self, out):
        """The global output, in natural token order, on every rank."""
        size = dist.get_world_size(self.group)
        parts = [torch.empty_like(out) for _ in range(size)]
        dist.all_gather(parts, out.contiguous(), group=self.group)
        return torch.cat(parts, dim=SEQ_AXIS).index_select(SEQ_AXIS, self.inverse)

    def reduce(self, grad):
        """Every rank's part of a global gradient, summed."""
        grad = grad.contiguous()
        dist.all_reduce(grad, group=self.group)
        return grad
