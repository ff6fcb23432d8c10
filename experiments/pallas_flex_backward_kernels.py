"""jax.pallas_flex's backward kernels timed one by one on a GPU (issue #6):

    python3 experiments/pallas_flex_backward_kernels.py [--masks=full,causal_document]
        [--seqlen=32768] [--kernels=mosaic,fused,triton] [--out=FILE.jsonl]

For each mask (64:8 heads, d=128, bf16, batch 1, chatqa2 documents): the
whole Triton backward (its default 64 x 64 plan), and the Mosaic backward's
dQ and dK/dV kernels alone for each `parts` (flex_backward_mosaic.PARTS),
and dK/dV with 232 / 40 registers per compute / memory thread (the split
before 240 / 24), on a 128 x 128 plan; the one-pass backward
(flex_backward_fused_mosaic, v7) whole, and with its dQ sum in dQ's own
layout, with no dQ reduce-add or no dQ product (its dQ wrong: what each
costs) and with 232 / 40 registers. TFLOP/s count the kernel's own matmuls
over the mask's exact area: dQ 3, dK/dV 4, a whole backward 5 (the harness's
convention; the Triton dQ pass's 2 recomputed ones left out), the one-pass
backward 5. One warm-up, median of five; a JSON line per kernel goes to
--out and a table to stdout. Set MOSAIC_GPU_DUMP_PTXAS=1 to see each
kernel's registers and spills in the log.
"""

from __future__ import annotations

import json
import math
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from jax_backends import flex_backward_fused_mosaic, flex_backward_mosaic, flex_kernel
from jax_backends.flex_plan import make_plan
from lcab.masks.factory import make_mask, taken_params

_MASKS = flags.DEFINE_list("masks", ["full", "causal_document"], "mask families")
_SEQLEN = flags.DEFINE_integer("seqlen", 32768, "tokens")
_KERNELS = flags.DEFINE_list("kernels", ["mosaic", "fused", "triton"],
                             "which kernels: names starting with these")
_OUT = flags.DEFINE_string("out", None, "JSON lines, one per kernel")
HEADS, KV_HEADS, HEAD_DIM = 64, 8, 128


def _median_ms(fn, *args, iters: int = 5) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def _inputs(seqlen: int):
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (1, seqlen, HEADS, HEAD_DIM), jnp.bfloat16)
    k, v = (jax.random.normal(key, (1, seqlen, KV_HEADS, HEAD_DIM), jnp.bfloat16)
            for key in keys[1:3])
    dout = jax.random.normal(keys[3], q.shape, jnp.bfloat16)
    rows = jnp.zeros((1, HEADS, seqlen), jnp.float32)  # lse2, delta: any finite values time alike
    return q, k, v, dout, rows


