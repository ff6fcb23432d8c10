"""python -m lcab.experiments.canonical SWEEP: run a canonical sweep on this
machine in parts, resuming where the last call stopped, and write its RUN.md.

    python -m lcab.experiments.canonical blog                # every part, to the end
    python -m lcab.experiments.canonical cp --budget_s=570   # what fits 570 s; run again to go on
    python -m lcab.experiments.canonical cp --list           # the parts and their commands

Rows land in ``results/<date>-<device>-<sweep>/<part>/`` (lcab.canonical),
each part in its own folder; ``parts.json`` there records every run (command,
UTC times, exit status) and RUN.md is rewritten from it after each run, with
the commit, the package versions and each GPU's name and serial. A part
whose runs all ended well is done and skipped by later calls; a part cut by
the time budget or by a stop resumes where it stopped (the CLI's --resume);
a part that failed is kept as failed and only rerun with --retry. Parts that
repeat another part as a cluster starts it (multi-process JAX, torchrun
with two nodes) are compared with it, row by row, in RUN.md.
Exit status: 0 when every chosen part is done, 3 when some remain, 1 when
one failed.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import sys
import time

from absl import app, flags

from lcab import canonical
from lcab.experiments import canonical_parts as defined
from lcab.experiments import machine

# Its own flag set: the experiments CLI's flags (--out, --git_commit) live in
# the same package and are imported beside these in one process.
FLAGS = flags.FlagValues()
OUT = flags.DEFINE_string(
    "out", None, "Where the rows go (default: results/<date>-<device>-<SWEEP>/ in the "
    "repository; the same folder on a later call resumes it).", flag_values=FLAGS)
PARTS = flags.DEFINE_list("parts", None, "Only these parts, in this order (default: all).",
                          flag_values=FLAGS)
BUDGET = flags.DEFINE_integer(
    "budget_s", None, "Seconds this call may take: no run starts with less than "
    "--min_run_s left, and a run still going at the end is stopped (its rows are kept and "
    "the next call resumes it).", lower_bound=1, flag_values=FLAGS)
MIN_RUN = flags.DEFINE_integer("min_run_s", 60, "The least time worth starting a run with.",
                               lower_bound=1, flag_values=FLAGS)
COMMIT = flags.DEFINE_string(
    "git_commit", None, "The commit being measured (default: the checkout's; needed where "
    "the tree has no git history).", flag_values=FLAGS)
EXTRA = flags.DEFINE_string(
    "extra", "", "Flags appended to every run, e.g. a small CPU rehearsal: "
    "--extra='--seqlens=512 --heads=4:2 --head_dim=16'.", flag_values=FLAGS)
RETRY = flags.DEFINE_bool("retry", False, "Rerun parts that failed.", flag_values=FLAGS)
LIST = flags.DEFINE_bool("list", False, "Print the parts and their commands, then exit.",
                         flag_values=FLAGS)

STATE_NAME = "parts.json"
_STOP_GRACE_S = 30
DONE, FAILED, STOPPED = "done", "failed", "stopped"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclasses.dataclass
class Launch:
    """The processes of one run: argv and environment additions of each."""

    commands: list[tuple[list[str], dict[str, str]]]

    def text(self) -> str:
        return "\n".join(" ".join([*(f"{k}={v}" for k, v in env.items()),
                                   *map(shlex.quote, argv)])
                         for argv, env in self.commands)


def launch_of(run: defined.Run, folder: pathlib.Path, commit: str, extra: list[str],
              gpus: int) -> Launch:
    """How to start one run: the CLI alone, one JAX process per GPU, or
    torchrun per rendezvous node. Without GPUs, each JAX process gets its
    share of host devices instead."""
    cli = [*run.flags, *extra, f"--out={folder}", "--resume", f"--git_commit={commit}",
           "--noprogress", "--nosummary"]
    module = [sys.executable, "-m", "lcab.experiments"]
    if run.launcher == defined.PLAIN:
        return Launch([(module + cli, {})])
    port = _free_port()
    count = run.processes
    if run.launcher == defined.JAX_PROCESSES:
        commands = []
        for index in range(count):
            env = ({"CUDA_VISIBLE_DEVICES": str(index)} if gpus else
                   {"XLA_FLAGS": "--xla_force_host_platform_device_count="
                                 f"{max(1, _cp_size(run) // count)}"})
            commands.append((module + cli + [f"--jax_coordinator=127.0.0.1:{port}",
                                             f"--jax_num_processes={count}",
                                             f"--jax_process_id={index}"], env))
        return Launch(commands)
    per_node = max(1, _cp_size(run) // count)
    commands = []
    for node in range(count):
        env = ({"CUDA_VISIBLE_DEVICES": ",".join(str(node * per_node + i)
                                                 for i in range(per_node))} if gpus else {})
        commands.append(([sys.executable, "-m", "torch.distributed.run", f"--nnodes={count}",
                          f"--nproc_per_node={per_node}", f"--node_rank={node}",
                          "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                          f"--rdzv_id=lcab-{port}", "-m", "lcab.experiments", *cli], env))
    return Launch(commands)


def _cp_size(run: defined.Run) -> int:
    for flag in run.flags:
        if flag.startswith("--cp_size="):
            return int(flag.partition("=")[2])
    return run.processes


def run_processes(launch: Launch, seconds: float | None) -> tuple[int, bool]:
    """Start a run's processes and wait for them; at the time limit stop
    them (SIGTERM, which the CLI turns into a resumable stop; SIGKILL after
    a grace). (exit status: the first non-zero, else 0; stopped at the limit)."""
    children = [subprocess.Popen(argv, env={**os.environ, **env}, start_new_session=True)
                for argv, env in launch.commands]
    deadline = None if seconds is None else time.monotonic() + seconds
    stopped = False
    try:
        while any(child.poll() is None for child in children):
            if deadline is not None and time.monotonic() > deadline and not stopped:
                stopped = True
                # The leaders only: each passes the stop on to its workers,
                # which finish as stopped. Signalling the whole group would
                # also kill a compiler (ptxas) mid-case, and that case would
                # read as an ERROR of the backend.
                _signal_all(children, signal.SIGTERM, group=False)
                deadline = time.monotonic() + _STOP_GRACE_S
            elif stopped and time.monotonic() > deadline:
                _signal_all(children, signal.SIGKILL)
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        _signal_all(children, signal.SIGINT, group=False)
        for child in children:
            child.wait()
        raise
    codes = [child.wait() for child in children]
    return next((code for code in codes if code != 0), 0), stopped


def _signal_all(children: list[subprocess.Popen], signum: int, group: bool = True) -> None:
    """Signal each child still running; with `group`, every process it
    started too (its session)."""
    for child in children:
        if child.poll() is None:
            try:
                (os.killpg if group else os.kill)(child.pid, signum)
            except ProcessLookupError:
                pass


class State:
    """parts.json: the sweep, the machine, and each part's runs."""

    def __init__(self, folder: pathlib.Path, sweep: str):
        self.path = folder / STATE_NAME
        if self.path.exists():
            self.data = json.loads(self.path.read_text())
            if self.data.get("sweep") != sweep:
                raise app.UsageError(f"{folder} holds the {self.data.get('sweep')!r} sweep, "
                                     f"not {sweep!r}")
        else:
            self.data = {"sweep": sweep, "calls": [], "parts": {}}

    def part(self, name: str) -> dict:
        return self.data["parts"].setdefault(name, {"status": None, "runs": []})

    def save(self) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.data, indent=1))
        temporary.replace(self.path)


