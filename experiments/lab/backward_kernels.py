"""jax.pallas_flex's Mosaic backward kernels timed one by one (Hopper GPU):
where the default backward's time goes, kernel by kernel.

    python3 experiments/lab/backward_kernels.py [--masks=full,causal_document]
        [--seqlens=16k,32k] [--kernels=dq,dkv,backward] [--iters=10]
        [--options=dkv_split=2] [--out=FILE.jsonl] [--ncu_once]

Each mask and length is the seed blog's workload, read from
experiments/seed_blog.flags as its sweep reads it (64:8 heads, d=128,
bf16, batch 1, windows of 1024, the chatqa2 documents packed by
magi_pack, mask seed 0), under the jax.pallas_flex backend's default
backward (no option set): its 128 x 128 plan and its Mosaic config.
Timed: the dQ kernel and the dK/dV kernel alone, each with the launch
order, and dK/dV with the split, that ops._backward takes there
(schedule.dkv_schedule; a split's K/V come at the repeated heads' shape,
not repeated in the timed call), and the whole backward as the custom VJP
runs it (ops.block_gradients: delta's rowsum, lse in base 2, both
kernels, a split's repeat and sum). Each is timed as the harness times
(jax_backends.runtime: L2 flushed before every call, batches of calls,
warm until steady). TFLOP/s count each kernel's own matmuls over the
mask's exact area: dQ 3 (S, dP, dQ), dK/dV 4 (S^T, dP^T, dV, dK); the
backward 5 (the harness's bwd count) over the whole backward's time.
"other" is the whole backward less the two kernels. Inputs are random in
bf16 and zeros in float32 (lse, and delta for the kernels alone): the
kernels do the same work on any finite values, and no result is checked
here (the sweeps' full-size check does that). One JSON line per kernel
and per whole backward goes to --out, a table to stdout; set
MOSAIC_GPU_DUMP_PTXAS=1 to see each kernel's registers and spills.

Hardware counters (Nsight Compute): with --ncu_once each chosen function
is compiled, then called once per mask and length (dQ, dK/dV, then the
whole backward), without the harness's loop or L2 flushes (ncu's replay
flushes the caches itself). The kernels' entry functions are
lcab_flex_dq_mosaic_mosaic_gpu_kernel and lcab_flex_dkv_mosaic_mosaic_gpu_kernel:

    ncu --clock-control none --kernel-name regex:'lcab_flex_(dq|dkv)_mosaic' \\
        --launch-count 2 --set full -o bwd-causal-32k \\
        python3 experiments/lab/backward_kernels.py --ncu_once --kernels=dq,dkv \\
        --masks=causal --seqlens=32k

--launch-count is 2 a mask and length (dQ, then dK/dV); with
--kernels=backward too, 4 takes the two inside the whole backward after
them. Without --kernel-name ncu profiles every launch (with
--kernels=backward: the inputs' random fills first, then the backward's
XLA fusions and both kernels).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from absl import flags

from jax_backends.pallas_flex import mosaic_bwd_sm90, ops
from jax_backends.pallas_flex.backend import PallasFlexBackend
from jax_backends.pallas_flex.plan import Geometry, make_plan
from jax_backends.pallas_flex.schedule import dkv_schedule
from jax_backends.runtime import JaxRuntime
from lcab.experiments import presets
from lcab.experiments.sweep import Sweep, parse_heads
from lcab.workloads import Workload, parse_seqlen

BLOG_FLAGS = "experiments/seed_blog.flags"
MASKS = ("full", "causal", "causal_document", "sliding_window_causal")  # the default
KERNELS = ("dq", "dkv", "backward")

# Its own flags, not absl's global ones: the tests import this script into
# a process that also holds the CLI's (--masks, --iters, --out...).
FLAGS = flags.FlagValues()
_MASKS = flags.DEFINE_list("masks", list(MASKS), f"Masks of {BLOG_FLAGS}, at its settings.",
                           flag_values=FLAGS)
_SEQLENS = flags.DEFINE_list("seqlens", ["16k", "32k"], "Tokens (4096, 4k, ...).",
                             flag_values=FLAGS)
_KERNELS = flags.DEFINE_list("kernels", list(KERNELS),
                             f"What to time: {', '.join(KERNELS)} (the whole backward).",
                             flag_values=FLAGS)
_ITERS = flags.DEFINE_integer("iters", 10, "Samples per kernel.", lower_bound=1,
                              flag_values=FLAGS)
_OUT = flags.DEFINE_string("out", None, "JSON lines, one per kernel and whole backward.",
                           flag_values=FLAGS)
_OPTIONS = flags.DEFINE_list("options", [],
                             "jax.pallas_flex options as key=value (its backward under "
                             "them, e.g. dkv_split=2); default: none set.",
                             flag_values=FLAGS)
_NCU_ONCE = flags.DEFINE_bool("ncu_once", False,
                              "Call each function once, untimed (for Nsight Compute).",
                              flag_values=FLAGS)


def blog_sweep(masks, seqlens) -> Sweep:
    """The seed blog's sweep of these masks and lengths, its settings read
    from its flagfile (a flag it leaves unset: the family's default)."""
    blog = presets.read(BLOG_FLAGS)
    choices = blog["masks"].split(",")
    unknown = [name for name in masks if name not in choices]
    if unknown:
        raise ValueError(f"--masks: {unknown[0]!r} is none of the seed blog's masks: "
                         f"{', '.join(choices)}")

    def number(key, kind):
        return kind(blog[key]) if key in blog else None

    return Sweep(backends=("jax.pallas_flex",), masks=tuple(masks),
                 seqlens=tuple(parse_seqlen(s) for s in seqlens),
                 batch=int(blog["batch"]), heads=parse_heads(blog["heads"]),
                 head_dim=int(blog["head_dim"]), dtype=blog["dtype"],
                 mask_seed=int(blog["mask_seed"]), window=number("window", int),
                 doc_distribution=blog.get("doc_distribution"),
                 doc_sampler=blog.get("doc_sampler"), doc_cap=number("doc_cap", float))


def blog_workload(name: str, seqlen: int) -> Workload:
    """The workload the seed blog's sweep times for this mask and length."""
    return blog_sweep([name], [str(seqlen)]).cases()[0].workload


class Timed(NamedTuple):
    name: str  # "dq", "dkv" or "backward"
    matmuls: int  # tile matmuls its TFLOP/s counts over the mask's area
    fn: Callable  # fn(q, (k, v), rows)
    arguments: tuple  # its three arguments' jax.ShapeDtypeStructs


class Backward(NamedTuple):
    """The default backward of a workload, as ops._backward runs it."""

    geometry: Geometry
    dkv_launch: str
    dkv_split: int
    dq_heads_together: bool
    timed: tuple[Timed, ...]


def backend_options(pairs) -> dict[str, str]:
    """--options' key=value pairs; a ValueError for one without "="."""
    bad = [pair for pair in pairs if "=" not in pair]
    if bad:
        raise ValueError(f"--options: {bad[0]!r} is not key=value")
    return dict(pair.split("=", 1) for pair in pairs)


def default_backward(workload: Workload, options=None) -> tuple[ops.Lowering, tuple[int, int]]:
    """The jax.pallas_flex backend's lowering and backward blocks on
    `workload` under `options` (none: its default); a ValueError where its
    backward is not the Mosaic one (not a Hopper GPU) or an option is bad."""
    backend = PallasFlexBackend(**PallasFlexBackend.parse_options(options or {}))
    lowering = backend.lowering
    blocks = backend.backward_blocks(workload.dtype, workload.head_dim)
    problem = lowering.mosaic_problem("backward", *blocks, workload.dtype, workload.head_dim)
    if problem:
        raise ValueError("jax.pallas_flex's backward runs its Mosaic kernels on a "
                         f"Hopper GPU only; here it would not: {problem}")
    return lowering, blocks


def kernels(workload: Workload, options=None) -> Backward:
    """dQ and dK/dV alone, and the whole backward, each as the backend's
    backward under `options` (none: its default) runs them on `workload`
    (default_backward's error where that is not the Mosaic one)."""
    lowering, blocks = default_backward(workload, options)
    plan = make_plan(workload.mask, *blocks)
    geometry, tables = plan.geometry, plan.tables()
    batch, heads, kv_heads = workload.batch, workload.heads_q, workload.heads_kv
    # ops._backward's choices, from the same arguments.
    order, split = dkv_schedule(geometry, kv_heads * batch, heads // kv_heads,
                                lowering.dkv_launch, lowering.dkv_split, True)
    dq_together = lowering.rows_launch != "head_major"
    config = lowering.mosaic_backward
    scale = 1.0 / math.sqrt(workload.head_dim)
    dtype = jnp.dtype(workload.dtype)

    def arrays():  # the plan's tables as constants of the traced function, as in ops
        return jax.tree.map(jnp.asarray, tables)

    def dq(q, kv, rows):
        dout, lse2, delta = rows
        return mosaic_bwd_sm90._dq(q, *kv, dout, lse2, delta, geometry, arrays(), scale,
                                   config.stages, config.parts, dq_together)

    def dkv(q, kv, rows):  # K/V already repeated `split` times
        dout, lse2, delta = rows
        return mosaic_bwd_sm90._dkv(q, *kv, dout, lse2, delta, geometry, arrays(), scale,
                                    config.stages, order == "heads_together", config.parts)

    def backward(q, kv, rows):  # the custom VJP's backward (lse's cotangent zeros)
        out, lse, dout = rows
        return ops.block_gradients(q, *kv, out, lse, dout, geometry, arrays(), lowering,
                                   jnp.zeros_like(lse))

    def tensor(seq, h):
        return jax.ShapeDtypeStruct((batch, seq, h, workload.head_dim), dtype)

    def arguments(seq_q, seq_k, kv, rows_f32):
        vector = jax.ShapeDtypeStruct((batch, heads, seq_q), jnp.float32)
        rows = (tensor(seq_q, heads), vector, vector) if rows_f32 else (
            tensor(seq_q, heads), vector, tensor(seq_q, heads))
        return tensor(seq_q, heads), (tensor(seq_k, kv),) * 2, rows

    padded_q, padded_k = geometry.padded_q, geometry.padded_k
    return Backward(geometry, order, split, dq_together, (
        Timed("dq", 3, dq, arguments(padded_q, padded_k, kv_heads, True)),
        Timed("dkv", 4, dkv, arguments(padded_q, padded_k, kv_heads * split, True)),
        Timed("backward", 5, backward,
              arguments(workload.seqlen_q, workload.seqlen_k, kv_heads, False))))


def random_inputs(arguments, seed: int = 0):
    """Arrays of these ShapeDtypeStructs: random normal in bf16 or f16,
    zeros in float32 (lse, delta)."""
    leaves, tree = jax.tree.flatten(arguments)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [
        jnp.zeros(x.shape, x.dtype) if x.dtype == jnp.float32
        else jax.random.normal(key, x.shape, x.dtype) for x, key in zip(leaves, keys)])


