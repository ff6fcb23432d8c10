"""jax.pallas_flex's Mosaic backward kernels timed one by one (Hopper GPU):
where the backward's time goes, kernel by kernel, under each
`backward_overlap` (mosaic_bwd_sm90.OVERLAPS; docs/pallas_flex.md, v17).

    python3 experiments/lab/backward_kernels.py [--masks=full,causal_document]
        [--seqlens=16384,32768] [--overlaps=none,both] [--out=FILE.jsonl]

For each mask (the seed blog's: 64:8 heads, d=128, bf16, batch 1, windows
of 1024, chatqa2 documents packed by magi_pack, mask seed 0) and length:
the dQ kernel and the dK/dV kernel alone on the 128 x 128 plan, with the
launch orders the backward takes by default, each timed as the harness
times (jax_backends.runtime: L2 flushed before every call, batches of
calls, warm until steady). TFLOP/s count each kernel's own matmuls over
the mask's exact area: dQ 3 (S, dP, dQ), dK/dV 4 (S^T, dP^T, dV, dK); a
backward's harness figure counts 5 over the sum of both times. The
inputs' lse and delta are zeros: the kernels do the same work on any
finite values, and no result is checked here (the sweeps' full-size check
does that). One JSON line per kernel goes to --out and a table to stdout;
set MOSAIC_GPU_DUMP_PTXAS=1 to see each kernel's registers and spills.
"""

from __future__ import annotations

import json
import math
import sys

import jax
import jax.numpy as jnp
from absl import flags

from jax_backends.pallas_flex import mosaic_bwd_sm90, ops
from jax_backends.pallas_flex.plan import make_plan
from jax_backends.runtime import JaxRuntime
from lcab.masks import make_mask
from lcab.masks.factory import taken_params

HEADS, KV_HEADS, HEAD_DIM = 64, 8, 128
MASKS = ("full", "causal", "causal_document", "sliding_window_causal")

# Its own flags, not absl's global ones: the tests import this script into
# a process that also holds the CLI's (--masks, --iters, --out...).
FLAGS = flags.FlagValues()
_MASKS = flags.DEFINE_list("masks", list(MASKS), "Mask families (the seed blog's settings).",
                           flag_values=FLAGS)
_SEQLENS = flags.DEFINE_list("seqlens", ["16384", "32768"], "Tokens.", flag_values=FLAGS)
_OVERLAPS = flags.DEFINE_list("overlaps", ["none", "both"],
                              f"backward_overlap values: {', '.join(mosaic_bwd_sm90.OVERLAPS)}.",
                              flag_values=FLAGS)
_ITERS = flags.DEFINE_integer("iters", 10, "Samples per kernel.", lower_bound=1,
                              flag_values=FLAGS)
_OUT = flags.DEFINE_string("out", None, "JSON lines, one per kernel.", flag_values=FLAGS)


def blog_mask(name: str, seqlen: int):
    """The mask the seed blog's sweep times (experiments/seed_blog.flags)."""
    params = taken_params(name, distribution="chatqa2_long_sft", sampler="magi_pack",
                          doc_cap=None, window=1024)
    return make_mask(name, seqlen, seed=0, **params)


def kernels(mask, overlap: str):
    """(kernel name, its matmuls, f(q, k, v)) of the two backward kernels."""
    plan = make_plan(mask, mosaic_bwd_sm90.BLOCK, mosaic_bwd_sm90.BLOCK)
    tables = jax.tree.map(jnp.asarray, plan.tables())
    geometry = plan.geometry
    dout = jax.random.normal(jax.random.key(3), (1, geometry.padded_q, HEADS, HEAD_DIM),
                             jnp.bfloat16)
    rows = jnp.zeros((1, HEADS, geometry.padded_q), jnp.float32)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    config = mosaic_bwd_sm90.Config(overlap=overlap)
    lowering = ops.Lowering()
    dkv_together = ops.dkv_launch(geometry, KV_HEADS, lowering) == "heads_together"
    dq_together = lowering.rows_launch == "heads_together"

    def dq(q, k, v):
        return mosaic_bwd_sm90._dq(q, k, v, dout, rows, rows, geometry, tables, scale,
                                   config.stages, config.parts, dq_together,
                                   config.overlaps("dq"))

    def dkv(q, k, v):
        return mosaic_bwd_sm90._dkv(q, k, v, dout, rows, rows, geometry, tables, scale,
                                    config.stages, dkv_together, config.parts,
                                    config.overlaps("dkv"))

    return geometry, (("dq", 3, dq), ("dkv", 4, dkv))


def main(argv) -> None:
    try:
        FLAGS(argv)
    except flags.Error as error:
        sys.exit(f"{error}\n{__doc__}")
    unknown = sorted(set(_OVERLAPS.value) - set(mosaic_bwd_sm90.OVERLAPS))
    if unknown:
        sys.exit(f"--overlaps: {unknown[0]!r} is none of {', '.join(mosaic_bwd_sm90.OVERLAPS)}")
    runtime = JaxRuntime()
    device = jax.devices()[0].device_kind
    print(f"{device}, {HEADS}:{KV_HEADS} heads, d={HEAD_DIM}, bf16, batch 1\n")
    print("| mask | seqlen | overlap | dQ ms | dQ TFLOP/s | dK/dV ms | dK/dV TFLOP/s "
          "| backward TFLOP/s (5 matmuls) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    lines = []
    for name in _MASKS.value:
        for seqlen in map(int, _SEQLENS.value):
            mask = blog_mask(name, seqlen)
            matmul = 2 * mask.area() * HEAD_DIM * HEADS  # one matmul over the exact area
            for overlap in _OVERLAPS.value:
                geometry, timed = kernels(mask, overlap)
                keys = jax.random.split(jax.random.key(0), 3)
                q = jax.random.normal(keys[0], (1, geometry.padded_q, HEADS, HEAD_DIM),
                                      jnp.bfloat16)
                k, v = (jax.random.normal(key, (1, geometry.padded_k, KV_HEADS, HEAD_DIM),
                                          jnp.bfloat16) for key in keys[1:])
                found = {}
                for kernel, matmuls, fn in timed:
                    timing = runtime.measure(fn, (q, k, v), backward=False, warmup=3,
                                             iters=_ITERS.value, flush_l2=True)
                    ms = timing.median_ms
                    found[kernel] = (ms, matmuls * matmul / (ms * 1e-3) / 1e12)
                    lines.append({"mask": name, "seqlen": seqlen, "overlap": overlap,
                                  "kernel": kernel, "median_ms": ms, "p20_ms": timing.p20_ms,
                                  "p80_ms": timing.p80_ms, "tflops": found[kernel][1],
                                  "matmuls": matmuls, "device": device})
                runtime.cleanup()  # the compiled kernels and the inputs they hold
                total_ms = found["dq"][0] + found["dkv"][0]
                print(f"| {name} | {seqlen} | {overlap} | {found['dq'][0]:.2f} | "
                      f"{found['dq'][1]:.0f} | {found['dkv'][0]:.2f} | {found['dkv'][1]:.0f} | "
                      f"{5 * matmul / (total_ms * 1e-3) / 1e12:.0f} |", flush=True)
    if _OUT.value:
        with open(_OUT.value, "w") as out:
            out.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main(sys.argv)
