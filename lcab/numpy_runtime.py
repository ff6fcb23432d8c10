"""A host-only runtime over NumPy arrays, for plugins and the harness's tests.

Low-precision dtypes are emulated by rounding float32 values (bfloat16 by
round-to-nearest-even on the bit pattern), so a NumPy backend sees the same
input values a GPU kernel would. There is no autodiff here: a function run
backward must carry a `grads(q, k, v, dout)` attribute.
"""

from __future__ import annotations

import platform
import time

import numpy as np

from lcab.runtime import DeviceInfo, Runtime, Timing


def round_to(array: np.ndarray, dtype: str) -> np.ndarray:
    x = np.asarray(array, dtype=np.float32)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = x.view(np.uint32)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
        # NaN bit patterns would carry into the exponent; keep them NaN.
        return np.where(np.isnan(x), x, rounded.view(np.float32))
    return x


class NumpyRuntime(Runtime):
    framework = "numpy"
    has_full_check = True

    def device(self) -> DeviceInfo:
        return DeviceInfo(name="cpu", platform="cpu", count=1)

    def versions(self) -> dict[str, str]:
        return {"numpy": np.__version__, "python": platform.python_version()}

    def from_numpy(self, array, dtype):
        return round_to(array, dtype)

    def to_numpy(self, array):
        return np.asarray(array, dtype=np.float64)

    def dtype_name(self, array) -> str:
        return "float32"

    def swap_seq_heads(self, array):
        return np.swapaxes(array, 1, 2)

    def random_inputs(self, shapes, dtype, seed):
        rng = np.random.default_rng(seed)
        return [round_to(rng.standard_normal(shape), dtype) for shape in shapes]

    def forward(self, fn, q, k, v):
        return fn(q, k, v)

    def forward_backward(self, fn, q, k, v, dout):
        return (fn(q, k, v), *fn.grads(q, k, v, dout))

    def full_check(self, fn, layout, check, backward):
        """lcab.fullcheck against lcab.reference (float64, dense: small
        workloads only) on the check's selection."""
        from lcab import reference

        w = check.workload
        q_shape = (w.batch, w.seqlen_q, w.heads_q, w.head_dim)
        kv_shape = (w.batch, w.seqlen_k, w.heads_kv, w.head_dim)
        q, k, v, dout = self.random_inputs([q_shape, kv_shape, kv_shape, q_shape], w.dtype,
                                           check.seed)
        q, k = q * check.spread, k * check.spread
        given = [self.swap_seq_heads(x) if layout == "bhsd" else x for x in (q, k, v, dout)]
        got = (self.forward_backward(fn, *given) if backward
               else (self.forward(fn, *given[:3]),))
        got = [self.swap_seq_heads(x) if layout == "bhsd" else x for x in got]
        sel = check.selection
        rows = list(sel.batch_rows)

        def pick(x, kv):
            return np.asarray(x, dtype=np.float64)[rows][:, :, list(
                sel.kv_heads if kv else sel.q_heads)]

        q, k, v, dout = (pick(x, kv) for x, kv in zip((q, k, v, dout),
                                                       (False, True, True, False)))
        want = [reference.attention(q, k, v, w.mask)[0]]
        if backward:
            want += reference.attention_grads(q, k, v, w.mask, dout)
        errors = {}
        for name, x, t, kv in zip(("out", "dq", "dk", "dv"), got, want,
                                  (False, False, True, True)):
            x = pick(x, kv)
            scale = max(float(np.max(np.abs(t), initial=0.0)), 1e-6)
            errors[name] = (float(np.max(np.abs(x - t), initial=0.0)) / scale
                            if np.all(np.isfinite(x)) else float("inf"))
        return errors

    def measure(self, fn, inputs, *, backward, warmup, iters, flush_l2):
        run = (lambda: self.forward_backward(fn, *inputs)) if backward else (lambda: fn(*inputs))
        start = time.perf_counter()
        run()
        first = time.perf_counter() - start
        for _ in range(warmup):
            run()
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            run()
            samples.append((time.perf_counter() - start) * 1e3)
        return Timing(tuple(samples), compile_s=first, peak_mem_bytes=None)
