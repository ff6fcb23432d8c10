"""PyTorch runtime: CUDA events on GPU, the host clock on CPU.

The first call (or torch.compile's compilation) is timed separately as
compile_s, then `warmup` more untimed calls run, then on a GPU untimed
samples until two agree (lcab.runtime.warm_until_steady); a forward and a
forward+backward measured together take their samples in turn. The forward is measured
without autograd (inputs that do not require grad); forward+backward with
fresh gradients each repeat. On GPU a
256 MiB buffer is zeroed between repeats so no repeat finds its inputs in
L2, and peak memory is torch.cuda.max_memory_allocated over the case (the
flush buffer excluded).

Under torchrun (the CP suite) the runtime joins the process group, and
functions that are `ShardedFunction`s return this rank's output rows: the
correctness checks gather the output and sum the ranks' gradients, and each
timed sample is the maximum over ranks (the slowest rank sets the step).
"""

from __future__ import annotations

import contextlib
import gc
import os
import pathlib
import platform
import time

import numpy as np
import torch

from lcab.runtime import L2_FLUSH_BYTES, DeviceInfo, Runtime, Timing, warm_until_steady
from torch_backends import distributed
from torch_backends.device import device_name
from torch_backends.distributed import ShardedFunction

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _finite(x: torch.Tensor) -> bool:
    """Whether every value of x is finite, without a boolean copy of x: its
    min and max are finite exactly when all of it is (both carry a NaN)."""
    if x.numel() == 0 or not x.is_floating_point():
        return True  # integers are always finite
    low, high = torch.aminmax(x.detach())
    return bool(torch.isfinite(low) & torch.isfinite(high))