def default_out(sweep: str) -> pathlib.Path:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return canonical.RESULTS / canonical.folder_name(date, machine.device_label(), sweep)


def _commit() -> str:
    if COMMIT.value:
        return COMMIT.value
    from lcab.provenance import git_commit

    commit = git_commit()
    if commit in ("", "unknown", None):
        raise app.UsageError("no git history here: give --git_commit=<the commit measured>")
    return commit


def chosen_parts(sweep: str) -> list[defined.Part]:
    every = {part.name: part for part in defined.parts(sweep)}
    if not PARTS.value:
        return list(every.values())
    unknown = [name for name in PARTS.value if name not in every]
    if unknown:
        raise app.UsageError(f"{sweep} has no part {', '.join(unknown)}; its parts: "
                             f"{', '.join(every)}")
    return [every[name] for name in PARTS.value]


def run_sweep(sweep: str, folder: pathlib.Path, parts: list[defined.Part], commit: str,
              extra: list[str], budget_s: float | None, *, retry: bool = False,
              min_run_s: float = 60) -> int:
    """Run the parts that are not done, within the budget; 0 all done,
    3 some remain, 1 one failed."""
    from lcab.experiments.run_record import write_run_md  # pandas: only when running

    folder.mkdir(parents=True, exist_ok=True)
    state = State(folder, sweep)
    found = machine.gpus()
    state.data["calls"].append({"start": _now(), "commit": commit, "gpus": found,
                                "versions": machine.versions(), "extra": extra,
                                "budget_s": budget_s})
    state.save()
    started = time.monotonic()
    left = lambda: None if budget_s is None else budget_s - (time.monotonic() - started)  # noqa: E731
    ran = []
    for part in parts:
        record = state.part(part.name)
        if record.get("extra", []) != extra:
            # Done with other extra flags (a subset, a rehearsal) is not done
            # with these: run it again; --resume keeps the rows it has.
            record.update(status=None, finished_runs=[], extra=extra)
        if record["status"] == DONE or (record["status"] == FAILED and not retry):
            continue
        if part.gpus > max(1, len(found)) and found:
            print(f"== {part.name}: needs {part.gpus} GPUs, this machine has {len(found)}; "
                  "skipped", flush=True)
            continue
        status = DONE
        for index, run in enumerate(part.runs):
            if index < len(record.get("finished_runs", [])):
                continue  # this run ended well on an earlier call
            remaining = left()
            if remaining is not None and remaining < min_run_s:
                status = STOPPED
                break
            launch = launch_of(run, folder / part.name, commit, extra, len(found))
            print(f"== {_now()} {part.name} ({index + 1}/{len(part.runs)}): {part.what}\n"
                  f"{launch.text()}", flush=True)
            entry = {"command": launch.text(), "start": _now()}
            record["runs"].append(entry)
            state.save()
            code, stopped = run_processes(launch, remaining)
            entry.update(end=_now(), exit=code, stopped_at_limit=stopped)
            print(f"   exit {code}{' (stopped at the time limit)' if stopped else ''}",
                  flush=True)
            if stopped:
                status = STOPPED
                break
            if code != 0:
                status = FAILED
                break
            record.setdefault("finished_runs", []).append(index)
        record["status"] = status
        state.save()
        write_run_md(folder, state.data, parts)
        ran.append(part)
        if status == STOPPED:
            break
    write_run_md(folder, state.data, parts)
    _print_summaries(folder, ran)
    statuses = [state.part(part.name)["status"] for part in parts]
    if FAILED in statuses:
        return 1
    return 0 if all(status == DONE for status in statuses) else 3


