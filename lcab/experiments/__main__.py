"""python -m lcab.experiments: run a sweep, write JSONL rows, print a table.

    python -m lcab.experiments --flagfile=experiments/seed_kernels.flags --out out/seed

Settings not given fall back to lcab.experiments.presets (a two-minute CPU
sweep without a GPU, the seed's kernel sweep with one). Without --backends,
every registered backend that can run here is used, except those too slow
to set up for every sweep (in_default_sweep, e.g. tokamax autotuning);
naming unavailable ones gives UNAVAILABLE rows instead. --framework=all runs
each framework in its own process (JAX and PyTorch fight over GPU memory)
and merges their rows into one table.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import secrets
import subprocess
import sys

from absl import app, flags

from lcab import processes, registry, results
from lcab.comm import COMM_OPS, check_op, parse_bytes
from lcab.cp import DISPATCH_NAMES
from lcab.flops import TIMED_DIRECTIONS
from lcab.experiments import presets
from lcab.experiments.sweep import Sweep, parse_heads, parse_seqlen
from lcab.masks import MASK_NAMES, canonical_name
from lcab.masks.doc_lengths import DISTRIBUTIONS
from lcab.runner import Settings, fill_missing, import_plugins, run_cases
from lcab.workloads import DTYPES, canonical_dtype

FRAMEWORKS = ("jax", "torch")
# Frameworks whose CP suite runs one process per rank (torchrun); JAX runs
# one process per host with every local device in it.
PROCESS_PER_RANK = ("torch",)

_FRAMEWORK = flags.DEFINE_enum(
    "framework", "all", [*FRAMEWORKS, "all"],
    "Which framework's backends to run; 'all' runs each in its own process.")
COMM_SUITE = "comm"  # collectives alone (lcab.comm), not attention backends
_SUITE = flags.DEFINE_enum(
    "suite", "kernel", [*registry.SUITES, COMM_SUITE],
    "Kernel or CP suite of attention backends, or comm: the CP strategies' collectives.")
_BACKENDS = flags.DEFINE_list(
    "backends", None, "Full backend names (e.g. jax.xla,torch.sdpa_math); default: all of "
    "the suite and framework.")
_MASKS = flags.DEFINE_list("masks", None, f"Mask families: {', '.join(MASK_NAMES)}.")
_SEQLENS = flags.DEFINE_list("seqlens", None, "Sequence lengths, e.g. 4k,8k,128k,1m.")
_BATCH = flags.DEFINE_integer("batch", 1, "Batch size.", lower_bound=1)
_HEADS = flags.DEFINE_string("heads", None, "Query:KV heads, e.g. 64:8.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", None, "Head dimension.", lower_bound=1)
_DTYPE = flags.DEFINE_string("dtype", None, f"One of {', '.join(DTYPES)} (or bf16, fp16, fp32).")
_DIRECTIONS = flags.DEFINE_list(
    "directions", ["fwd", "bwd"], "Directions to time: fwd, bwd (bwd = fwd+bwd - fwd).")
_WARMUP = flags.DEFINE_integer("warmup", None, "Untimed calls before timing.", lower_bound=0)
_ITERS = flags.DEFINE_integer("iters", None, "Timed repeats.", lower_bound=1)
_OUT = flags.DEFINE_string("out", "out", "Directory for the run's JSONL rows.")
_RESUME = flags.DEFINE_bool(
    "resume", False,
    "Skip rows already in the output files (ERROR and UNAVAILABLE rows are measured again).")
_ISOLATE = flags.DEFINE_bool(
    "isolate", False, "Run each case in a child process (a crash loses one case).")
_ISOLATE_TIMEOUT = flags.DEFINE_float(
    "isolate_timeout", 1800.0, "With --isolate, kill a case running longer (seconds).",
    lower_bound=1.0)
_WINDOW = flags.DEFINE_integer("window", None, "Window for sliding-window masks.", lower_bound=0)
_DOC_DISTRIBUTION = flags.DEFINE_enum(
    "doc_distribution", None, list(DISTRIBUTIONS), "Document-length histogram.")
_MASK_SEED = flags.DEFINE_integer("mask_seed", 0, "Seed of random mask parameters.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random inputs.")
_FLUSH_L2 = flags.DEFINE_bool("flush_l2", True, "Rewrite 256 MiB between repeats on GPU.")
_BACKEND_MODULES = flags.DEFINE_list(
    "backend_modules", [], "Extra modules to import that register backends (plugins).")
_GIT_COMMIT = flags.DEFINE_string(
    "git_commit", None, "Commit to record when the tree is not a git checkout.")
_BACKEND_OPTIONS = flags.DEFINE_multi_string(
    "backend_options", [],
    "Constructor options of a backend, BACKEND:KEY=VALUE (repeat or comma-separate), e.g. "
    "jax.pallas_flex:block_k=128. Each backend lists its options in the error of a bad one.")
_CP_SIZE = flags.DEFINE_integer(
    "cp_size", None, "Context-parallel size of every --suite=cp backend, and of jax.module's CP inner "
    "strategy (default 2).",
    lower_bound=1)
_DISPATCH = flags.DEFINE_enum(
    "dispatch", None, list(DISPATCH_NAMES),
    "How --suite=cp backends assign tokens to ranks (default zigzag).")
_GOLDEN_DIR = flags.DEFINE_string(
    "golden_dir", None,
    "Keep golden data here: the first run of a workload saves its inputs, outputs and "
    "gradients (orbax); later runs, of either framework, run on those inputs and are compared "
    "with them (golden_err column).")
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", None,
    "After timing each case, run it once more under the framework's profiler and write the "
    "trace here (one folder per case); python -m lcab.trace_overlap reads how much "
    "communication the compute hid.")
_JAX_COORDINATOR = flags.DEFINE_string(
    "jax_coordinator", None, "Multi-process JAX: the coordinator's host:port (process 0's).")
_JAX_NUM_PROCESSES = flags.DEFINE_integer(
    "jax_num_processes", None, "Multi-process JAX: how many processes.", lower_bound=1)
_JAX_PROCESS_ID = flags.DEFINE_integer(
    "jax_process_id", None, "Multi-process JAX: this process's index.", lower_bound=0)
_JAX_DISTRIBUTED_AUTO = flags.DEFINE_bool(
    "jax_distributed_auto", False,
    "Multi-process JAX with jax.distributed's own detection (SLURM, Open MPI).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")
_SUMMARY = flags.DEFINE_bool("summary", True, "Print the comparison table at the end.")
_RUN_ID = flags.DEFINE_string("run_id", None, "Identifier written into every row.")
_COMM_OPS = flags.DEFINE_list(
    "comm_ops", list(COMM_OPS), f"--suite=comm: collectives to time ({', '.join(COMM_OPS)}).")
_COMM_SIZES = flags.DEFINE_list(
    "comm_sizes", ["4k", "64k", "1m", "4m", "16m", "64m", "256m"],
    "--suite=comm: bytes per rank (nccl-tests' sizes: all_gather's is its output).")
_COMM_RANKS = flags.DEFINE_list(
    "comm_ranks", ["2"], "--suite=comm: device counts to time each collective over.")


# ----- validation at parse time: bad flags fail before anything runs --------
def _check(values, parse):
    for value in values or []:
        parse(value)
    return True


def _parse_direction(text):
    if text not in TIMED_DIRECTIONS:
        raise ValueError(f"direction {text!r} is not one of {', '.join(TIMED_DIRECTIONS)}")
    return text


def _validator(flag_name, parse):
    def check(values):
        try:
            return _check(values if isinstance(values, list) else [values], parse)
        except ValueError as exc:
            raise flags.ValidationError(str(exc)) from exc

    flags.register_validator(flag_name, lambda v: v is None or check(v))


_validator("masks", canonical_name)
_validator("seqlens", parse_seqlen)
_validator("heads", parse_heads)
_validator("dtype", canonical_dtype)
_validator("directions", _parse_direction)
_validator("comm_ops", check_op)
_validator("comm_sizes", parse_bytes)


def _parse_ranks(text):
    if not text.isdigit() or int(text) < 2:
        raise ValueError(f"--comm_ranks {text!r} is not a device count of 2 or more")
    return int(text)


_validator("comm_ranks", _parse_ranks)


@flags.multi_flags_validator(["backends", "backend_modules"])
def _check_backends(values):
    try:
        import_plugins(values["backend_modules"] or [])
    except ImportError as exc:
        raise flags.ValidationError(f"--backend_modules: {exc}") from exc
    for name in values["backends"] or []:
        try:
            registry.check_backend_name(name)
        except ValueError as exc:
            raise flags.ValidationError(str(exc)) from exc
    return True


def _option_texts(values) -> list[str]:
    """Every BACKEND:KEY=VALUE of repeated and comma-separated flags."""
    return [t.strip() for value in values or [] for t in value.split(",") if t.strip()]


def parse_backend_option(text: str) -> tuple[str, str, str]:
    """"BACKEND:KEY=VALUE" -> (backend, key, value), checked against the
    backend's declared options where its class imports here."""
    name, _, assignment = text.partition(":")
    key, equals, value = assignment.partition("=")
    if not (name and key and equals):
        raise ValueError(f"--backend_options {text!r} is not BACKEND:KEY=VALUE")
    registry.check_backend_name(name)
    try:
        cls = registry.all_backends()[name].load()
    except Exception:  # noqa: BLE001 - its rows will say UNAVAILABLE; nothing to check here
        return name, key, value
    # Constructing checks the values too (a dispatch or inner kernel that
    # does not exist), so a bad option fails here, not as UNAVAILABLE rows.
    options = cls.parse_options({key: value})
    try:
        cls(**options)
    except ValueError:
        raise
    except Exception:  # noqa: BLE001 - cannot start here; its rows will say why
        pass
    return name, key, value