def _cells(found: dict, key: str, fmt: str) -> str:
    return format(found[key], fmt) if key in found else "-"


def main(argv) -> None:
    FLAGS.unparse_flags()  # each call from its defaults (the tests call it more than once)
    try:
        FLAGS(argv)
    except flags.Error as error:
        sys.exit(f"{error}\n{__doc__}")
    chosen = [name for name in KERNELS if name in _KERNELS.value]
    unknown = sorted(set(_KERNELS.value) - set(KERNELS))
    try:
        if unknown:
            raise ValueError(f"--kernels: {unknown[0]!r} is none of {', '.join(KERNELS)}")
        options = backend_options(_OPTIONS.value)
        cases = blog_sweep(_MASKS.value, _SEQLENS.value).cases()
        if cases:  # refused before any timing where the Mosaic backward cannot run
            default_backward(cases[0].workload, options)
    except ValueError as error:
        sys.exit(str(error))
    runtime = JaxRuntime()
    device = runtime.device().name
    if cases:
        first = cases[0].workload
        print(f"{device}, {first.heads_q}:{first.heads_kv} heads, d={first.head_dim}, "
              f"{first.dtype}, batch {first.batch}\n")
    if not _NCU_ONCE.value:
        print("| mask | seqlen | dQ ms | dQ TFLOP/s (3 matmuls) | dK/dV ms | dK/dV TFLOP/s "
              "(4 matmuls) | dQ+dK/dV ms | whole backward ms | other ms | backward TFLOP/s "
              "(5 matmuls) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = []
    for case in cases:
        workload = case.workload
        name, seqlen = workload.mask.name, workload.seqlen_q
        backward = kernels(workload, options)
        matmul = workload.flops("fwd") / 2  # one tile matmul over the mask's exact area
        found = {}
        for timed in backward.timed:
            if timed.name not in chosen:
                continue
            inputs = random_inputs(timed.arguments)
            if _NCU_ONCE.value:  # compiled first: the one call is the kernels alone
                compiled = jax.jit(timed.fn).lower(*inputs).compile()
                jax.block_until_ready(compiled(*inputs))
                continue
            timing = runtime.measure(timed.fn, inputs, backward=False, warmup=3,
                                     iters=_ITERS.value, flush_l2=True)
            ms = timing.median_ms
            tflops = timed.matmuls * matmul / (ms * 1e-3) / 1e12
            found[timed.name], found[f"{timed.name} TFLOP/s"] = ms, tflops
            lines.append({"mask": name, "seqlen": seqlen, "kernel": timed.name,
                          "median_ms": ms, "p20_ms": timing.p20_ms, "p80_ms": timing.p80_ms,
                          "tflops": tflops, "matmuls": timed.matmuls, "device": device,
                          "mask_fingerprint": workload.mask.fingerprint(),
                          "dkv_launch": backward.dkv_launch, "dkv_split": backward.dkv_split,
                          "dq_heads_together": backward.dq_heads_together,
                          "options": options})
            del inputs
        runtime.cleanup()  # the compiled kernels and what they hold
        if _NCU_ONCE.value:
            print(f"{name} {seqlen}: {', '.join(chosen)} called once (dK/dV "
                  f"{backward.dkv_launch}, split {backward.dkv_split})", flush=True)
            continue
        if "dq" in found and "dkv" in found:
            found["kernels"] = found["dq"] + found["dkv"]
            if "backward" in found:
                found["other"] = found["backward"] - found["kernels"]
        print(f"| {name} | {seqlen} | {_cells(found, 'dq', '.3f')} | "
              f"{_cells(found, 'dq TFLOP/s', '.0f')} | {_cells(found, 'dkv', '.3f')} | "
              f"{_cells(found, 'dkv TFLOP/s', '.0f')} | {_cells(found, 'kernels', '.3f')} | "
              f"{_cells(found, 'backward', '.3f')} | {_cells(found, 'other', '.3f')} | "
              f"{_cells(found, 'backward TFLOP/s', '.0f')} |", flush=True)
    if _OUT.value and not _NCU_ONCE.value:
        with open(_OUT.value, "w") as out:
            out.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main(sys.argv)