def _kernels(mask, seqlen):
    """(name, matmuls, fn, plan) of every kernel timed for this mask."""
    q, k, v, dout, rows = _inputs(seqlen)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    mosaic_plan = make_plan(mask, 128, 128)
    tables = jax.tree.map(jnp.asarray, mosaic_plan.tables())
    geometry = mosaic_plan.geometry
    for parts in flex_backward_mosaic.PARTS:
        dq = jax.jit(lambda q, k, v, do, r, parts=parts: flex_backward_mosaic._dq(
            q, k, v, do, r, r, geometry, tables, scale, 2, parts))
        dkv = jax.jit(lambda q, k, v, do, r, parts=parts: flex_backward_mosaic._dkv(
            q, k, v, do, r, r, geometry, tables, scale, 2, False, parts))
        yield f"mosaic dq, parts={parts}", 3, dq, (q, k, v, dout, rows)
        yield f"mosaic dkv, parts={parts}", 4, dkv, (q, k, v, dout, rows)
    # dK/dV with the register split before FA3's (232 per compute thread, 40 for TMA).
    dkv = jax.jit(lambda q, k, v, do, r: _with_registers((232, 40), flex_backward_mosaic._dkv,
                                                        q, k, v, do, r, r, geometry, tables,
                                                        scale, 2, False, 2))
    yield "mosaic dkv, parts=2, registers 232/40", 4, dkv, (q, k, v, dout, rows)
    fused = flex_backward_fused_mosaic

    def one_pass(*patches):
        def run(q, k, v, do, r):
            return _patched(patches, fused.backward, q, k, v, do, r, r, geometry, tables)
        return jax.jit(run)

    no_reduce = _Overridden(fused.plgpu, copy_smem_to_gmem=lambda *a, **k: None)
    no_product = _Overridden(fused.two_pass, product=lambda a, b: fused.plgpu.layout_cast(
        jnp.zeros((a.shape[0], b.shape[1]), jnp.float32), fused.plgpu.Layout.WGMMA))
    args = (q, k, v, dout, rows)
    yield "fused dkv+dq", 5, one_pass(), args
    yield "fused dkv+dq, dQ sum in dQ's layout", 5, one_pass((fused, "DQ_LAYOUT", "rows")), args
    yield "fused dkv+dq, no dQ reduce-add", 5, one_pass((fused, "plgpu", no_reduce)), args
    yield "fused dkv+dq, no dQ product", 5, one_pass((fused, "two_pass", no_product)), args
    yield ("fused dkv+dq, registers 232/40", 5,
           one_pass((flex_backward_mosaic, "DKV_REGISTERS", (232, 40))), args)
    triton_plan = make_plan(mask, 64, 64)
    triton_tables = jax.tree.map(jnp.asarray, triton_plan.tables())
    whole = jax.jit(lambda q, k, v, do, r: flex_kernel._backward(
        q, k, v, r, r, do, triton_plan.geometry, triton_tables, flex_kernel.Lowering()))
    yield "triton backward (dq + dkv)", 5, whole, (q, k, v, dout, rows)


class _Overridden:
    """A module with some of its names replaced (the ablations' stand-ins)."""

    def __init__(self, module, **names):
        self._module, self._names = module, names

    def __getattr__(self, name):
        return self._names[name] if name in self._names else getattr(self._module, name)


def _with_registers(registers, fn, *args):
    """fn traced with flex_backward_mosaic.DKV_REGISTERS set to `registers`."""
    return _patched(((flex_backward_mosaic, "DKV_REGISTERS", registers),), fn, *args)


def _patched(patches, fn, *args):
    """fn(*args) traced with each (module, name, value) of patches set."""
    kept = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, value in patches:
        setattr(module, name, value)
    try:
        return fn(*args)
    finally:
        for module, name, value in kept:
            setattr(module, name, value)


def main(argv):
    del argv
    device = jax.devices()[0].device_kind
    lines = []
    print(f"{device}, {HEADS}:{KV_HEADS} heads, d={HEAD_DIM}, bf16, {_SEQLEN.value} tokens")
    for name in _MASKS.value:
        mask = make_mask(name, _SEQLEN.value,
                         **taken_params(name, distribution="chatqa2_long_sft"))
        matmul_flops = 2 * mask.area() * HEAD_DIM * HEADS
        for kernel, matmuls, fn, args in _kernels(mask, _SEQLEN.value):
            if not kernel.startswith(tuple(_KERNELS.value)):
                continue
            try:
                ms = _median_ms(fn, *args)
                tflops = matmuls * matmul_flops / (ms * 1e-3) / 1e12
                row = {"mask": name, "kernel": kernel, "ms": round(ms, 3),
                       "tflops": round(tflops, 1), "device": device, "seqlen": _SEQLEN.value}
            except Exception as error:  # noqa: BLE001 - one kernel's failure is one line
                row = {"mask": name, "kernel": kernel, "error": str(error)[:300]}
            lines.append(row)
            print(json.dumps(row), flush=True)
    if _OUT.value:
        with open(_OUT.value, "w") as out:
            out.writelines(json.dumps(row) + "\n" for row in lines)


if __name__ == "__main__":
    app.run(main)