@flags.multi_flags_validator(["backend_options", "backend_modules"])
def _check_backend_options(values):
    try:
        import_plugins(values["backend_modules"] or [])
        for text in _option_texts(values["backend_options"]):
            parse_backend_option(text)
    except (ImportError, ValueError) as exc:
        raise flags.ValidationError(str(exc)) from exc
    return True


@flags.multi_flags_validator(
    ["jax_coordinator", "jax_num_processes", "jax_process_id", "jax_distributed_auto"])
def _check_jax_processes(values):
    try:
        processes.jax_setting(values["jax_coordinator"], values["jax_num_processes"],
                              values["jax_process_id"], values["jax_distributed_auto"])
    except ValueError as exc:
        raise flags.ValidationError(str(exc)) from exc
    return True


# ----- settings -------------------------------------------------------------
def _resolved(flag, preset_key):
    """The flag's value if given (command line or flagfile), else the preset's."""
    if flag.present or preset_key not in presets.current():
        return flag.value
    return presets.current()[preset_key]


def _sweep(framework: str | None) -> Sweep:
    backends = _BACKENDS.value or registry.backend_names(suite=_SUITE.value)
    if framework:
        backends = [b for b in backends if registry.framework_of(b) == framework]
    return Sweep(
        backends=tuple(backends),
        masks=tuple(_resolved(_MASKS, "masks")),
        seqlens=tuple(parse_seqlen(s) for s in _resolved(_SEQLENS, "seqlens")),
        batch=_BATCH.value,
        heads=parse_heads(_resolved(_HEADS, "heads")),
        head_dim=_resolved(_HEAD_DIM, "head_dim"),
        dtype=_resolved(_DTYPE, "dtype"),
        directions=tuple(d for d in TIMED_DIRECTIONS if d in _DIRECTIONS.value),
        suite=_SUITE.value,
        mask_seed=_MASK_SEED.value,
        window=_resolved(_WINDOW, "window"),
        doc_distribution=_resolved(_DOC_DISTRIBUTION, "doc_distribution"),
    )


