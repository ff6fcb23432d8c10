"""JAX runtime: ahead-of-time compiled, timed with block_until_ready.

Compilation is done once per measured function with jit(...).lower().compile()
and reported as compile_s; the timed calls run the compiled executable only.
On GPU a 256 MiB buffer is rewritten before every call so that no call finds
its inputs in L2. Peak memory is XLA's memory analysis of the executable
(arguments + outputs + temporaries): JAX has no per-case peak counter.

JAX has no device-event timer, and a host clock around one call also counts
the host's dispatch and the final sync (docs/harness.md has the measured
cost). On an accelerator each sample is therefore a
batch of calls enqueued back to back, each after its flush, so the device
never waits for the host; the flushes' own time, measured the same way, is
subtracted, and the sample is the per-call mean.

A function may say how it wants to be timed: `fn.timed` is the callable to
time and `fn.timed_inputs(inputs)` lays the inputs out for it (CP strategies:
tokens in the dispatch order, sharded over their mesh, so the timed call
is the strategy alone and no input moves between devices inside it).

Under jax.distributed (jax_backends.distributed) inputs are replicated
global arrays, results are gathered to every host, and each sample is the
maximum over processes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import pathlib
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_backends import distributed, kept
from lcab.runtime import L2_FLUSH_BYTES, DeviceInfo, Runtime, Timing, warm_until_steady

# A batch long enough that one dispatch and one sync are under ~1% of it.
BATCH_TARGET_MS = 25.0
MAX_CALLS_PER_SAMPLE = 64

_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


class JaxRuntime(Runtime):
    framework = "jax"

    def __init__(self):
        distributed.initialize_from_environment()
        self._flush = None
        # One case compiles each of its functions once: the full-size check,
        # the non-finite test and the timing share the executables (cleanup()
        # drops them). {key: (executable, compile seconds, the function)}.
        self._executables: dict = {}

    @property
    def reference_is_local(self) -> bool:
        return not distributed.multi_process()  # a global computation across processes

    def device(self) -> DeviceInfo:
        first = jax.devices()[0]
        return DeviceInfo(
            name=first.device_kind if first.platform != "cpu" else "cpu",
            platform=first.platform,
            count=jax.device_count(),
        )

    def versions(self) -> dict[str, str]:
        found = {"jax": jax.__version__, "python": platform.python_version(),
                 "numpy": np.__version__}
        for package in ("jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "tokamax",
                        "flash-attn3-jax"):
            version = _package_version(package)
            if version:
                found[package] = version
        if os.environ.get("XLA_FLAGS"):  # compiler settings change the numbers too
            found["XLA_FLAGS"] = os.environ["XLA_FLAGS"]
        return found

    def from_numpy(self, array, dtype):
        if distributed.multi_process():
            return distributed.global_from_host(array, _DTYPES[dtype])
        return jnp.asarray(np.asarray(array, dtype=np.float32), dtype=_DTYPES[dtype])

    def to_numpy(self, array):
        return np.asarray(distributed.to_host(array), dtype=np.float64)

    def dtype_name(self, array) -> str:
        for name, dtype in _DTYPES.items():
            if array.dtype == dtype:
                return name
        raise ValueError(f"unsupported array dtype {array.dtype}; use one of {list(_DTYPES)}")

    def swap_seq_heads(self, array):
        return jnp.swapaxes(array, 1, 2)

    def random_inputs(self, shapes, dtype, seed):
        keys = jax.random.split(jax.random.key(seed), len(shapes))
        # Replicated over every device of every process when there are
        # several processes; one device's arrays otherwise.
        sharding = distributed.replicated_sharding() if distributed.multi_process() else None
        return [kept.call(_normal_on(sharding), key, shape=tuple(shape), dtype=dtype)
                for key, shape in zip(keys, shapes)]

    def forward(self, fn, q, k, v):
        if hasattr(fn, "restore"):
            return self._as_timed(fn, False, [q, k, v])[0]
        return self._executable(fn, False, (q, k, v))[0](q, k, v)

    def forward_backward(self, fn, q, k, v, dout):
        if hasattr(fn, "restore"):
            return self._as_timed(fn, True, [q, k, v, dout])
        return self._executable(fn, True, (q, k, v, dout))[0](q, k, v, dout)

    def _as_timed(self, fn, backward: bool, inputs) -> tuple:
        """The timed program itself (fn.timed on fn.timed_inputs), its
        results back in token order (fn.restore): a function that can put
        its results back is checked exactly as it is timed, compiled once."""
        placed = fn.timed_inputs(list(inputs))
        found = self._executable(fn, backward, placed, timed=True)[0](*placed)
        return tuple(fn.restore(x) for x in (found if backward else (found,)))

    def _executable(self, fn, backward: bool, inputs, timed: bool = False):
        """(executable, compile seconds) of fn (backward False) or of fn with
        its gradients (True), or with `timed` of what fn says to time
        (fn.timed, fn.timed_fwd_bwd), at these inputs' shapes, dtypes and
        shardings: compiled on the first request of the case and kept until
        cleanup(), so the full-size check, the non-finite test and the
        timing compile each function once."""
        timed = timed and (hasattr(fn, "timed") or hasattr(fn, "timed_fwd_bwd"))
        leaves, tree = jax.tree.flatten(tuple(inputs))
        key = (id(fn), backward, timed, tree,
               tuple((x.shape, x.dtype, x.sharding) for x in leaves))
        found = self._executables.get(key)
        if found is None:
            target = getattr(fn, "timed", fn) if timed else fn
            if backward:  # a function may time its own training step (jax.module)
                own = getattr(fn, "timed_fwd_bwd", None) if timed else None
                target = own or _with_gradients(target)
            start = time.perf_counter()
            compiled = jax.jit(target).lower(*inputs).compile()
            # fn is kept so its id is not reused while the entry lives.
            found = self._executables[key] = (compiled, time.perf_counter() - start, fn)
        return found[:2]

    def full_reference(self):
        from jax_backends import reference

        return reference

    def all_finite(self, arrays):
        arrays = tuple(arrays) if isinstance(arrays, (list, tuple)) else (arrays,)
        return bool(distributed.to_host(kept.call(_all_finite, arrays))) if arrays else True

    def _flush_buffer(self):
        if self._flush is None:
            # On every local device: a CP step reads inputs on all of them.
            local = jax.sharding.Mesh(np.array(jax.local_devices()), ("local",))
            buffer = jax.device_put(
                jnp.zeros(L2_FLUSH_BYTES // 4, dtype=jnp.int32),
                jax.sharding.NamedSharding(local, jax.sharding.PartitionSpec()))
            rewrite = jax.jit(lambda b: b + 1, donate_argnums=0)
            self._flush = [buffer, rewrite]
        return self._flush

    def _batch_ms(self, compiled, inputs, calls: int, flush: bool) -> float:
        """Mean ms per call of `calls` back-to-back calls (each after a flush
        when flush is set); compiled=None times the flushes alone."""
        state = self._flush_buffer() if flush else None
        if state is not None:
            jax.block_until_ready(state[0])
        outputs = None
        start = time.perf_counter()
        for _ in range(calls):
            if state is not None:
                state[0] = state[1](state[0])
            if compiled is not None:
                outputs = compiled(*inputs)
        jax.block_until_ready((outputs, state[0] if state is not None else None))
        return (time.perf_counter() - start) * 1e3 / calls

    def measure(self, fn, inputs, *, backward, warmup, iters, flush_l2):
        return self._measure(fn, inputs, (backward,), warmup, iters, flush_l2)[0]

    def measure_pair(self, fn, inputs, *, warmup, iters, flush_l2):
        return tuple(self._measure(fn, inputs, (False, True), warmup, iters, flush_l2))

    def _measure(self, fn, inputs, kinds, warmup, iters, flush_l2) -> list[Timing]:
        """Timings of fn forward (kind False) and/or forward+backward (True):
        each compiled and warmed to its steady state, then their samples
        taken in turn, so both come from one warm state."""
        on_accelerator = jax.devices()[0].platform != "cpu"
        flush = flush_l2 and on_accelerator
        prepared = [self._prepare(fn, inputs if backward else inputs[:3], backward, warmup,
                                  flush, on_accelerator) for backward in kinds]
        if on_accelerator:  # whole untimed samples until two agree (lcab.runtime)
            for compiled, args, calls, _, _ in prepared:
                warm_until_steady(lambda c=compiled, a=args, n=calls: distributed.slowest(
                    [self._batch_ms(c, a, n, flush)])[0])
        samples = [[] for _ in prepared]
        for _ in range(iters):
            for (compiled, args, calls, flush_ms, _), taken in zip(prepared, samples):
                taken.append(self._batch_ms(compiled, args, calls, flush) - flush_ms)
        return [Timing(tuple(distributed.slowest(taken)), compile_s=compile_s,
                       peak_mem_bytes=_peak_bytes(compiled), calls_per_sample=calls)
                for (compiled, _, calls, _, compile_s), taken in zip(prepared, samples)]

    def _prepare(self, fn, inputs, backward, warmup, flush, on_accelerator):
        """(executable, its inputs, calls per sample, their flushes' ms,
        compile seconds) of fn forward or forward+backward."""
        if hasattr(fn, "timed_inputs"):
            inputs = fn.timed_inputs(list(inputs))
        compiled, compile_s = self._executable(fn, backward, inputs, timed=True)
        for _ in range(warmup + 1):  # the first call also loads the executable
            single_ms = self._batch_ms(compiled, inputs, 1, flush)
        # Processes run collectives together, so they must agree on the batch.
        single_ms, compile_s = distributed.slowest([single_ms, compile_s])
        calls = calls_per_sample(single_ms) if on_accelerator else 1
        flush_ms = self._flush_ms(calls) if flush else 0.0
        return compiled, inputs, calls, flush_ms, compile_s

    def _flush_ms(self, calls: int) -> float:
        self._batch_ms(None, (), calls, True)  # warm
        return float(np.median([self._batch_ms(None, (), calls, True) for _ in range(5)]))

    def golden_error(self, fn, inputs, directory, key, with_gradients, layout="bshd"):
        from lcab import golden

        key = golden.golden_key(key, with_gradients)
        names = golden.INPUT_NAMES if with_gradients else golden.INPUT_NAMES[:3]

        def run(arrays):
            """fn's results on inputs in the store's (b, s, h, d) layout, in it."""
            ordered = [arrays[name] for name in names]
            if layout == "bhsd":
                ordered = [self.swap_seq_heads(x) for x in ordered]
            if with_gradients:
                found = jax.jit(_with_gradients(fn))(*ordered)
            else:
                found = (jax.jit(fn)(*ordered),)
            if layout == "bhsd":
                found = [self.swap_seq_heads(x) for x in found]
            return dict(zip(("out", "dq", "dk", "dv"), found))

        if not golden.exists(directory, key):
            given = dict(zip(names, inputs))
            if layout == "bhsd":
                given = {name: self.swap_seq_heads(x) for name, x in given.items()}
            golden.save(directory, key, given, run(given))  # every process its shards
            return None
        # The saved inputs, so a run of another framework compares like with
        # like; placed as this runtime places inputs (the function decides
        # their sharding, as it does for inputs of its own).
        stored = golden.restore_numpy(directory, key)
        dtype = self.dtype_name(inputs[0])
        again = run({name: self.from_numpy(stored["inputs"][name], dtype) for name in names})
        return golden.normalised_error({n: self.to_numpy(x) for n, x in again.items()},
                                       stored["results"])

    @contextlib.contextmanager
    def profile(self, directory):
        directory = pathlib.Path(directory)
        if distributed.multi_process():
            directory = directory / f"process{jax.process_index()}"
        # perfetto_trace.json.gz lands under directory/plugins/profile/<time>/.
        with jax.profiler.trace(str(directory), create_perfetto_trace=True):
            yield

    def check_collective(self, op, ranks):
        from jax_backends import comm

        comm.check_result(op, ranks)

    def time_collective(self, op, nbytes, ranks, *, warmup, iters):
        from jax_backends import comm

        samples, chain = comm.measure(op, nbytes, ranks, warmup=warmup, iters=iters)
        return samples, f"shard_map, {chain} chained per timed loop, bf16"

    def is_oom(self, exc):
        text = str(exc)
        # The last: a Mosaic GPU kernel whose shared memory does not fit (at compile time).
        return (super().is_oom(exc) or "RESOURCE_EXHAUSTED" in text or "Out of memory" in text
                or "exceeds available shared memory" in text)

    def cleanup(self):
        self._executables.clear()
        super().cleanup()
        jax.clear_caches()


def calls_per_sample(single_call_ms: float) -> int:
    """Calls per timed sample: enough to fill BATCH_TARGET_MS, at least one."""
    if single_call_ms <= 0:
        return MAX_CALLS_PER_SAMPLE
    return int(min(MAX_CALLS_PER_SAMPLE, max(1, np.ceil(BATCH_TARGET_MS / single_call_ms))))


@functools.cache
def _normal_on(sharding):
    """A jitted standard-normal generator whose output has `sharding`
    (None: where JAX puts it); one per sharding, so kept.call keys it."""

    def normal(key, shape, dtype):
        return jax.random.normal(key, shape, dtype=_DTYPES[dtype])

    return jax.jit(normal, static_argnames=("shape", "dtype"), out_shardings=sharding)


def _all_finite(arrays):
    """One boolean on the device; XLA fuses the test into the reduction, so
    no array of the inputs' size is made."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in arrays]))


def _with_gradients(fn):
    """(q, k, v, dout) -> (out, dq, dk, dv): the output is returned too so
    XLA cannot drop any of the forward pass from a fwd+bwd measurement."""

    def forward_backward(q, k, v, dout):
        out, pullback = jax.vjp(fn, q, k, v)
        return (out, *pullback(dout.astype(out.dtype)))

    return forward_backward


def _peak_bytes(compiled) -> int | None:
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every platform reports it
        return None
    if stats is None:
        return None
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
    total = sum(int(getattr(stats, field, 0) or 0) for field in fields)
    return total - int(getattr(stats, "alias_size_in_bytes", 0) or 0)
