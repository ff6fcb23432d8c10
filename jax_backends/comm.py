"""The comm suite in JAX: time ppermute, all_gather and all_to_all inside
jax.shard_map over the first `ranks` devices, the collectives the CP
strategies use (lcab.comm defines sizes and bandwidths).

One sample runs a jitted loop of `chain` collectives, each feeding the next
(so none can be dropped or overlapped with the next), and subtracts the time
of the same loop with no collective: what remains is `chain` back-to-back
collectives with no host dispatch in them, divided by `chain`.
"""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_backends import distributed
from lcab.comm import check_op

AXIS = "cp"
# Collectives per timed loop: enough that a loop lasts far longer than the
# host's dispatch of it, for the smallest messages too.
_TARGET_LOOP_MS = 20.0
_MAX_CHAIN = 512


def _step(op: str, ranks: int):
    """One collective on the local buffer, returning a buffer of the same shape."""
    ring = [(i, (i + 1) % ranks) for i in range(ranks)]

    def step(x):
        if op == "ppermute":
            return lax.ppermute(x, AXIS, ring)
        if op == "all_gather":
            gathered = lax.all_gather(x, AXIS, tiled=True)
            # A fixed piece keeps the loop's shape; not the rank's own piece,
            # which XLA may turn into a no-op.
            return gathered[-x.shape[0]:]
        return lax.all_to_all(x, AXIS, 0, 0, tiled=True)

    return step


def _local_elements(op: str, nbytes: int, ranks: int, itemsize: int) -> int:
    elements = nbytes // itemsize
    return elements // ranks if op == "all_gather" else elements


def check_result(op: str, ranks: int) -> None:
    """One collective on known values equals what the op means (the suite's
    correctness check, run before timing)."""
    mesh = Mesh(np.array(jax.devices()[:ranks]), (AXIS,))
    pieces = 2 * ranks
    values = np.arange(ranks * pieces, dtype=np.float32)
    spec = PartitionSpec(AXIS)
    x = jax.device_put(values, NamedSharding(mesh, spec))
    got = np.asarray(jax.jit(jax.shard_map(_step(op, ranks), mesh=mesh, in_specs=spec,
                                           out_specs=spec))(x)).reshape(ranks, pieces)
    local = values.reshape(ranks, pieces)
    if op == "ppermute":
        want = np.roll(local, 1, axis=0)
    elif op == "all_gather":
        want = np.tile(values[-pieces:], (ranks, 1))
    else:
        blocks = local.reshape(ranks, ranks, pieces // ranks)
        want = blocks.transpose(1, 0, 2).reshape(ranks, pieces)
    if not np.array_equal(got, want):
        raise AssertionError(f"{op} over {ranks} devices moved the wrong values")


def measure(op: str, nbytes: int, ranks: int, *, warmup: int, iters: int,
            dtype=jnp.bfloat16) -> tuple[list[float], int]:
    """Per-collective milliseconds (one per sample, slowest process) and the
    chain length used."""
    check_op(op)
    if ranks < 2 or ranks > len(jax.devices()):
        raise ValueError(f"{ranks} ranks: need 2..{len(jax.devices())} devices")
    mesh = Mesh(np.array(jax.devices()[:ranks]), (AXIS,))
    itemsize = jnp.dtype(dtype).itemsize
    local = _local_elements(op, nbytes, ranks, itemsize)
    spec = PartitionSpec(AXIS)
    x = jax.device_put(jnp.ones((ranks * local,), dtype), NamedSharding(mesh, spec))
    step = _step(op, ranks)

    def compiled(chain: int, with_op: bool):
        body = step if with_op else (lambda y: y)

        @partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=spec)
        def loop(y):
            return lax.fori_loop(0, chain, lambda _, z: body(z), y)

        return jax.jit(loop).lower(x).compile()

    def loop_ms(fn) -> float:
        start = time.perf_counter()
        fn(x).block_until_ready()
        return (time.perf_counter() - start) * 1e3

    one = compiled(1, True)
    for _ in range(max(1, warmup)):
        loop_ms(one)
    single = max(loop_ms(one), 1e-3)
    chain = int(np.clip(_TARGET_LOOP_MS / single, 1, _MAX_CHAIN))
    timed, empty = compiled(chain, True), compiled(chain, False)
    for _ in range(max(1, warmup)):
        loop_ms(timed), loop_ms(empty)
    samples = [(loop_ms(timed) - loop_ms(empty)) / chain for _ in range(iters)]
    return distributed.slowest(samples), chain
