"""python -m lcab.simulate: predicted CP scaling beyond the GPUs we have.

    python -m lcab.simulate --strategies=ring,allgather,ulysses,usp \\
        --cp=8,16,32,64,96 --masks=causal_document,full --seqlen_per_gpu=8k --out=out/sim

Prints, per mask, dispatch and direction, the predicted per-GPU TFLOP/s of
each strategy at each cp size and where the time goes (compute, imbalance,
exposed communication; lcab.model.strategies), and with --out writes the
table as CSV and markdown and one figure per mask and direction. Kernel
speed comes from committed kernel rows (--kernel_results, --kernel), links
from comm rows (--comm_results) inside a node and from --inter_* between
nodes. --validate_against=RESULTS also prints the model against every
measured CP row there and against MagiAttention's published figures. The
output is a model, not a measurement: label it so wherever it is shown.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import pandas as pd
from absl import app, flags

from lcab import results
from lcab.comm import AlphaBeta
from lcab.cp import DISPATCH_NAMES
from lcab.experiments.sweep import parse_heads, parse_seqlen
from lcab.flops import TIMED_DIRECTIONS
from lcab.masks import canonical_name, make_mask, taken_params
from lcab.masks.doc_lengths import DISTRIBUTIONS
from lcab.model import (HBM_H100, INFINIBAND_NDR, STRATEGIES, KernelCurve, Shape,
                        network_from_comm, predict)
from lcab.model.validation import against_published, error_summary, predicted_vs_measured
from lcab.report.tables import to_markdown

# The 4 x H100 sessions: the comm rows are in the first, kernel and CP rows in all three.
_MEASURED = ["results/gpu/2026-11-26-h100x4-cp", "results/gpu/2026-11-26-h100x4-cp2",
             "results/gpu/2026-11-26-h100x4-cp3"]

_STRATEGIES = flags.DEFINE_list("strategies", list(STRATEGIES),
                                f"CP strategies: {', '.join(STRATEGIES)}.")
_CP = flags.DEFINE_list("cp", ["1", "2", "4", "8", "16", "32", "64", "96"], "GPU counts.")
_MASKS = flags.DEFINE_list("masks", ["causal_document", "full"], "Mask families.")
_SEQLEN_PER_GPU = flags.DEFINE_string("seqlen_per_gpu", "8k", "Tokens per GPU, e.g. 8k.")
_DISPATCHES = flags.DEFINE_list("dispatch", ["balanced"],
                                f"Dispatches: {', '.join(DISPATCH_NAMES)}.")
_DIRECTIONS = flags.DEFINE_list("directions", ["fwd"], "fwd, bwd.")
_HEADS = flags.DEFINE_string("heads", "64:8", "Query:KV heads.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 128, "Head dimension.", lower_bound=1)
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float16", "float32"], "dtype.")
_DOC_DISTRIBUTION = flags.DEFINE_enum("doc_distribution", "chatqa2_long_sft",
                                      list(DISTRIBUTIONS), "Document lengths.")
_MASK_SEED = flags.DEFINE_integer("mask_seed", 0, "Seed of random mask parameters.")
_KERNEL = flags.DEFINE_string("kernel", "jax.pallas_flex",
                              "The backend whose measured speed the ranks' calls run at.")
_KERNEL_RESULTS = flags.DEFINE_list(
    "kernel_results", [*_MEASURED, "results/gpu/2026-11-26-h100-seed-kernels"],
    "Result files or directories holding --kernel's kernel rows.")
_DEVICE = flags.DEFINE_string("device", None, "Device of the kernel rows (default: the one "
                              "with most rows of --kernel).")
_COMM_RESULTS = flags.DEFINE_list("comm_results", _MEASURED[:1],
                                  "Comm-suite rows the intra-node links are fitted to.")
_GPUS_PER_NODE = flags.DEFINE_integer("gpus_per_node", 8, "GPUs joined by NVLink.",
                                      lower_bound=1)
_INTER_ALPHA_US = flags.DEFINE_float("inter_alpha_us", INFINIBAND_NDR.alpha_s * 1e6,
                                     "Latency of a collective between nodes (us).")
_INTER_GBPS = flags.DEFINE_float("inter_gbps", INFINIBAND_NDR.beta_bytes_per_s / 1e9,
                                 "Bus bandwidth per GPU between nodes (GB/s).")
_NVLINK_ALPHA_US = flags.DEFINE_float(
    "nvlink_alpha_us", None, "Latency of a collective inside a node (us); default: fitted to "
    "--comm_results per collective.")
_NVLINK_GBPS = flags.DEFINE_float(
    "nvlink_gbps", None, "Bus bandwidth per GPU inside a node (GB/s); default: fitted to "
    "--comm_results per collective (NVLink 4's published 450 GB/s per direction is the "
    "ceiling).")
_HBM_GBPS = flags.DEFINE_float(
    "hbm_gbps", HBM_H100 / 1e9, "Memory bandwidth each GPU's ring merges stream at (GB/s; "
    "default: 90 % of an H100 SXM's 3350). The validation keeps the default: its rows ran "
    "on H100s.", lower_bound=1.0)
_ULYSSES_SIZE = flags.DEFINE_integer("ulysses_size", None, "USP's Ulysses group (default: the "
                                     "largest dividing cp and the K/V heads within a node).")
_VALIDATE = flags.DEFINE_list("validate_against", [],
                              "Measured results to compare the model with.")
_OUT = flags.DEFINE_string("out", None, "Directory for predictions.csv/.md and figures.")


def _check_list(name, values, choices):
    bad = [v for v in values if v not in choices]
    if bad:
        raise flags.ValidationError(f"--{name}: {', '.join(bad)} not among {', '.join(choices)}")
    return True


flags.register_validator("strategies", lambda v: _check_list("strategies", v, STRATEGIES))
flags.register_validator("dispatch", lambda v: _check_list("dispatch", v, DISPATCH_NAMES))
flags.register_validator("directions",
                         lambda v: _check_list("directions", v, TIMED_DIRECTIONS))


def _check_masks(values):
    try:
        return all(canonical_name(name) for name in values)
    except ValueError as exc:
        raise flags.ValidationError(str(exc)) from exc


def _check_cp(values):
    bad = [v for v in values if not v.isdigit() or int(v) < 1]
    if bad:
        raise flags.ValidationError(f"--cp: {', '.join(bad)} are not GPU counts (1, 2, ...)")
    return True


flags.register_validator("masks", _check_masks)
flags.register_validator("cp", _check_cp)


def _mask_params(name: str) -> dict:
    """The document-length histogram, for the families that take one."""
    return taken_params(name, distribution=_DOC_DISTRIBUTION.value)


def _predictions(curve, network, shape, seqlen_per_gpu) -> pd.DataFrame:
    records = []
    for mask_name in map(canonical_name, _MASKS.value):
        params = _mask_params(mask_name)
        for cp in (int(c) for c in _CP.value):
            mask = make_mask(mask_name, seqlen_per_gpu * cp, seed=_MASK_SEED.value, **params)
            for dispatch in _DISPATCHES.value:
                for direction in _DIRECTIONS.value:
                    for strategy in _STRATEGIES.value:
                        found = predict(strategy, mask, cp, shape, curve, network,
                                        dispatch=dispatch, direction=direction,
                                        ulysses_size=_ULYSSES_SIZE.value,
                                        memory_bytes_per_s=_HBM_GBPS.value * 1e9)
                        records.append({
                            "mask": mask_name, "dispatch": dispatch, "direction": direction,
                            "cp": cp, "strategy": strategy,
                            "tflops_per_gpu": found.tflops_per_gpu,
                            "ms": found.seconds * 1e3, "compute_ms": found.compute_s * 1e3,
                            "imbalance_ms": found.imbalance_s * 1e3,
                            "exposed_comm_ms": found.exposed_comm_s * 1e3,
                            "problem": found.problem})
    return pd.DataFrame(records)


def _wide(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (mask, dispatch, direction, cp), one column per strategy:
    'TFLOP/s (compute / imbalance / exposed comm ms)', X where it cannot run."""
    def cell(row):
        if row["problem"]:
            return "X"
        return (f"{row['tflops_per_gpu']:.0f} ({row['compute_ms']:.1f} / "
                f"{row['imbalance_ms']:.1f} / {row['exposed_comm_ms']:.1f})")

    table = frame.assign(cell=frame.apply(cell, axis=1)).pivot_table(
        index=["mask", "dispatch", "direction", "cp"], columns="strategy", values="cell",
        aggfunc="first", sort=False)
    return table[[s for s in _STRATEGIES.value if s in table.columns]]


