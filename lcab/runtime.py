"""The per-framework runtime protocol and timing statistics.

A runtime moves arrays between NumPy and its framework, runs a backend's
function forward or forward+backward, and times it on its device. One
runtime per framework lives in that framework's backend package.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

L2_FLUSH_BYTES = 256 * 1024 * 1024  # written between timed repeats on GPU
# Warm-up on an accelerator: untimed samples go on until two in a row agree
# within STEADY_TOLERANCE (clocks, caches and allocators settled), at most
# MAX_WARM_SAMPLES of them, after the run's --warmup calls.
STEADY_TOLERANCE = 0.03
MAX_WARM_SAMPLES = 12
# A row whose p80 / p20 exceeds this is flagged in tables, not printed plain.
SPREAD_LIMIT = 1.10


@dataclasses.dataclass(frozen=True)
class Timing:
    """Raw samples of one measured callable and their statistics (ms)."""

    samples_ms: tuple[float, ...]
    compile_s: float | None = None
    peak_mem_bytes: int | None = None
    # Each sample is the mean of this many back-to-back calls (runtimes that
    # cannot time one call on the device without host overhead batch them).
    calls_per_sample: int = 1

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def p20_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 20))

    @property
    def p80_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 80))

    @property
    def spread(self) -> float | None:
        """p80 / p20 (None where p20 is not positive)."""
        return self.p80_ms / self.p20_ms if self.p20_ms > 0 else None


def warm_until_steady(sample: Callable[[], float]) -> int:
    """Call `sample` (an untimed sample, in ms) until two in a row agree
    within STEADY_TOLERANCE or MAX_WARM_SAMPLES ran; returns how many ran.
    In a multi-process run `sample` must return the same value on every
    process (the slowest's), so all stop together."""
    last = sample()
    for count in range(2, MAX_WARM_SAMPLES + 1):
        now = sample()
        if abs(now - last) <= STEADY_TOLERANCE * max(now, last):
            return count
        last = now
    return MAX_WARM_SAMPLES


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    name: str  # e.g. "NVIDIA H200" or "cpu"
    platform: str  # "gpu" or "cpu"
    count: int


# A forward_backward's results, in order (lcab.fullcheck.TENSORS: that module
# imports this one).
_TENSORS = ("out", "dq", "dk", "dv")
_KV_HEADS = (False, False, True, True)  # which of them have K/V heads


def _as_sequence(arrays) -> Sequence:
    return arrays if isinstance(arrays, (list, tuple)) else (arrays,)


def _worst(*errors: float) -> float:
    """The largest error; NaN (a broken comparison) wins, as it must fail."""
    return float(np.max(errors))


class Runtime(abc.ABC):
    framework: str

    @property
    def has_full_check(self) -> bool:
        """Whether this runtime has a full-size reference (lcab.fullcheck);
        rows of one without say so in their notes and carry no check columns."""
        return type(self).full_reference is not Runtime.full_reference

    @property
    def reference_is_local(self) -> bool:
        """Whether each process computes the full-size reference alone. Where
        it is one computation over several processes (JAX across
        processes), a process that read it from the disk cache while another
        computed it would leave that one waiting: the cache is not used."""
        return True

    @abc.abstractmethod
    def device(self) -> DeviceInfo: ...

    @abc.abstractmethod
    def versions(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        """A device array of `dtype` holding `array` (any float NumPy array)."""

    @abc.abstractmethod
    def to_numpy(self, array: Any) -> np.ndarray:
        """A float64 NumPy copy of a device array."""

    @abc.abstractmethod
    def dtype_name(self, array: Any) -> str:
        """The LCAB dtype name (bfloat16, float16, float32) of a device array."""

    @abc.abstractmethod
    def swap_seq_heads(self, array: Any) -> Any:
        """(b, s, h, d) <-> (b, h, s, d)."""

    @abc.abstractmethod
    def random_inputs(self, shapes: Sequence[tuple[int, ...]], dtype: str, seed: int) -> list:
        """Standard-normal device arrays, generated on the device."""

    @abc.abstractmethod
    def forward(self, fn: Callable, q, k, v):
        """out = fn(q, k, v), run once (for validation)."""

    @abc.abstractmethod
    def forward_backward(self, fn: Callable, q, k, v, dout):
        """(out, dq, dk, dv) of fn at (q, k, v) with cotangent dout."""

    def golden_error(self, fn: Callable, inputs, directory: str, key: str,
                     with_gradients: bool, layout: str = "bshd") -> float | None:
        """First run of `key`: save `inputs` (q, k, v, dout) and fn's outputs
        and gradients as golden data, return None. Later runs: run fn on the
        saved inputs and return the largest normalised difference from the
        saved results. `layout` is fn's; the store keeps (batch, seq, heads,
        dim). Runtimes without a store raise NotImplementedError."""
        raise NotImplementedError(f"{self.framework} runs cannot keep golden data yet")

    def all_finite(self, arrays) -> bool:
        """Whether every value of `arrays` (device arrays, or one) is finite.
        This default copies them to the host; runtimes reduce on the device."""
        return all(bool(np.isfinite(self.to_numpy(x)).all()) for x in _as_sequence(arrays))

    def full_check(self, fn: Callable, layout: str, check, backward: bool,
                   cache_dir: str | None = None) -> dict[str, float]:
        """lcab.fullcheck: run fn (in `layout`) forward, and backward when
        asked, on the check's inputs at the full workload, and return the
        normalised max error of "out" (and "dq", "dk", "dv") against the
        framework's own reference (`full_reference`): the worse of the
        check's selection and, for out and dq, its sampled rows; inf for a
        tensor with a non-finite value anywhere. The reference of both tiers
        is kept for the next backend on the same workload, and with
        `cache_dir` for other processes too (lcab.reference_cache)."""
        reference = self.full_reference()
        inputs = self._check_inputs(check)
        got = self._check_outputs(fn, layout, inputs, backward)
        finite = [self.all_finite([x]) for x in got]
        selected = [reference.pick(x, check.selection, kv) for x, kv in zip(got, _KV_HEADS)]
        sampled = ([reference.pick_rows(x, check.sampled_rows) for x in got[:2]]  # out, dq
                   if check.sampled_chunks else [])
        del got  # the full outputs go before the reference runs
        want_selected, want_sampled = self._kept_full_reference(reference, check, inputs,
                                                                backward, cache_dir)
        errors = {name: reference.normalised_error(g, t)
                  for name, g, t in zip(_TENSORS, selected, want_selected)}
        for name, g, t in zip(_TENSORS, sampled, want_sampled):
            errors[name] = _worst(errors[name], reference.normalised_error(g, t))
        for name, ok in zip(_TENSORS, finite):
            if not ok:
                errors[name] = float("inf")
        return errors

    def _check_inputs(self, check) -> list:
        """(q, k, v, dout) of the check, (batch, seq, heads, dim), on the device."""
        w = check.workload
        q_shape = (w.batch, w.seqlen_q, w.heads_q, w.head_dim)
        kv_shape = (w.batch, w.seqlen_k, w.heads_kv, w.head_dim)
        q, k, v, dout = self.random_inputs([q_shape, kv_shape, kv_shape, q_shape], w.dtype,
                                           check.seed)
        return [q * check.spread, k * check.spread, v, dout]  # a power of two: exact

    def _check_outputs(self, fn, layout: str, inputs, backward: bool) -> list:
        """fn's (out,) or (out, dq, dk, dv) at the check's inputs, (b, s, h, d)."""
        given = [self.swap_seq_heads(x) if layout == "bhsd" else x for x in inputs]
        got = (self.forward_backward(fn, *given) if backward
               else (self.forward(fn, *given[:3]),))
        return [self.swap_seq_heads(x) if layout == "bhsd" else x for x in got]

    def _kept_full_reference(self, reference, check, inputs, backward: bool,
                             cache_dir: str | None = None):
        """The reference's results on the selection and on the sampled rows,
        computed once per (check.key, backward) and kept for the next backend
        (and, with `cache_dir`, read from or written to the disk cache)."""
        key = (check.key, backward)
        kept = getattr(self, "_kept_reference", None)
        if kept is not None and kept[0] == key:
            return kept[1]
        self._kept_reference = None  # free the last one first
        if cache_dir and self.reference_is_local:
            found = self._cached_full_reference(reference, check, inputs, backward, cache_dir)
        else:
            found = self._computed_full_reference(reference, check, inputs, backward)
        self._kept_reference = (key, found)
        return found

    def _computed_full_reference(self, reference, check, inputs, backward: bool):
        """(on the selection, on the sampled rows): the reference run now."""
        q, k, v, dout = inputs
        picked = [reference.pick(x, check.selection, kv)
                  for x, kv in zip(inputs, (False, True, True, False))]
        on_selection = reference.attention(*picked, check.chunk_slices, check.chunk_rows,
                                           backward)
        del picked
        on_sampled_rows = ()
        if check.sampled_chunks:  # none where the selection is whole
            rows = check.sampled_rows
            on_sampled_rows = reference.attention(
                reference.pick_rows(q, rows), k, v, reference.pick_rows(dout, rows),
                check.sampled_slices, check.sample_rows, backward, chunks=check.sampled_chunks)
        return on_selection, on_sampled_rows

    def _cached_full_reference(self, reference, check, inputs, backward: bool,
                               cache_dir: str):
        """_computed_full_reference through lcab.reference_cache: the entry's
        arrays put back on the device, or computed and written."""
        from lcab import fullcheck, reference_cache

        device = self.device()
        # The code the values come from: the reference, the inputs' generator
        # (this runtime's module, _check_inputs here) and the check's plan.
        files = [inspect.getfile(reference), inspect.getfile(type(self)), __file__,
                 fullcheck.__file__]
        name = reference_cache.entry_name(
            (check.key, backward, self.framework, device.name, device.platform,
             sorted(self.versions().items())), files)
        stored = reference_cache.load(cache_dir, name)
        if stored is not None:
            return tuple(tuple(self.from_numpy(a, "float32") for a in arrays)
                         for arrays in stored)
        found = self._computed_full_reference(reference, check, inputs, backward)
        reference_cache.save(cache_dir, name, *([self.to_numpy(a) for a in arrays]
                                                for arrays in found))
        return found

    def full_reference(self):
        """The module of this framework's full-size reference (jax_backends/
        reference.py is one): pick(x, selection, kv) and pick_rows(x, rows)
        take part of a (b, s, h, d) array; attention(q, k, v, dout,
        chunk_slices, rows, backward, chunks=None) is the float32 attention
        chunk by chunk (of the given chunks only, then (out,) or (out, dq));
        normalised_error(got, want) -> float. Runtimes without one
        (has_full_check False) raise NotImplementedError."""
        raise NotImplementedError(f"the {self.framework} runtime has no full-size reference")

    @abc.abstractmethod
    def measure(
        self, fn: Callable, inputs: Sequence, *, backward: bool, warmup: int, iters: int,
        flush_l2: bool,
    ) -> Timing:
        """Time fn(q, k, v) (backward=False) or fn plus its gradients (True)."""

    def measure_pair(self, fn: Callable, inputs: Sequence, *, warmup: int, iters: int,
                     flush_l2: bool) -> tuple[Timing, Timing]:
        """(forward, forward+backward) Timings of fn on (q, k, v, dout), from
        one warm state: runtimes that can take their samples in turn do;
        this default measures one after the other."""
        return (self.measure(fn, inputs[:3], backward=False, warmup=warmup, iters=iters,
                             flush_l2=flush_l2),
                self.measure(fn, inputs, backward=True, warmup=warmup, iters=iters,
                             flush_l2=flush_l2))

    def profile(self, directory):
        """A context manager tracing what runs inside it into `directory`, in
        the Chrome trace-event format lcab.trace_overlap reads. Runtimes
        without a profiler raise NotImplementedError."""
        raise NotImplementedError(f"{self.framework} has no profiler hook")

    def check_collective(self, op: str, ranks: int) -> None:
        """Run one `op` (lcab.comm.COMM_OPS) over `ranks` devices on known
        values and raise AssertionError if it moved the wrong ones. Runtimes
        without a comm suite raise NotImplementedError."""
        raise NotImplementedError(f"{self.framework} has no comm suite yet")

    def time_collective(self, op: str, nbytes: int, ranks: int, *, warmup: int,
                        iters: int) -> tuple[list[float], str]:
        """Milliseconds per `op` of `nbytes` per rank over `ranks` devices (one
        per sample), and a note on how they were taken."""
        raise NotImplementedError(f"{self.framework} has no comm suite yet")

    def is_oom(self, exc: BaseException) -> bool:
        """Whether an exception means the device ran out of memory."""
        return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()

    def cleanup(self) -> None:
        """Free what a failed or finished case left behind."""
        import gc

        gc.collect()
