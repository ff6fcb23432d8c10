"""The comm suite in torch: ppermute (a ring of batched P2P send/recv),
all_gather and all_to_all over the first `ranks` processes of the torchrun
group -- the collectives torch's CP strategies call (NCCL on GPUs, gloo on
CPUs). lcab.comm defines sizes and bandwidths.

One sample times `chain` collectives back to back on the host clock, the
device synchronised before and after, and divides by `chain`: torch issues
each collective from Python, so its dispatch is part of what a strategy
pays. Processes outside the group wait; every process returns the same
samples (the slowest member's).
"""

from __future__ import annotations

import functools
import time

import numpy as np
import torch
import torch.distributed as dist

from lcab.comm import check_op
from torch_backends import distributed
from torch_backends.device import device_name

_TARGET_LOOP_MS = 20.0
_MAX_CHAIN = 512


@functools.lru_cache(maxsize=None)
def _group(ranks: int):
    # Every process creates every group, in the same order (torch's rule);
    # the runtime's process group takes them down at exit.
    return dist.new_group(list(range(ranks)))


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class _Collective:
    """One op over the group, on preallocated buffers, returning a buffer
    of the input's shape (so ops chain)."""

    def __init__(self, op: str, ranks: int, elements: int, dtype=torch.bfloat16):
        check_op(op)
        self.op, self.ranks, self.group = op, ranks, _group(ranks)
        self.rank = dist.get_rank()
        device = device_name()
        local = elements // ranks if op == "all_gather" else elements
        self.x = torch.ones(local, dtype=dtype, device=device)
        self.out = torch.empty(elements if op == "all_gather" else local, dtype=dtype,
                               device=device)

    def __call__(self, x):
        if self.op == "ppermute":
            send = dist.P2POp(dist.isend, x, (self.rank + 1) % self.ranks, self.group)
            receive = dist.P2POp(dist.irecv, self.out, (self.rank - 1) % self.ranks, self.group)
            for request in dist.batch_isend_irecv([send, receive]):
                request.wait()
            return self.out
        if self.op == "all_to_all":
            dist.all_to_all_single(self.out, x, group=self.group)
            return self.out
        if distributed.uses_gloo(self.group):  # gloo has no all_gather_into_tensor
            dist.all_gather(list(self.out.chunk(self.ranks)), x, group=self.group)
        else:
            dist.all_gather_into_tensor(self.out, x, group=self.group)
        return self.out[-x.numel():]


def _member(ranks: int) -> bool:
    return dist.get_rank() < ranks


def _slowest(values: list[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device_name())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def check_result(op: str, ranks: int) -> None:
    """One op on known values moves them as the op means, on every member."""
    group = _group(ranks)
    wrong = 0.0
    if _member(ranks):
        rank, pieces = dist.get_rank(), 2 * ranks
        collective = _Collective(op, ranks, pieces * (ranks if op == "all_gather" else 1),
                                 dtype=torch.float32)
        mine = torch.arange(pieces, dtype=torch.float32, device=collective.x.device)
        collective(mine + rank * pieces)
        got = collective.out.cpu().numpy()
        if op == "all_gather":  # every rank's pieces, in rank order
            want = np.arange(ranks * pieces)
        elif op == "ppermute":  # the previous rank's
            want = np.arange(pieces) + ((rank - 1) % ranks) * pieces
        else:  # share `rank` of every rank's buffer, in rank order
            share = pieces // ranks
            want = np.concatenate([np.arange(rank * share, (rank + 1) * share) + r * pieces
                                   for r in range(ranks)])
        wrong = float(not np.array_equal(got, want.astype(np.float32)))
        dist.barrier(group=group)
    if _slowest([wrong])[0]:
        raise AssertionError(f"{op} over {ranks} ranks moved the wrong values")


def measure(op: str, nbytes: int, ranks: int, *, warmup: int,
            iters: int) -> tuple[list[float], int]:
    """Per-collective milliseconds, one per sample (the slowest member's),
    and the chain length used."""
    check_op(op)
    member = _member(ranks)
    if member:
        collective = _Collective(op, ranks, nbytes // 2)
        group = collective.group

        def loop_ms(chain: int) -> float:
            dist.barrier(group=group)
            _synchronize()
            start, x = time.perf_counter(), collective.x
            for _ in range(chain):
                x = collective(x)
            _synchronize()
            return (time.perf_counter() - start) * 1e3

        for _ in range(max(1, warmup)):
            loop_ms(1)
        single = max(loop_ms(1), 1e-3)
    chain = int(np.clip(_TARGET_LOOP_MS / _slowest([single if member else 0.0])[0],
                        1, _MAX_CHAIN))
    samples = [loop_ms(chain) / chain if member else 0.0 for _ in range(iters)]
    return _slowest(samples), chain