def _print_summaries(folder: pathlib.Path, ran: list[defined.Part]) -> None:
    from lcab.report.summary import summary_text

    for part in ran:
        rows = folder / part.name
        if rows.exists() and any(rows.glob("*.jsonl")):
            print(f"\n## {part.name}\n\n{summary_text([rows])}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in canonical.SWEEPS:
        raise app.UsageError("give one sweep: " + ", ".join(
            f"{name} ({what})" for name, what in canonical.SWEEPS.items()))
    sweep = argv[1]
    parts = chosen_parts(sweep)
    extra = shlex.split(EXTRA.value)
    if LIST.value:
        folder = pathlib.Path(OUT.value or default_out(sweep))
        for part in parts:
            print(f"{part.name}  ({part.gpus} GPU{'s' if part.gpus > 1 else ''}): {part.what}")
            for run in part.runs:
                print("  " + launch_of(run, folder / part.name, COMMIT.value or "COMMIT", extra,
                                       part.gpus).text().replace("\n", "\n  "))
        return 0
    folder = pathlib.Path(OUT.value) if OUT.value else default_out(sweep)
    return run_sweep(sweep, folder, parts, _commit(), extra, BUDGET.value, retry=RETRY.value,
                     min_run_s=MIN_RUN.value)


def parse_flags(argv: list[str]) -> list[str]:
    """This module's flags; a bad one is a one-line usage error."""
    try:
        remaining = FLAGS(argv)
    except flags.Error as error:
        sys.exit(f"{pathlib.Path(argv[0]).name}: {error}\nflags: "
                 + ", ".join(f"--{name}" for name in FLAGS))
    flags.FLAGS([argv[0]])  # absl's own flags, which app.run needs parsed
    return remaining


def console_main() -> None:
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    console_main()