def _output_path(framework: str) -> pathlib.Path:
    return pathlib.Path(_OUT.value) / f"{_SUITE.value}_{framework}.jsonl"


def _settings(sweep: Sweep, run_id: str) -> Settings:
    record = {
        "argv": " ".join(sys.argv[1:]),
        "backends": list(sweep.backends), "masks": list(sweep.masks),
        "seqlens": list(sweep.seqlens), "heads": list(sweep.heads),
        "head_dim": sweep.head_dim, "dtype": sweep.dtype, "window": sweep.window,
        "doc_distribution": sweep.doc_distribution, "mask_seed": sweep.mask_seed,
        "backend_options": [list(o) for o in _cp_options(sweep)]
        + [list(parse_backend_option(t)) for t in _option_texts(_BACKEND_OPTIONS.value)],
    }
    return Settings(
        warmup=_resolved(_WARMUP, "warmup"),
        iters=_resolved(_ITERS, "iters"),
        flush_l2=_FLUSH_L2.value,
        seed=_SEED.value,
        run_id=run_id,
        flags=json.dumps(record),
        git_commit=_GIT_COMMIT.value or _git_commit(),
        plugin_modules=tuple(_BACKEND_MODULES.value),
        isolate_timeout_s=_ISOLATE_TIMEOUT.value,
        golden_dir=_GOLDEN_DIR.value,
        profile_dir=_PROFILE_DIR.value,
        backend_options=_cp_options(sweep) + tuple(
            parse_backend_option(t) for t in _option_texts(_BACKEND_OPTIONS.value)),  # these win
    )


def _cp_options(sweep: Sweep) -> tuple[tuple[str, str, str], ...]:
    """--cp_size and --dispatch, as options of every CP backend of the sweep."""
    chosen = {"cp_size": _CP_SIZE.value, "dispatch": _DISPATCH.value}
    return tuple(
        (name, key, str(value))
        for name in sweep.backends if registry.suite_of(name) in ("cp", "module")
        for key, value in chosen.items() if value is not None
    )


