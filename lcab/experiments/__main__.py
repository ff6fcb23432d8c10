"""python -m lcab.experiments: run a sweep, write JSONL rows, print a table.

    python -m lcab.experiments --flagfile=experiments/seed_kernels.flags --out out/seed

Settings not given come from a preset flagfile (lcab.experiments.presets:
experiments/cpu_smoke.flags without a GPU, experiments/seed_kernels.flags
with one). Without --backends, every registered backend that can run here
is used, except those too slow to set up for every sweep
(in_default_sweep, e.g. tokamax autotuning); naming unavailable ones, or
--record_unavailable, gives UNAVAILABLE rows instead. --framework=all runs
each framework in its own process (JAX and PyTorch fight over GPU memory)
and prints one table of their rows. --suite=comm times the CP strategies'
collectives alone.

A --flagfile named inside a flagfile is found relative to that file
(lcab.experiments.flagfiles), so any working directory will do.
--dry_run prints what the sweep would run and skip, and why, without
running it; --list_backends prints the registered backends and their claims.
The `lcab-run` console script is this command.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import pathlib
import secrets
import signal
import sys

from absl import app, logging
from absl import flags as absl_flags

from lcab import processes, registry, results
from lcab.comm import parse_bytes
from lcab.comm_suite import collective_cases
from lcab.experiments import backend_list, dry_run, flagfiles, launch, presets
from lcab.experiments import flags as cli
from lcab.experiments.sweep import Sweep, parse_heads, parse_seqlen, unique
from lcab.flops import TIMED_DIRECTIONS
from lcab.results import COMM_SUITE
from lcab.runner import Settings


def _apply_presets() -> None:
    """Every flag not given takes the preset flagfile's value, where it sets one."""
    try:
        preset = presets.current()
    except (FileNotFoundError, ValueError) as exc:
        raise app.UsageError(str(exc)) from exc
    try:
        for name, text in preset.items():
            absl_flags.FLAGS.set_default(name, text)
    except (ValueError, absl_flags.Error) as exc:
        raise app.UsageError(f"preset {presets.flagfile()}: {exc}") from exc


def _run_id() -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{secrets.token_hex(3)}"


@functools.cache  # one commit for every job of the run
def _git_commit() -> str:
    from lcab.provenance import named_commit

    return named_commit(cli.GIT_COMMIT.value)  # a ValueError: _jobs's caller says it


def _sweep(backends: list[str]) -> Sweep:
    return Sweep(
        backends=tuple(backends),
        masks=tuple(cli.MASKS.value),
        seqlens=tuple(parse_seqlen(s) for s in cli.SEQLENS.value),
        batch=cli.BATCH.value,
        heads=parse_heads(cli.HEADS.value),
        head_dim=cli.HEAD_DIM.value,
        dtype=cli.DTYPE.value,
        directions=tuple(d for d in TIMED_DIRECTIONS if d in cli.DIRECTIONS.value),
        suite=cli.SUITE.value,
        mask_seed=cli.MASK_SEED.value,
        window=cli.WINDOW.value,
        doc_distribution=cli.DOC_DISTRIBUTION.value,
        doc_sampler=cli.DOC_SAMPLER.value,
        doc_cap=cli.DOC_CAP.value,
        keeps=tuple(cli.parse_keep(k) for k in cli.KEEP.value or ()),
        sparse_blocks=tuple(cli.parse_block(b) for b in cli.SPARSE_BLOCK.value or ()),
    )


def _backend_options(backends: list[str]) -> tuple[tuple[str, str, str], ...]:
    """--cp_size and --dispatch as options of every CP backend, then
    --backend_options (which win, coming later)."""
    chosen = {"cp_size": cli.CP_SIZE.value,
              "dispatch": cli.DISPATCH.value[0] if cli.DISPATCH.value else None}
    cp = tuple((name, key, str(value)) for name in backends
               if registry.suite_of(name) in ("cp", "module")
               for key, value in chosen.items() if value is not None)
    return cp + tuple(cli.parse_backend_option(t) for t in cli.option_texts(
        cli.BACKEND_OPTIONS.value))


