"""python -m lcab.model: predicted CP scaling beyond the GPUs we have.

    python -m lcab.model --strategies=ring,allgather,ulysses,usp,groupcast \\
        --cp=8,16,32,64,96 --masks=causal_document,full --seqlen_per_gpu=8k --out=out/sim

Prints, per mask, dispatch and direction, the predicted per-GPU TFLOP/s of
each strategy at each cp size and where the time goes (compute, imbalance,
exposed communication; lcab.model.strategies), and with --out writes the
table as CSV and markdown and one figure per mask and direction. Kernel
speed comes from measured kernel rows of --kernel, links inside a node
from the comm rows of --kernel's framework (each framework times its own
collectives), links between nodes from --inter_*. --validate also prints
the model against every measured CP row and against MagiAttention's
published figures. The output is a model, not a measurement: label it so
wherever it is shown.

Rows: by default the newest canonical runs under --results_root (this
checkout's results/, found from the package, so any working directory
will do; lcab.model.calibration says which run serves what): the kernel
curve from the current blog and cp runs on the newest cp run's card,
joined, the links and the validation from the newest cp run. --kernel_results,
--comm_results and --validate_against name other rows. With no canonical
run and no such flag it stops with a one-line message. The output begins
with the folders, commits, devices and dates it was calibrated on, the
lengths the kernel curve was measured at, and a warning line where the
modelled per-GPU calls lie outside what the curve measured (or the curve
has one length), so the figures there are extrapolated.

The workload flags (--masks, --heads, --head_dim, --dtype, --directions,
--doc_distribution, --doc_sampler, --doc_cap, --mask_seed, --dispatch) are the benchmark's
(lcab.experiments.workload_flags); here they default to causal_document and
full, 64:8 heads, d=128, bf16, chatqa2 documents packed as the seed blog
packs them (magi_pack: documents cut at a quarter of the sequence), the
forward, the balanced dispatch. One pack (--mask_seed) per prediction; the
comparison with published figures averages 20, as those runs did.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
from collections.abc import Callable

import pandas as pd
from absl import app, flags

from lcab import canonical
from lcab.comm import AlphaBeta
from lcab.experiments import workload_flags as workload
from lcab.experiments.sweep import parse_heads, parse_seqlen
from lcab.masks import canonical_name, make_mask, taken_params
from lcab.model import (
    HBM_H100,
    INFINIBAND_NDR,
    STRATEGIES,
    Shape,
    calibration,
    networks_from_comm,
    predict,
)
from lcab.model.coverage import CallLog, extrapolation_warnings
from lcab.model.validation import against_published, error_summary, predicted_vs_measured
from lcab.registry import framework_of
from lcab.report.tables import to_markdown
from lcab.workloads import canonical_dtype

# The model's own defaults for the shared workload flags (the benchmark
# takes its defaults from a preset flagfile instead). Set here, where the
# flags are parsed, so --help shows them.
_WORKLOAD_DEFAULTS = {
    "masks": "causal_document,full", "directions": "fwd", "heads": "64:8", "head_dim": "128",
    "dtype": "bfloat16", "doc_distribution": "chatqa2_long_sft", "doc_sampler": "magi_pack",
    "dispatch": "balanced",
}
for name, text in _WORKLOAD_DEFAULTS.items():
    flags.FLAGS.set_default(name, text)

_PROGRAM = "python -m lcab.model"

_STRATEGIES = flags.DEFINE_list("strategies", list(STRATEGIES),
                                f"CP strategies: {', '.join(STRATEGIES)}.")
_GROUPCAST_STAGES = flags.DEFINE_integer(
    "groupcast_stages", 1, "Kernel calls of groupcast (jax.cp_groupcast's stages option): 1, "
    "the transfer then one call; N > 1, the own keys while the transfer arrives in N - 1 "
    "pieces. magi always runs in lcab.model.strategies.MAGI_STAGES calls.", lower_bound=1)
_CP = flags.DEFINE_list("cp", ["1", "2", "4", "8", "16", "32", "64", "96"], "GPU counts.")
_SEQLEN_PER_GPU = flags.DEFINE_string("seqlen_per_gpu", "8k", "Tokens per GPU, e.g. 8k.")
# The kernel the JAX strategies run inside: the model's strategies are theirs.
_KERNEL = flags.DEFINE_string("kernel", "jax.pallas_flex",
                              "The backend whose measured speed the ranks' calls run at.")
_RESULTS_ROOT = flags.DEFINE_string(
    "results_root", str(canonical.RESULTS),
    "Folder holding the canonical runs (<date>-<device>-<sweep>/) read by default: this "
    "checkout's results/.")
_KERNEL_RESULTS = flags.DEFINE_list(
    "kernel_results", [],
    "Result files or directories holding --kernel's kernel rows (default: the current "
    "canonical blog and cp runs on the newest cp run's card, joined).")
_DEVICE = flags.DEFINE_string("device", None, "Device of the kernel rows (default: the card of "
                              "the newest canonical cp run; with --kernel_results, the one with "
                              "most rows of --kernel).")
_COMM_RESULTS = flags.DEFINE_list(
    "comm_results", [],
    "Comm-suite rows the intra-node links are fitted to, those of --kernel's framework only "
    "(default: the newest canonical cp run).")
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
_VALIDATE = flags.DEFINE_bool(
    "validate", False, "Also compare the model with measured rows (--validate_against) and "
    "with published figures.")
_VALIDATE_AGAINST = flags.DEFINE_list(
    "validate_against", [], "Measured results to compare the model with (default with "
    "--validate: the newest canonical cp run); giving it implies --validate.")
# rows flag -> the canonical sweeps whose newest run it reads when left empty.
_SWEEPS_READ = {"kernel_results": calibration.KERNEL_SWEEPS,
                "comm_results": (calibration.CP_SWEEP,),
                "validate_against": (calibration.CP_SWEEP,)}
_OUT = flags.DEFINE_string("out", None, "Directory for predictions.csv/.md and figures.")


def _check_list(name, values, choices):
    bad = [v for v in values if v not in choices]
    if bad:
        raise flags.ValidationError(f"--{name}: {', '.join(bad)} not among {', '.join(choices)}")
    return True


def _check_cp(values):
    bad = [v for v in values if not v.isdigit() or int(v) < 1]
    if bad:
        raise flags.ValidationError(f"--cp: {', '.join(bad)} are not GPU counts (1, 2, ...)")
    return True


flags.register_validator("strategies", lambda v: _check_list("strategies", v, STRATEGIES))
flags.register_validator("cp", _check_cp)
workload.validate_each(_SEQLEN_PER_GPU, parse_seqlen)


def _mask_params(name: str) -> dict:
    """How documents are drawn, for the families that draw them."""
    return taken_params(name, distribution=workload.DOC_DISTRIBUTION.value,
                        sampler=workload.DOC_SAMPLER.value, doc_cap=workload.DOC_CAP.value)


def _predictions(curve, network, shape, seqlen_per_gpu) -> pd.DataFrame:
    records = []
    for mask_name in map(canonical_name, workload.MASKS.value):
        params = _mask_params(mask_name)
        for cp in (int(c) for c in _CP.value):
            mask = make_mask(mask_name, seqlen_per_gpu * cp, seed=workload.MASK_SEED.value,
                             **params)
            for dispatch in workload.DISPATCH.value:
                for direction in workload.DIRECTIONS.value:
                    for strategy in _STRATEGIES.value:
                        found = predict(strategy, mask, cp, shape, curve, network,
                                        dispatch=dispatch, direction=direction,
                                        ulysses_size=_ULYSSES_SIZE.value,
                                        stages=_GROUPCAST_STAGES.value,
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
        fig.suptitle(f"{mask}, {direction}: predicted by lcab.model (a model)")
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


def _calibrated(paths: flags.FlagHolder, build: Callable):
    """build(paths, root): rows it cannot read stop the run with one line
    naming the flag that points elsewhere (no traceback, no help text)."""
    try:
        return build(paths.value, pathlib.Path(_RESULTS_ROOT.value))
    except calibration.NoCanonicalRun as exc:
        unmet = _unmet(exc.root) or [f"--{paths.name}=PATHS"]
        named = ", ".join(unmet[:-1]) + " and " + unmet[-1] if len(unmet) > 1 else unmet[0]
        raise SystemExit(f"{_PROGRAM}: {exc}; pass {named} with the rows to use, or "
                         "--results_root=DIR where canonical runs are") from None
    except calibration.CalibrationError as exc:
        raise SystemExit(f"{_PROGRAM}: --{paths.name}: {exc}") from None


def _unmet(root: pathlib.Path) -> list[str]:
    """The rows flags this run leaves to canonical runs that `root` lacks."""
    wanted = [_KERNEL_RESULTS, _COMM_RESULTS] + (
        [_VALIDATE_AGAINST] if _VALIDATE.value or _VALIDATE_AGAINST.value else [])
    return [f"--{holder.name}=PATHS" for holder in wanted if not holder.value
            and not any(canonical.newest(sweep, root) for sweep in _SWEEPS_READ[holder.name])]


def _header(curve, network, kernel_source, link_source, *others, warnings=()) -> str:
    """What the model was calibrated on, one line per part, then where its
    figures are extrapolated."""
    lines = ["Model (not a measurement), calibrated on:"]
    lines += [f"- {source.describe()}" for source in (kernel_source, link_source, *others)]
    given = [f"--{holder.name}={holder.value:g}" for holder in (_NVLINK_ALPHA_US, _NVLINK_GBPS)
             if holder.value is not None]
    if given:
        lines.append(f"- links inside a node: then {' and '.join(given)} for every collective")
    lines.append(f"- links between nodes: {network.inter.alpha_s * 1e6:.0f} us, "
                 f"{network.inter.beta_bytes_per_s / 1e9:.0f} GB/s per GPU (--inter_alpha_us, "
                 f"--inter_gbps; default: InfiniBand NDR's published figures), "
                 f"{network.gpus_per_node} GPUs per node")
    link_devices = {row.get("device") for row in link_source.rows}
    if link_devices and link_devices != {curve.device}:
        lines.append(f"- note: the kernel curve ran on {curve.device}, the links on "
                     f"{', '.join(sorted(map(str, link_devices)))}")
    lines += warnings
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    heads_q, heads_kv = parse_heads(workload.HEADS.value)
    head_dim, dtype = workload.HEAD_DIM.value, canonical_dtype(workload.DTYPE.value)
    shape = Shape(heads_q, heads_kv, head_dim, dtype)
    curve, kernel_source = _calibrated(_KERNEL_RESULTS, lambda paths, root: (
        calibration.kernel_curve(_KERNEL.value, head_dim=head_dim, dtype=dtype,
                                 directions=workload.DIRECTIONS.value, device=_DEVICE.value,
                                 paths=paths, root=root)))
    inter = AlphaBeta(_INTER_ALPHA_US.value * 1e-6, _INTER_GBPS.value * 1e9)
    # The links of the kernel's own framework: its strategies run its collectives.
    network, link_source = _calibrated(_COMM_RESULTS, lambda paths, root: calibration.links(
        framework=framework_of(_KERNEL.value), gpus_per_node=_GPUS_PER_NODE.value,
        inter=inter, paths=paths, root=root))
    network = _with_nvlink(network)
    others = []
    validate = _VALIDATE.value or bool(_VALIDATE_AGAINST.value)
    if validate:
        measured, measured_source = _calibrated(_VALIDATE_AGAINST, calibration.measured)
        others.append(measured_source)
    calls = CallLog(curve)
    frame = _predictions(calls, network, shape, parse_seqlen(_SEQLEN_PER_GPU.value))
    header = _header(curve, network, kernel_source, link_source, *others,
                     warnings=extrapolation_warnings(calls))
    print(header)
    print("\nCells: per-GPU TFLOP/s (compute / imbalance / exposed comm, ms)\n")
    print(to_markdown(_wide(frame)))
    if validate:
        checked = predicted_vs_measured(measured, networks_from_comm(
            measured, gpus_per_node=_GPUS_PER_NODE.value, inter=inter))
        print("\nModel against measured rows (a cp 1 row is left out of its own curve):\n")
        print(to_markdown(error_summary(checked)))
        print("\nModel against published figures (8k tokens per GPU):\n")
        print(to_markdown(against_published(
            curve, network, shape, directions=tuple(workload.DIRECTIONS.value)).set_index(
            ["mask", "direction", "published", "cp"])))
    if _OUT.value:
        out = pathlib.Path(_OUT.value)
        out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out / "predictions.csv", index=False)
        (out / "predictions.md").write_text(f"{header}\n\n{to_markdown(_wide(frame))}\n")
        if validate:
            checked.to_csv(out / "validation.csv", index=False)
        for path in _figures(frame, out):
            print(path, file=sys.stderr)


def console_main():
    """The lcab-model console script."""
    try:
        app.run(main)
    except BrokenPipeError:
        # A reader that stopped early (`| head`) is not a failure of the model;
        # point stdout at devnull so the exit's flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    console_main()