def _host_devices_for_cp() -> None:
    """Without a GPU, JAX's CP backends run on host devices, made from
    XLA_FLAGS before JAX starts (the flag is read once, when it does)."""
    if _SUITE.value not in ("cp", "module", COMM_SUITE) or presets.has_gpu() or "device_count" in \
            os.environ.get("XLA_FLAGS", ""):
        return
    wanted = max([_CP_SIZE.value or 2, *(_parse_ranks(r) for r in _COMM_RANKS.value)])
    count = f"--xla_force_host_platform_device_count={max(8, wanted)}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {count}".strip()


def _git_commit() -> str:
    from lcab.provenance import git_commit

    return git_commit()


# ----- running --------------------------------------------------------------
def _available_only(sweep: Sweep) -> Sweep:
    """Without --backends, run what can run here and say what was left out."""
    if _BACKENDS.value:
        return sweep
    usable = []
    for name in sweep.backends:
        try:
            backend = registry.load_backend(name)
        except registry.Unavailable as exc:
            print(f"skipping {name}: {exc}", file=sys.stderr)
            continue
        if backend.in_default_sweep:
            usable.append(name)
        else:
            print(f"skipping {name}: runs only when named in --backends", file=sys.stderr)
    return dataclasses.replace(sweep, backends=tuple(usable))


def _launched_rank() -> int | None:
    """This process's index in a multi-process run (torchrun's or JAX's), else None."""
    rank = processes.torchrun_rank()
    return processes.jax_process_index() if rank is None else rank


def _needs_launcher(framework: str) -> bool:
    return (framework in PROCESS_PER_RANK and _SUITE.value == "cp"
            and processes.torchrun_rank() is None)


def _launch_ranks(framework: str, run_id: str, ranks: int | None = None
                  ) -> tuple[pathlib.Path, bool]:
    """Run this command again under torchrun, one process per rank on this
    host (multi-node runs call torchrun themselves: experiments/slurm_torch_cp.sh)."""
    argv = _without_flags(sys.argv[1:], valued=("framework", "run_id"), boolean=("summary",))
    ranks = ranks or _CP_SIZE.value or 2
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={ranks}", "-m", "lcab.experiments", *argv,
               f"--framework={framework}", f"--run_id={run_id}", "--nosummary"]
    status = subprocess.run(command).returncode
    path = _output_path(framework)
    if status != 0:
        print(f"lcab.experiments: torchrun ({ranks} ranks) exited with {status}",
              file=sys.stderr)
        if _SUITE.value == COMM_SUITE:  # no cases to mark: the rows written stand
            return path, False
        sweep = _sweep(framework)
        fill_missing(sweep.cases(), results.Writer(path), _settings(sweep, run_id),
                     reason=f"torchrun ({ranks} ranks) exited with {status} before this case")
    return path, status == 0


def _run_framework(framework: str, run_id: str) -> tuple[pathlib.Path, bool]:
    if _needs_launcher(framework):
        return _launch_ranks(framework, run_id)
    sweep = _available_only(_sweep(framework))
    path = _output_path(framework)
    cases = sweep.cases()
    skip = results.done_keys([path], settled_only=True) if _RESUME.value else set()
    rank = _launched_rank()
    writer = results.Writer(path) if not rank else results.DiscardingWriter()
    bar = None
    if _PROGRESS.value and cases and not rank:
        from tqdm import tqdm

        bar = tqdm(total=len(cases), unit="case", desc=f"{framework} {sweep.suite}")
    run_cases(
        cases, writer, _settings(sweep, run_id), isolate=_ISOLATE.value, skip=skip,
        progress=(lambda case: bar.update(1)) if bar else None,
    )
    if bar:
        bar.close()
    return path, True


def _run_comm(framework: str, run_id: str) -> tuple[pathlib.Path, bool]:
    """--suite=comm: the collectives alone, rows in comm_<framework>.jsonl."""
    from lcab.comm_suite import CommSweep, run_comm

    path = _output_path(framework)
    writer = results.Writer(path) if not _launched_rank() else results.DiscardingWriter()
    sweep = CommSweep(
        ops=tuple(_COMM_OPS.value), sizes=tuple(parse_bytes(s) for s in _COMM_SIZES.value),
        ranks=tuple(_parse_ranks(r) for r in _COMM_RANKS.value),
        warmup=max(1, _resolved(_WARMUP, "warmup")), iters=_resolved(_ITERS, "iters"))
    record = json.dumps({"argv": " ".join(sys.argv[1:]), "ops": list(sweep.ops),
                         "sizes": list(sweep.sizes), "ranks": list(sweep.ranks)})
    run_comm(framework, sweep, writer.write, git_commit=_GIT_COMMIT.value or _git_commit(),
             run_id=run_id, flags=record)
    return path, True


