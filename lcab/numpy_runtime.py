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

from lcab import reference, validation
from lcab.masks import AttnMask
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

    def full_reference(self):
        return _DenseReference

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


class _DenseReference:
    """lcab.fullcheck's reference for host-only runs: lcab.reference (float64,
    dense: small workloads only) on the mask rebuilt from the check's slices."""

    @staticmethod
    def pick(x, selection, kv: bool):
        heads = selection.kv_heads if kv else selection.q_heads
        return np.asarray(x, dtype=np.float64)[list(selection.batch_rows)][:, :, list(heads)]

    @staticmethod
    def pick_rows(x, rows):
        return np.asarray(x, dtype=np.float64)[:, np.asarray(rows)]

    @staticmethod
    def attention(q, k, v, dout, chunk_slices, rows, backward, chunks=None):
        """As jax_backends.reference.attention (`chunks` included), dense."""
        if chunks is None:
            return _dense_attention(q, k, v, dout, chunk_slices, backward, q.shape[1])
        # A row's out and dQ depend on that row alone: place the given rows
        # at their positions among rows of zeros, run them all, keep them.
        positions = np.concatenate([c * rows + np.arange(rows) for c in chunks])[: q.shape[1]]
        table = np.asarray(chunk_slices).reshape(-1, 5)
        seqlen_q = int(max(positions[-1] + 1, table[:, 1].max()))
        placed = [np.zeros((q.shape[0], seqlen_q, *q.shape[2:])) for _ in (q, dout)]
        for array, given in zip(placed, (q, dout)):
            array[:, positions] = given
        found = _dense_attention(placed[0], k, v, placed[1], chunk_slices, backward, seqlen_q)
        return tuple(x[:, positions] for x in found[:2])

    normalised_error = staticmethod(validation.normalised_error)


def _dense_attention(q, k, v, dout, chunk_slices, backward, seqlen_q):
    """(out,) or (out, dq, dk, dv) of lcab.reference on the mask whose slices
    are the chunks' (seqlen_q rows)."""
    table = np.unique(np.asarray(chunk_slices).reshape(-1, 5), axis=0)
    mask = AttnMask(seqlen_q, k.shape[1], table[table[:, 1] > table[:, 0]])
    out = reference.attention(q, k, v, mask)[0]
    return (out, *reference.attention_grads(q, k, v, mask, dout)) if backward else (out,)
