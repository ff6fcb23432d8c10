"""Where a run's cases execute: in this process, in one child process per
framework (JAX and PyTorch fight over GPU memory), or in torchrun's
processes, one per rank; and what JAX must find in its environment before
it starts (host devices, jax.distributed).

A process that dies leaves ERROR rows for the cases it did not write, so
the table shows the loss instead of a missing column, and the run fails.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys
from collections.abc import Sequence

from lcab import processes, registry, results
from lcab.experiments import presets
from lcab.results import COMM_SUITE
from lcab.runner import Settings, fill_missing, run_cases

# Frameworks whose CP and comm suites run one process per rank (torchrun);
# JAX runs one process per host with every local device in it.
PROCESS_PER_RANK = ("torch",)
PER_RANK_SUITES = ("cp", COMM_SUITE)
# Suites whose JAX side needs several devices: host devices stand in without a GPU.
MULTI_DEVICE_SUITES = ("cp", "module", COMM_SUITE)
# Flags a child process gets from its parent rather than from the command line.
_PARENT_ONLY_VALUED = ("framework", "run_id")
_PARENT_ONLY_BOOLEAN = ("summary",)


@dataclasses.dataclass(frozen=True)
class Job:
    """One framework's share of a run: what it runs, how, and where its rows go."""

    framework: str
    suite: str
    path: pathlib.Path
    cases: tuple
    settings: Settings
    ranks: int  # processes torchrun starts for a per-rank suite
    skip_unavailable: bool = False  # leave out backends that cannot run here


def prepare_jax(suite: str, devices_wanted: int, distributed: str | None) -> None:
    """Set what JAX reads once, when it starts, in this process and its children.

    Without a GPU, JAX's multi-device suites run on host devices
    (--xla_force_host_platform_device_count). A multi-process JAX run
    reaches the JAX runtime through processes.JAX_DISTRIBUTED.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if suite in MULTI_DEVICE_SUITES and not presets.has_gpu() and "device_count" not in flags:
        count = f"--xla_force_host_platform_device_count={max(8, devices_wanted)}"
        os.environ["XLA_FLAGS"] = f"{flags} {count}".strip()
    if distributed:
        os.environ[processes.JAX_DISTRIBUTED] = distributed


def launched_rank() -> int | None:
    """This process's index in a multi-process run (torchrun's or JAX's), else None."""
    rank = processes.torchrun_rank()
    return processes.jax_process_index() if rank is None else rank


def needs_torchrun(job: Job) -> bool:
    return (job.framework in PROCESS_PER_RANK and job.suite in PER_RANK_SUITES
            and processes.torchrun_rank() is None)


def run_here(job: Job, *, isolate: bool, resume: bool, progress: bool) -> None:
    """Run the job's cases in this process (rank 0 of a multi-process run writes)."""
    cases = _available(job.cases) if job.skip_unavailable else list(job.cases)
    skip = results.done_keys([job.path], settled_only=True) if resume else set()
    rank = launched_rank()
    writer = results.Writer(job.path) if not rank else results.DiscardingWriter()
    bar = None
    if progress and cases and not rank:
        from tqdm import tqdm

        bar = tqdm(total=len(cases), unit="case", desc=f"{job.framework} {job.suite}")
    run_cases(cases, writer, job.settings, isolate=isolate, skip=skip,
              progress=(lambda case: bar.update(1)) if bar else None)
    if bar:
        bar.close()


def run_under_torchrun(job: Job, argv: Sequence[str], run_id: str) -> bool:
    """Run this command again under torchrun, one process per rank on this
    host (multi-node runs call torchrun themselves: experiments/slurm_torch_cp.sh)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={job.ranks}", "-m", "lcab.experiments",
               *_child_argv(argv, job.framework, run_id)]
    return _ran(job, command, f"torchrun ({job.ranks} ranks)")


def run_children(jobs: Sequence[Job], argv: Sequence[str], run_id: str) -> bool:
    """One process per framework, sharing the command line and the run id."""
    done = [_ran(job, [sys.executable, "-m", "lcab.experiments",
                       *_child_argv(argv, job.framework, run_id)],
                 f"the {job.framework} process") for job in jobs]
    return all(done)


def _ran(job: Job, command: list[str], what: str) -> bool:
    status = subprocess.run(command).returncode
    if status != 0:
        print(f"lcab.experiments: {what} exited with {status}", file=sys.stderr)
        fill_missing(job.cases, results.Writer(job.path), job.settings,
                     reason=f"{what} exited with {status} before this case")
    return status == 0


def _child_argv(argv: Sequence[str], framework: str, run_id: str) -> list[str]:
    kept = without_flags(argv, valued=_PARENT_ONLY_VALUED, boolean=_PARENT_ONLY_BOOLEAN)
    return [*kept, f"--framework={framework}", f"--run_id={run_id}", "--nosummary"]


def without_flags(argv: Sequence[str], valued: tuple[str, ...], boolean: tuple[str, ...]):
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


def _available(cases: Sequence) -> list:
    """Without --backends, run what can run here and say what was left out."""
    usable = {}
    for name in dict.fromkeys(case.backend for case in cases):
        try:
            backend = registry.load_backend(name)
        except registry.Unavailable as exc:
            print(f"skipping {name}: {exc}", file=sys.stderr)
            continue
        if backend.in_default_sweep:
            usable[name] = True
        else:
            print(f"skipping {name}: runs only when named in --backends", file=sys.stderr)
    return [case for case in cases if case.backend in usable]