class TorchRuntime(Runtime):
    framework = "torch"

    def __init__(self):
        distributed.ensure_process_group()
        self.device_name = device_name()
        self._flush_buffer = None
        if not self.on_gpu:
            # CPU timings with one intra-op thread: with one per core, any
            # other busy process stalls a small kernel's threads and its
            # samples scatter by tens of times (a backward drowns in that).
            torch.set_num_threads(1)

    @property
    def on_gpu(self) -> bool:
        return self.device_name == "cuda"

    def device(self) -> DeviceInfo:
        if distributed.launched():  # the devices of the process group, one per rank
            name = torch.cuda.get_device_name() if self.on_gpu else "cpu"
            return DeviceInfo(name, "gpu" if self.on_gpu else "cpu", distributed.world_size())
        if self.on_gpu:
            return DeviceInfo(torch.cuda.get_device_name(0), "gpu", torch.cuda.device_count())
        return DeviceInfo("cpu", "cpu", 1)

    def versions(self) -> dict[str, str]:
        found = {"torch": torch.__version__, "python": platform.python_version(),
                 "numpy": np.__version__}
        if torch.version.cuda:
            found["cuda"] = torch.version.cuda
        try:
            import triton

            found["triton"] = triton.__version__
        except ImportError:
            pass
        return found

    def from_numpy(self, array, dtype):
        host = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
        return host.to(device=self.device_name, dtype=_DTYPES[dtype])

    def to_numpy(self, array):
        return array.detach().to(torch.float64).cpu().numpy()

    def dtype_name(self, array) -> str:
        for name, dtype in _DTYPES.items():
            if array.dtype == dtype:
                return name
        raise ValueError(f"unsupported tensor dtype {array.dtype}; use one of {list(_DTYPES)}")

    def swap_seq_heads(self, array):
        return array.transpose(1, 2).contiguous()

    def random_inputs(self, shapes, dtype, seed):
        generator = torch.Generator(device=self.device_name).manual_seed(seed)
        return [
            torch.randn(shape, generator=generator, device=self.device_name, dtype=_DTYPES[dtype])
            for shape in shapes
        ]

    def forward(self, fn, q, k, v):
        with torch.no_grad():
            out = fn(q, k, v)
            return fn.gather(out) if isinstance(fn, ShardedFunction) else out

    def forward_backward(self, fn, q, k, v, dout):
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        out = fn(*leaves)
        if not isinstance(fn, ShardedFunction):
            out.backward(dout)
            return (out.detach(), *(leaf.grad for leaf in leaves))
        out.backward(fn.local(dout))
        with torch.no_grad():
            return (fn.gather(out.detach()), *(fn.reduce(leaf.grad) for leaf in leaves))

    def golden_error(self, fn, inputs, directory, key, with_gradients, layout="bshd"):
        # The store is orbax's (lcab.golden): read and written here as NumPy
        # arrays on the host, with JAX (orbax's own) kept off torch's GPUs.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        from lcab import golden

        key = golden.golden_key(key, with_gradients)
        names = golden.INPUT_NAMES if with_gradients else golden.INPUT_NAMES[:3]
        dtype = self.dtype_name(inputs[0])
        stored = golden.restore_numpy(directory, key) if golden.exists(directory, key) else None
        if stored is not None:  # the saved inputs, so both frameworks see the same ones
            inputs = [self._from_store(stored["inputs"][name], dtype, layout) for name in names]
        if with_gradients:
            found = self.forward_backward(fn, *inputs)
        else:
            found = (self.forward(fn, *inputs[:3]),)
        results = {name: self._to_store(x, layout)
                   for name, x in zip(("out", "dq", "dk", "dv"), found)}
        if stored is not None:
            return golden.normalised_error(results, stored["results"])
        if distributed.rank() == 0:  # every rank holds the same global arrays
            given = {name: self._to_store(x, layout) for name, x in zip(names, inputs)}
            golden.save(directory, key, given, results)
        return None

    def full_reference(self):
        from torch_backends import reference

        return reference

    def all_finite(self, arrays):
        arrays = arrays if isinstance(arrays, (list, tuple)) else (arrays,)
        return all(_finite(x) for x in arrays)

    def _to_store(self, x, layout):
        # float32 holds bf16/fp16 values exactly; the store keeps (b, s, h, d)
        x = x.detach().to(torch.float32)
        return (x.transpose(1, 2) if layout == "bhsd" else x).contiguous().cpu().numpy()

    def _from_store(self, array, dtype, layout):
        x = self.from_numpy(np.asarray(array, np.float32), dtype)
        return x.transpose(1, 2).contiguous() if layout == "bhsd" else x

    def _sync(self):
        if self.on_gpu:
            torch.cuda.synchronize()

    def _flush_l2(self):
        if self._flush_buffer is None:
            self._flush_buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        self._flush_buffer.zero_()

    def measure(self, fn, inputs, *, backward, warmup, iters, flush_l2):
        return self._measure(fn, inputs, (backward,), warmup, iters, flush_l2)[0]

    def measure_pair(self, fn, inputs, *, warmup, iters, flush_l2):
        return tuple(self._measure(fn, inputs, (False, True), warmup, iters, flush_l2))

    def _measure(self, fn, inputs, kinds, warmup, iters, flush_l2) -> list[Timing]:
        """Timings of fn forward (kind False) and/or forward+backward (True):
        each run first, warmed and brought to its steady state, then their
        samples taken in turn, so both come from one warm state."""
        if self.on_gpu and flush_l2 and self._flush_buffer is None:
            self._flush_l2()  # allocate it before the peak counter starts
        prepared = [self._prepare(fn, inputs, backward, warmup) for backward in kinds]
        steps = [step for step, _, _ in prepared]
        if self.on_gpu:  # untimed samples until two agree (lcab.runtime)
            for step in steps:
                warm_until_steady(lambda step=step: self._slowest(
                    self._timed_gpu([step], 1, flush_l2)[0][0]))
        if self.on_gpu:
            samples = self._timed_gpu(steps, iters, flush_l2)
        else:
            samples = self._timed_host(steps, iters)
        timings = []
        for (_, compile_s, peak), taken in zip(prepared, samples):
            if distributed.world_size() > 1:
                taken, compile_s, peak = self._slowest_rank(taken, compile_s, peak)
            timings.append(Timing(tuple(taken), compile_s=compile_s, peak_mem_bytes=peak))
        return timings

    def _prepare(self, fn, inputs, backward, warmup):
        """(step, first-call seconds, peak memory of its first calls) of fn
        forward or forward+backward."""
        if backward:
            leaves = [x.detach().requires_grad_(True) for x in inputs[:3]]
            dout = fn.local(inputs[3]) if isinstance(fn, ShardedFunction) else inputs[3]

            def step():
                for leaf in leaves:
                    leaf.grad = None
                fn(*leaves).backward(dout)
        else:
            q, k, v = (x.detach() for x in inputs[:3])

            def step():
                fn(q, k, v)

        if self.on_gpu:
            torch.cuda.reset_peak_memory_stats()
        self._sync()
        start = time.perf_counter()
        step()
        self._sync()
        compile_s = time.perf_counter() - start
        for _ in range(warmup):
            step()
        self._sync()
        peak = None
        if self.on_gpu:
            # The flush buffer is the harness's, not the case's.
            flush_bytes = 0 if self._flush_buffer is None else self._flush_buffer.numel()
            peak = torch.cuda.max_memory_allocated() - flush_bytes
        return step, compile_s, peak

    def _slowest(self, ms: float) -> float:
        """One value, the maximum over ranks (itself in a single process)."""
        if distributed.world_size() <= 1:
            return ms
        value = torch.tensor([ms], dtype=torch.float64, device=self.device_name)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return float(value.item())

    def _slowest_rank(self, samples, compile_s, peak):
        """Each sample, the compile time and the peak memory: the maximum over ranks."""
        values = torch.tensor([*samples, compile_s, float(peak or 0)], dtype=torch.float64,
                              device=self.device_name)
        torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX)
        values = values.tolist()
        return values[:-2], values[-2], (int(values[-1]) if peak is not None else None)

    def _timed_gpu(self, steps, iters, flush_l2):
        """Per step, `iters` CUDA-event samples, the steps taking turns."""
        events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                   for _ in steps] for _ in range(iters)]
        for turn in events:
            for step, (begin, end) in zip(steps, turn):
                if flush_l2:
                    self._flush_l2()
                begin.record()
                step()
                end.record()
        torch.cuda.synchronize()
        return [[turn[i][0].elapsed_time(turn[i][1]) for turn in events]
                for i in range(len(steps))]

    @staticmethod
    def _timed_host(steps, iters):
        samples = [[] for _ in steps]
        for _ in range(iters):
            for step, taken in zip(steps, samples):
                start = time.perf_counter()
                step()
                taken.append((time.perf_counter() - start) * 1e3)
        return samples

    def is_oom(self, exc):
        return isinstance(exc, torch.OutOfMemoryError) or super().is_oom(exc)

    def check_collective(self, op, ranks):
        from torch_backends import comm

        comm.check_result(op, ranks)

    def time_collective(self, op, nbytes, ranks, *, warmup, iters):
        from torch_backends import comm

        samples, chain = comm.measure(op, nbytes, ranks, warmup=warmup, iters=iters)
        backend = "gloo" if distributed.uses_gloo() else "NCCL"
        return samples, f"torch.distributed ({backend}), {chain} chained per timed loop, bf16"

    @contextlib.contextmanager
    def profile(self, directory):
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities) as profiler:
            yield
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(directory / f"rank{distributed.rank()}.trace.json"))

    def cleanup(self):
        gc.collect()
        if self.on_gpu:
            torch.cuda.empty_cache()