def _without_flags(argv: list[str], valued: tuple[str, ...], boolean: tuple[str, ...]):
    """argv minus the named flags: --name=value and --name value for valued
    flags, --name, --noname and --name=... for boolean ones."""
    kept, skip_next = [], False
    for arg in argv:
        if skip_next:
            skip_next = False
            continue
        flag = arg.lstrip("-").split("=", 1)[0] if arg.startswith("-") else None
        if flag in valued:
            skip_next = "=" not in arg
            continue
        if flag in boolean or (flag and flag.startswith("no") and flag[2:] in boolean):
            continue
        kept.append(arg)
    return kept


def _run_children(frameworks, run_id: str) -> tuple[list[pathlib.Path], bool]:
    """One process per framework, sharing the command line and the run id.

    A process that fails leaves ERROR rows for every case it did not write,
    so the table shows the loss instead of a missing column.
    """
    argv = _without_flags(sys.argv[1:], valued=("framework", "run_id"), boolean=("summary",))
    paths, all_ok = [], True
    for framework in frameworks:
        command = [sys.executable, "-m", "lcab.experiments", *argv,
                   f"--framework={framework}", f"--run_id={run_id}", "--nosummary"]
        status = subprocess.run(command).returncode
        path = _output_path(framework)
        if status != 0:
            all_ok = False
            print(f"lcab.experiments: the {framework} process exited with {status}",
                  file=sys.stderr)
            sweep = _sweep(framework)
            fill_missing(sweep.cases(), results.Writer(path), _settings(sweep, run_id),
                         reason=f"the {framework} process exited with {status} before this case")
        paths.append(path)
    return paths, all_ok


def _print_summary(paths, run_id: str, resume: bool) -> None:
    from lcab import report

    existing = [p for p in paths if p.exists()]
    if not existing:
        print("no results were written")
        return
    frame = results.load(existing)
    if not resume:
        frame = frame[frame["run_id"] == run_id]
    print()
    print(report.short_table(frame))
    print(f"\nrows: {', '.join(str(p) for p in existing)}")


def _print_comm_summary(paths) -> None:
    from lcab.report import comm_table, to_markdown

    existing = [p for p in paths if p.exists()]
    print()
    print(to_markdown(comm_table(results.read_rows(existing))) if existing else "no rows")
    print(f"\nrows: {', '.join(str(p) for p in existing)}")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    _host_devices_for_cp()
    setting = processes.jax_setting(_JAX_COORDINATOR.value, _JAX_NUM_PROCESSES.value,
                                    _JAX_PROCESS_ID.value, _JAX_DISTRIBUTED_AUTO.value)
    if setting:  # read by the JAX runtime, in this process or the JAX child
        os.environ[processes.JAX_DISTRIBUTED] = setting
    run_id = _RUN_ID.value or (
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        + "-" + secrets.token_hex(3)
    )
    if _SUITE.value == COMM_SUITE:
        frameworks = FRAMEWORKS if _FRAMEWORK.value == "all" else (_FRAMEWORK.value,)
        done = [_launch_ranks(f, run_id, max(_parse_ranks(r) for r in _COMM_RANKS.value))
                if f in PROCESS_PER_RANK and processes.torchrun_rank() is None
                else _run_comm(f, run_id) for f in frameworks]
        if _SUMMARY.value and not _launched_rank():
            _print_comm_summary([path for path, _ in done])
        if not all(ok for _, ok in done):
            sys.exit(1)
        return
    backends = _BACKENDS.value or registry.backend_names(suite=_SUITE.value)
    if not backends:
        raise app.UsageError(f"no backends are registered for --suite={_SUITE.value} yet")
    if _FRAMEWORK.value == "all":
        wanted = [f for f in FRAMEWORKS if any(registry.framework_of(b) == f for b in backends)]
        others = sorted({registry.framework_of(b) for b in backends} - set(FRAMEWORKS))
        paths, all_ok = _run_children(wanted, run_id)
        # Host-only plugin frameworks (e.g. numpy) need no process of their own.
        paths += [_run_framework(f, run_id)[0] for f in others]
    else:
        path, all_ok = _run_framework(_FRAMEWORK.value, run_id)
        paths = [path]
    if _SUMMARY.value and not _launched_rank():
        _print_summary(paths, run_id, _RESUME.value)
    if not all_ok:
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