def _settings(run_id: str, record: dict, **overrides) -> Settings:
    return Settings(
        warmup=cli.WARMUP.value, iters=cli.ITERS.value, flush_l2=cli.FLUSH_L2.value,
        seed=cli.SEED.value, run_id=run_id,
        flags=json.dumps({"argv": " ".join(sys.argv[1:]), **record}),
        git_commit=_git_commit(), plugin_modules=tuple(cli.BACKEND_MODULES.value),
        isolate_timeout_s=cli.ISOLATE_TIMEOUT.value, golden_dir=cli.GOLDEN_DIR.value,
        profile_dir=cli.PROFILE_DIR.value, full_check=cli.FULL_CHECK.value,
        reference_cache=cli.REFERENCE_CACHE.value, **overrides)


def _attention_job(framework: str, backends: list[str], run_id: str) -> launch.Job:
    sweep = _sweep([b for b in backends if registry.framework_of(b) == framework])
    options = _backend_options(list(sweep.backends))
    record = {
        "backends": list(sweep.backends), "masks": list(sweep.masks),
        "seqlens": list(sweep.seqlens), "heads": list(sweep.heads),
        "head_dim": sweep.head_dim, "dtype": sweep.dtype, "window": sweep.window,
        "doc_distribution": sweep.doc_distribution, "doc_sampler": sweep.doc_sampler,
        "doc_cap": sweep.doc_cap, "keep": list(sweep.keeps),
        "sparse_block": list(sweep.sparse_blocks), "mask_seed": sweep.mask_seed,
        "backend_options": [list(o) for o in options],
    }
    return launch.Job(
        framework, sweep.suite, _rows_path(framework), tuple(sweep.cases()),
        _settings(run_id, record, backend_options=options), ranks=cli.CP_SIZE.value or 2,
        skip_unavailable=not cli.BACKENDS.value, record_unavailable=cli.RECORD_UNAVAILABLE.value)


def _comm_job(framework: str, run_id: str) -> launch.Job:
    ops = list(unique(cli.COMM_OPS.value))
    sizes = list(unique(parse_bytes(s) for s in cli.COMM_SIZES.value))
    ranks = list(unique(cli.parse_ranks(r) for r in cli.COMM_RANKS.value))
    record = {"ops": ops, "sizes": sizes, "ranks": ranks}
    return launch.Job(framework, COMM_SUITE, _rows_path(framework),
                      tuple(collective_cases(framework, ops, sizes, ranks)),
                      _settings(run_id, record), ranks=max(ranks))


def _rows_path(framework: str) -> pathlib.Path:
    return pathlib.Path(cli.OUT.value) / f"{cli.SUITE.value}_{framework}.jsonl"


def _jobs(run_id: str) -> list[launch.Job]:
    """One job per framework of the run, JAX and PyTorch first."""
    if cli.SUITE.value == COMM_SUITE:
        frameworks = cli.FRAMEWORKS if cli.FRAMEWORK.value == "all" else [cli.FRAMEWORK.value]
        return [_comm_job(framework, run_id) for framework in frameworks]
    backends = cli.BACKENDS.value or registry.backend_names(suite=cli.SUITE.value)
    if not backends:
        raise app.UsageError(f"no backends are registered for --suite={cli.SUITE.value} yet")
    present = {registry.framework_of(b) for b in backends}
    if cli.FRAMEWORK.value == "all":
        frameworks = [f for f in cli.FRAMEWORKS if f in present] + sorted(
            present - set(cli.FRAMEWORKS))
    else:
        frameworks = [cli.FRAMEWORK.value]
    return [_attention_job(framework, backends, run_id) for framework in frameworks]


def _run(jobs: list[launch.Job], run_id: str) -> bool:
    """Run every job where it belongs; False if any case's rows went missing."""
    if not launch.is_worker():  # the command the user started supervises
        return launch.supervise(jobs, sys.argv[1:], run_id, cli.RESUME.value)
    for job in jobs:
        launch.run_here(job, isolate=cli.ISOLATE.value, resume=cli.RESUME.value,
                        progress=cli.PROGRESS.value)
    return True


