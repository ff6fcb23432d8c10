"""Where a run's cases execute, and what watches over them.

The command the user starts runs no case itself: it supervises. It holds
the output folder's lock (a second run into the same folder is refused),
starts one process per framework (JAX and PyTorch fight over GPU memory;
torchrun's processes, one per rank, for PyTorch's CP and comm suites),
waits for each, and when one ends it compares the rows that process wrote
for this run with the plan the process left (PLAN): every planned row
that is missing becomes an ERROR row and the run exits non-zero, however
the process ended (a crash, os._exit, sys.exit(0)). A supervised process
dies with its parent (processes.die_with_parent), so a killed run leaves
no orphan writing rows. Ctrl-C (or SIGTERM) stops the run cleanly: the
children stop, nothing is filled in, and the command says what was written
and how to resume (exit 128 + the signal's number, 130 for Ctrl-C).

Processes of a multi-process run started by a launcher (srun, mpirun,
torchrun) run their cases where they are, as does a supervised process.
This module also sets what JAX must find in its environment before it
starts (host devices, jax.distributed).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from absl import logging

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
LOCK_NAME = ".lcab.lock"  # in the output folder, held by the supervising command
_STOP_GRACE_S = 30.0  # an interrupted child gets this long to stop before it is killed


class Stopped(KeyboardInterrupt):
    """The run was asked to stop (Ctrl-C: SIGINT, or SIGTERM)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# A child's exit status when a stop ended it: 128 + the signal from our
# workers, minus the signal from a process the signal killed outright.
_STOPPED_BY = {code: signum for signum in (signal.SIGINT, signal.SIGTERM)
               for code in (128 + signum, -signum)}


def stop_signal(stop: KeyboardInterrupt) -> int:
    """The signal behind a stop: Stopped's, or SIGINT for Python's own Ctrl-C."""
    return getattr(stop, "signum", signal.SIGINT)


def stop_on_sigterm() -> None:
    """SIGTERM stops the run the way Ctrl-C does (no traceback, clean exit)."""
    def stop(signum, frame):
        raise Stopped(signum)

    signal.signal(signal.SIGTERM, stop)


def is_worker() -> bool:
    """Whether this process runs cases itself: one the CLI supervises, or a
    rank of a multi-process run."""
    return processes.supervised() or launched_rank() is not None


class Busy(Exception):
    """Another run holds the output folder."""


def lock_out(folder: pathlib.Path, run_id: str):
    """Hold `folder`'s lock for this run (an open file; the lock goes when
    the process ends, however it ends). Raises Busy, naming the holder,
    when another run has it: two runs writing one folder would measure the
    same cases twice."""
    path = folder / LOCK_NAME
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another run"
        handle.close()
        raise Busy(f"{folder} is in use by {holder}; wait for it to end or choose another "
                   f"--out") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"lcab.experiments run {run_id} (pid {os.getpid()})\n")
    handle.flush()
    return handle


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
    # ... except those a default sweep runs where they can: they write
    # UNAVAILABLE rows saying why (--record_unavailable)
    record_unavailable: bool = False

    @property
    def per_rank(self) -> bool:
        """Whether torchrun runs this job, one process per rank (whose
        backends decide under torchrun what they can run)."""
        return self.framework in PROCESS_PER_RANK and self.suite in PER_RANK_SUITES


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


def unwritable(folder: str | None) -> str | None:
    """Why this run cannot write into `folder` (creating it if need be), or
    None when it can: checked before the first case, not after it."""
    if not folder:
        return "empty; name a folder (e.g. --out=out)"
    path = pathlib.Path(folder)
    if path.exists() and not path.is_dir():
        return "exists and is not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".lcab-probe-"):
            pass
    except OSError as exc:
        return f"cannot write there: {exc.strerror or exc}"
    return None


def run_here(job: Job, *, isolate: bool, resume: bool, progress: bool) -> None:
    """Run the job's cases in this process (rank 0 of a multi-process run writes)."""
    cases = (_available(job.cases, job.record_unavailable) if job.skip_unavailable
             else list(job.cases))
    skip = results.done_keys([job.path], settled_only=True) if resume else set()
    rank = launched_rank()
    if not rank:
        _write_plan(cases, job.settings, skip)
    writer = results.Writer(job.path) if not rank else results.DiscardingWriter()
    bar = None
    if progress and cases and not rank:
        from tqdm import tqdm

        bar = tqdm(total=len(cases), unit="case", desc=f"{job.framework} {job.suite}")
    run_cases(cases, writer, job.settings, isolate=isolate, skip=skip,
              progress=(lambda case: bar.update(1)) if bar else None)
    if bar:
        bar.close()