def _figures(frame: pd.DataFrame, out: pathlib.Path) -> list[pathlib.Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for (mask, direction), group in frame.groupby(["mask", "direction"], sort=False):
        fig, (speed, lost) = plt.subplots(1, 2, figsize=(11, 4))
        for (strategy, dispatch), line in group.groupby(["strategy", "dispatch"], sort=False):
            line = line[line["problem"] == ""]
            if line.empty:
                continue
            label = f"{strategy} ({dispatch})"
            speed.plot(line["cp"], line["tflops_per_gpu"], marker="o", label=label)
            share = (line["imbalance_ms"] + line["exposed_comm_ms"]) / line["ms"] * 100
            lost.plot(line["cp"], share, marker="o", label=label)
        for axis, title in ((speed, "per-GPU TFLOP/s (model)"),
                            (lost, "% of time not computing (imbalance + exposed comm)")):
            axis.set_xscale("log", base=2)
            axis.set_xlabel("GPUs (cp)")
            axis.set_title(title, fontsize=10)
            axis.grid(alpha=0.3)
        speed.legend(fontsize=8)
        fig.suptitle(f"{mask}, {direction}: predicted by lcab.simulate (a model)")
        path = out / f"simulate_{mask}_{direction}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def _with_nvlink(network):
    """--nvlink_alpha_us / --nvlink_gbps, where given, for every collective."""
    if _NVLINK_ALPHA_US.value is None and _NVLINK_GBPS.value is None:
        return network
    intra = {op: AlphaBeta(
        ab.alpha_s if _NVLINK_ALPHA_US.value is None else _NVLINK_ALPHA_US.value * 1e-6,
        ab.beta_bytes_per_s if _NVLINK_GBPS.value is None else _NVLINK_GBPS.value * 1e9)
        for op, ab in network.intra.items()}
    return dataclasses.replace(network, intra=intra)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    heads_q, heads_kv = parse_heads(_HEADS.value)
    shape = Shape(heads_q, heads_kv, _HEAD_DIM.value, _DTYPE.value)
    kernel_rows = results.newest_rows(results.read_rows(_KERNEL_RESULTS.value))
    try:
        curve = KernelCurve.from_rows(kernel_rows, _KERNEL.value, _DEVICE.value,
                                      head_dim=_HEAD_DIM.value, dtype=_DTYPE.value)
    except ValueError as exc:
        raise app.UsageError(f"--kernel={_KERNEL.value}: {exc} in "
                             f"{', '.join(_KERNEL_RESULTS.value)}") from exc
    inter = AlphaBeta(_INTER_ALPHA_US.value * 1e-6, _INTER_GBPS.value * 1e9)
    network = _with_nvlink(network_from_comm(
        results.read_rows(_COMM_RESULTS.value) if _COMM_RESULTS.value else [],
        gpus_per_node=_GPUS_PER_NODE.value, inter=inter))
    frame = _predictions(curve, network, shape, parse_seqlen(_SEQLEN_PER_GPU.value))
    print(f"Model (not a measurement): kernel {curve.backend} on {curve.device}; "
          f"{_GPUS_PER_NODE.value} GPUs per node; cells: per-GPU TFLOP/s "
          "(compute / imbalance / exposed comm, ms)\n")
    print(to_markdown(_wide(frame)))
    if _VALIDATE.value:
        measured = results.newest_rows(results.read_rows(_VALIDATE.value))
        checked = predicted_vs_measured(measured, network_from_comm(
            measured, gpus_per_node=_GPUS_PER_NODE.value, inter=inter))
        print("\nModel against measured rows (a cp 1 row is left out of its own curve):\n")
        print(to_markdown(error_summary(checked)))
        print("\nModel against published figures (forward, 8k tokens per GPU):\n")
        print(to_markdown(against_published(curve, network, shape).set_index(
            ["mask", "published", "cp"])))
    if _OUT.value:
        out = pathlib.Path(_OUT.value)
        out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out / "predictions.csv", index=False)
        (out / "predictions.md").write_text(to_markdown(_wide(frame)) + "\n")
        if _VALIDATE.value:
            checked.to_csv(out / "validation.csv", index=False)
        for path in _figures(frame, out):
            print(path, file=sys.stderr)


if __name__ == "__main__":
    app.run(main)