def _writable_folders() -> None:
    """--out, --golden_dir, --profile_dir and --reference_cache: folders this
    run can write, or a usage error naming the flag, the value and why,
    before anything runs."""
    for flag in (cli.OUT, cli.GOLDEN_DIR, cli.PROFILE_DIR, cli.REFERENCE_CACHE):
        if flag.value is None and flag is not cli.OUT:
            continue
        problem = launch.unwritable(flag.value)
        if problem:
            raise app.UsageError(f"--{flag.name}={flag.value!r}: {problem}")


def _stopped_message(jobs: list[launch.Job], run_id: str, signum: int) -> str:
    paths = [job.path for job in jobs if job.path.exists()]
    written = sum(row.get("run_id") == run_id for row in results.read_rows(paths))
    where = ", ".join(map(str, paths)) or str(cli.OUT.value)
    argv = " ".join(a for a in sys.argv[1:] if a.lstrip("-") not in ("resume", "noresume"))
    return (f"lcab.experiments: stopped by {signal.Signals(signum).name}; {written} rows of "
            f"this run are in {where}.\nTo go on where it stopped: python -m lcab.experiments "
            f"{argv} --resume")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    launch.stop_on_sigterm()
    if processes.supervised():
        processes.die_with_parent()  # also under torchrun, whose workers we are
    _apply_presets()
    launch.prepare_jax(
        cli.SUITE.value,
        max([cli.CP_SIZE.value or 2, *(cli.parse_ranks(r) for r in cli.COMM_RANKS.value)]),
        processes.jax_setting(cli.JAX_COORDINATOR.value, cli.JAX_NUM_PROCESSES.value,
                              cli.JAX_PROCESS_ID.value, cli.JAX_DISTRIBUTED_AUTO.value))
    if cli.LIST_BACKENDS.value:
        _list_backends()
        return
    run_id = cli.RUN_ID.value or _run_id()
    writes = not cli.DRY_RUN.value
    if writes and not processes.supervised():  # a supervised worker's parent checked them
        _writable_folders()
    lock = None
    if writes and not launch.is_worker():
        try:
            lock = launch.lock_out(pathlib.Path(cli.OUT.value), run_id)
        except launch.Busy as exc:
            logging.error("%s", exc)
            sys.exit(1)
    try:
        jobs = _jobs(run_id)
    except ValueError as exc:  # valid flags that make no workload
        raise app.UsageError(str(exc)) from exc
    except MemoryError as exc:  # masks too large for this host (block-sparse at 16m)
        raise app.UsageError(f"the sweep's masks do not fit in this host's memory: {exc}") from exc
    if cli.DRY_RUN.value:
        if not launch.launched_rank():  # one process of a launched run speaks
            print(dry_run.text(jobs, cli.RESUME.value))
        return
    try:
        all_ok = _run(jobs, run_id)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (launch.Stopped)
        _stopped(jobs, run_id, launch.stop_signal(stop))
    if cli.SUMMARY.value and not launch.launched_rank():
        from lcab.report.summary import summary_text  # pandas, only where a table is printed

        written = [job.path for job in jobs if job.path.exists()]
        print()
        with results.skipped_rows_told_once():
            print(summary_text(written, run_id=None if cli.RESUME.value else run_id))
        if written:
            print(f"\nrows: {', '.join(map(str, written))}")
    del lock  # held to the end of the run
    if not all_ok:
        sys.exit(1)


def _list_backends() -> None:
    """--list_backends: of --framework, and of --suite where it is given."""
    suite = cli.SUITE.value if absl_flags.FLAGS[cli.SUITE.name].present else None
    options = tuple(cli.parse_backend_option(t) for t in cli.option_texts(
        cli.BACKEND_OPTIONS.value))
    print(backend_list.text(cli.FRAMEWORK.value, suite, options))


def _stopped(jobs: list[launch.Job], run_id: str, signum: int) -> None:
    """End a stopped run: the supervisor says what was written and how to go
    on; a worker ends quietly (its supervisor speaks)."""
    if not processes.supervised() and not launch.launched_rank():
        logging.warning("%s", _stopped_message(jobs, run_id, signum))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)  # no exit handlers: a framework's may trace on an interrupt


def console_main() -> None:
    """`python -m lcab.experiments` and the `lcab-run` console script; nested
    --flagfile paths are taken relative to the flagfile naming them."""
    app.run(main, flags_parser=flagfiles.parse_flags)


if __name__ == "__main__":
    console_main()