def _write_plan(cases: Sequence, settings: Settings, skip: set[tuple]) -> None:
    """Tell the supervising parent (PLAN) which rows this process will write."""
    path = os.environ.get(processes.PLAN)
    if not path:
        return
    keys = [key for case in cases for key in case.keys(case.options(settings))
            if key not in skip]
    pathlib.Path(path).write_text(json.dumps(keys))


def _read_plan(path: pathlib.Path) -> set[tuple] | None:
    """The keys a child planned (None: it died before saying)."""
    try:
        return {tuple(key) for key in json.loads(path.read_text())}
    except (OSError, ValueError):
        return None


def supervise(jobs: Sequence[Job], argv: Sequence[str], run_id: str, resume: bool) -> bool:
    """Each job in a process of its own (torchrun's for a per-rank suite),
    one after the other; False if any ended without all its rows."""
    done = []
    for job in jobs:
        child_argv = _child_argv(argv, job.framework, run_id)
        if job.per_rank:
            # Multi-node runs call torchrun themselves: experiments/slurm_torch_cp.sh.
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc_per_node={job.ranks}", "-m", "lcab.experiments", *child_argv]
            what = f"torchrun ({job.ranks} ranks)"
        else:
            command = [sys.executable, "-m", "lcab.experiments", *child_argv]
            what = f"the {job.framework} process"
        done.append(_ran(job, command, what, resume))
    return all(done)


def _ran(job: Job, command: list[str], what: str, resume: bool) -> bool:
    """Run one job's process to its end; fill in the rows it owed."""
    skip = results.done_keys([job.path], settled_only=True) if resume else set()
    with tempfile.TemporaryDirectory(prefix="lcab-plan-") as folder:
        plan = pathlib.Path(folder) / "plan.json"
        env = {**os.environ, processes.WORKER: "1", processes.PLAN: str(plan)}
        child = subprocess.Popen(command, env=env, preexec_fn=processes.die_with_parent)
        try:
            status = child.wait()
        except KeyboardInterrupt as stop:
            _stop(child, stop_signal(stop))
            raise Stopped(stop_signal(stop)) from None
        if status in _STOPPED_BY:  # the child was stopped on its own: so is the run
            raise Stopped(_STOPPED_BY[status])
        wanted = _read_plan(plan)
    if wanted is None:  # it died before its plan: everything it was given
        wanted = {key for case in job.cases for key in case.keys(case.options(job.settings))
                  if key not in skip}
    how = f"exited with {status}" if status >= 0 else f"was killed by signal {-status}"
    lost = fill_missing(job.cases, results.Writer(job.path), job.settings,
                        reason=f"{what} {how} before this case", wanted=wanted)
    if lost:
        logging.error("%s %s without %d of its rows; they are ERROR rows in %s",
                      what, how, lost, job.path)
    elif status != 0:
        logging.error("%s %s", what, how)
    return status == 0 and not lost


def _stop(child: subprocess.Popen, signum: int) -> None:
    """Pass the stop on to a child (it may have had it already from the
    terminal) and wait for it, killing it if it lingers."""
    if child.poll() is None:
        child.send_signal(signum)
    try:
        child.wait(_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


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


def left_out(name: str, record_unavailable: bool = False) -> str | None:
    """Why a sweep without --backends leaves this backend out, or None when
    it runs it: it cannot run here, or is too slow to set up for every sweep.
    With record_unavailable, one that cannot run here is run all the same
    (its rows say UNAVAILABLE and why) unless its class says it is not in
    the default sweep (a claim only an instance can make counts as in)."""
    try:
        backend = registry.load_backend(name)
    except registry.Unavailable as exc:
        if record_unavailable and _in_default_sweep(name):
            return None
        return str(exc)
    return None if backend.in_default_sweep else "runs only when named in --backends"


def _in_default_sweep(name: str) -> bool:
    try:
        claim = registry.all_backends()[name].load().in_default_sweep
    except Exception:  # noqa: BLE001 - its module cannot load: its rows will say why
        return True
    return claim if isinstance(claim, bool) else True


def _available(cases: Sequence, record_unavailable: bool = False) -> list:
    """Without --backends, run what can run here and say what was left out."""
    usable = set()
    for name in dict.fromkeys(case.backend for case in cases):
        reason = left_out(name, record_unavailable)
        if reason:
            logging.info("skipping %s: %s", name, reason)
        else:
            usable.add(name)
    return [case for case in cases if case.backend in usable]
