"""PyTorch runtime: CUDA events on GPU, the host clock on CPU.

The first call (or torch.compile's compilation) is timed separately as
compile_s, then `warmup` more untimed calls run. The forward is measured without autograd (inputs that do not
require grad); forward+backward with fresh gradients each repeat. On GPU a
256 MiB buffer is zeroed between repeats so no repeat finds its inputs in
L2, and peak memory is torch.cuda.max_memory_allocated over the case (the
flush buffer excluded).
"""

from __future__ import annotations

import gc
import platform
import time

import numpy as np
import torch

from lcab.runtime import L2_FLUSH_BYTES, DeviceInfo, Runtime, Timing

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class TorchRuntime(Runtime):
    framework = "torch"

    def __init__(self):
        self.device_name = "cuda" if torch.cuda.is_available() else "cpu"
        self._flush_buffer = None

    @property
    def on_gpu(self) -> bool:
        return self.device_name == "cuda"

    def device(self) -> DeviceInfo:
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
            return fn(q, k, v)

    def forward_backward(self, fn, q, k, v, dout):
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        out = fn(*leaves)
        out.backward(dout)
        return (out.detach(), *(leaf.grad for leaf in leaves))

    def _sync(self):
        if self.on_gpu:
            torch.cuda.synchronize()

    def _flush_l2(self):
        if self._flush_buffer is None:
            self._flush_buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        self._flush_buffer.zero_()

    def measure(self, fn, inputs, *, backward, warmup, iters, flush_l2):
        if backward:
            leaves = [x.detach().requires_grad_(True) for x in inputs[:3]]
            dout = inputs[3]

            def step():
                for leaf in leaves:
                    leaf.grad = None
                fn(*leaves).backward(dout)
        else:
            q, k, v = (x.detach() for x in inputs[:3])

            def step():
                fn(q, k, v)

        if self.on_gpu:
            if flush_l2 and self._flush_buffer is None:
                self._flush_l2()  # allocate it before the peak counter starts
            torch.cuda.reset_peak_memory_stats()
        self._sync()
        start = time.perf_counter()
        step()
        self._sync()
        compile_s = time.perf_counter() - start
        for _ in range(warmup):
            step()
        self._sync()
        samples = self._timed_gpu(step, iters, flush_l2) if self.on_gpu else self._timed_host(
            step, iters
        )
        peak = None
        if self.on_gpu:
            # The flush buffer is the harness's, not the case's.
            flush_bytes = 0 if self._flush_buffer is None else self._flush_buffer.numel()
            peak = torch.cuda.max_memory_allocated() - flush_bytes
        return Timing(tuple(samples), compile_s=compile_s, peak_mem_bytes=peak)

    def _timed_gpu(self, step, iters, flush_l2):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(iters)]
        for begin, end in events:
            if flush_l2:
                self._flush_l2()
            begin.record()
            step()
            end.record()
        torch.cuda.synchronize()
        return [begin.elapsed_time(end) for begin, end in events]

    @staticmethod
    def _timed_host(step, iters):
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            step()
            samples.append((time.perf_counter() - start) * 1e3)
        return samples

    def is_oom(self, exc):
        return isinstance(exc, torch.OutOfMemoryError) or super().is_oom(exc)

    def cleanup(self):
        gc.collect()
        if self.on_gpu:
            torch.cuda.empty_cache()
