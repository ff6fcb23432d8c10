"""Which process of a multi-process run this is, without importing a framework.

torch CP runs one process per rank under torchrun, which sets RANK and
WORLD_SIZE. Multi-process JAX is started by the user (srun, mpirun, or by
hand) and told how to meet through the CLI's --jax_* flags, which reach the
JAX runtime in JAX_DISTRIBUTED (jax_backends.distributed reads it). Only
process 0 writes rows and prints; its times are the maximum over processes.
A process the CLI started for one framework (lcab.experiments.launch) is
`supervised()` and dies with its parent (`die_with_parent`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

JAX_DISTRIBUTED = "LCAB_JAX_DISTRIBUTED"  # "auto" or "coordinator,num_processes,process_id"

# Where launchers put a process's index, for --jax_distributed=auto.
_LAUNCHER_RANKS = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def torchrun_rank() -> int | None:
    """This process's rank when torchrun started it, else None."""
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return int(os.environ["RANK"])
    return None


def jax_coordinates(setting: str) -> tuple[str, int, int]:
    """(coordinator, number of processes, this process's index) of an
    explicit JAX_DISTRIBUTED value (not "auto")."""
    coordinator, processes, process_id = setting.split(",")
    return coordinator, int(processes), int(process_id)


def jax_process_index() -> int | None:
    """This process's index in a multi-process JAX run, else None."""
    setting = os.environ.get(JAX_DISTRIBUTED)
    if not setting:
        return None
    if setting != "auto":
        return jax_coordinates(setting)[2]
    for name in _LAUNCHER_RANKS:
        if name in os.environ:
            return int(os.environ[name])
    return 0


def jax_setting(coordinator: str | None, processes: int | None, process_id: int | None,
                auto: bool) -> str | None:
    """The JAX_DISTRIBUTED value for the CLI's flags (None: one process)."""
    explicit = (coordinator, processes, process_id)
    if auto:
        if any(value is not None for value in explicit):
            raise ValueError("--jax_distributed_auto detects the coordinator; do not also give "
                             "--jax_coordinator, --jax_num_processes or --jax_process_id")
        return "auto"
    if all(value is None for value in explicit):
        return None
    if any(value is None for value in explicit):
        raise ValueError("multi-process JAX needs all of --jax_coordinator, "
                         "--jax_num_processes and --jax_process_id (or --jax_distributed_auto)")
    if not 0 <= process_id < processes:
        raise ValueError(f"--jax_process_id {process_id} is not in [0, {processes})")
    return f"{coordinator},{processes},{process_id}"


# Set for a framework process that the CLI started and supervises (its rows
# are checked when it ends); it then dies with its parent.
WORKER = "LCAB_WORKER"
# Where a supervised process lists the row keys it is about to write (JSON).
PLAN = "LCAB_PLAN"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def supervised() -> bool:
    """Whether the CLI started this process to run one framework's cases."""
    return bool(os.environ.get(WORKER))


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent dies, so that no
    orphan goes on writing rows after the run it belongs to was killed
    (Linux only; elsewhere a no-op). Safe as a subprocess preexec_fn."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no prctl here: children then outlive a killed parent


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...), from /proc;
    empty where /proc is missing."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # The command name (field 2) is in parentheses and may hold
                # spaces; the parent pid is the second field after it.
                parent = int(stat.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(parent, []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found += children
        frontier += children
    return found
