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
a part that failed is kept as failed and only rerun with --retry; a part
named in --measure_again is measured from the start with the code at hand
(its earlier rows stay beside the new ones, the newest row of each
measurement standing in the tables; with --measure_again_backends only
those backends' rows, after a change to one kernel). Parts that
repeat another part as a cluster starts it (multi-process JAX, torchrun
with two nodes) are compared with it, row by row, in RUN.md.
Exit status: 0 when every chosen part is done, 3 when some remain, 1 when
one failed.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import math
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from absl import app, flags

from lcab import canonical, processes, reference_cache, registry
from lcab.experiments import canonical_parts as defined
from lcab.experiments import changed_parts, machine
from lcab.spans import spans_text

# Its own flag set: the experiments CLI's flags (--out, --git_commit) live in
# the same package and are imported beside these in one process.
FLAGS = flags.FlagValues()
OUT = flags.DEFINE_string(
    "out", None, "Where the rows go (default: results/<date>-<device>-<SWEEP>/ in the "
    "repository; the same folder on a later call resumes it).", flag_values=FLAGS)
RESULTS_ROOT = flags.DEFINE_string(
    "results_root", None, "Without --out, the folder that holds the sweep's runs (default: "
    "the repository's results/): the call goes on with the newest unfinished run of this "
    "sweep on this machine's card there, or starts <date>-<device>-<SWEEP>/ in it. On a "
    "borrowed machine, point it at a copy of results/ so the card picks the folder.",
    flag_values=FLAGS)
PARTS = flags.DEFINE_list("parts", None, "Only these parts, in this order (default: all; "
                          "'changed': as in --measure_again).", flag_values=FLAGS)
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
MEASURE_AGAIN = flags.DEFINE_list(
    "measure_again", [], "Measure these parts again from the start (after a change to the "
    "code they time): as each part starts, its rows files are renamed <name>.before-<UTC "
    "time>.jsonl, which the tables still read (the newest row of each measurement stands), "
    "and its record starts over; a part the budget never reaches is left as it stands. "
    "The same command again resumes them until they are done. "
    "'changed' names every part whose standing rows were measured before a later change "
    "to their kernel (the tables' †), each with only those rows moved aside, so only "
    "their cases run again; with --parts naming parts, only those of them.",
    flag_values=FLAGS)
MEASURE_AGAIN_BACKENDS = flags.DEFINE_list(
    "measure_again_backends", [], "With --measure_again: only these backends' rows move "
    "aside (into <name>.before-<UTC time>.jsonl); the other rows stay where --resume reads "
    "them, so only these backends run again (after a change to one kernel).",
    flag_values=FLAGS)
PARALLEL = flags.DEFINE_bool(
    "parallel", False, "Run one-GPU parts side by side, one on each visible GPU, each "
    "pinned to its share of the CPU cores; parts of several GPUs still run alone. RUN.md "
    "says which GPU and cores each run had and which parts ran beside it.",
    flag_values=FLAGS)
LIST = flags.DEFINE_bool("list", False, "Print the parts and their commands, then exit.",
                         flag_values=FLAGS)

STATE_NAME = canonical.STATE_NAME
# More than torchrun's own grace for its workers (30 s), so they stop
# themselves before anything is killed.
STOP_GRACE_S = 60
DONE, FAILED, STOPPED = canonical.DONE, "failed", "stopped"
RUNNING = "running"  # a part's state within one call, never saved


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
              gpu_ids: Sequence[str]) -> Launch:
    """How to start one run: the CLI alone, one JAX process per GPU, or
    torchrun per rendezvous node, each process on its share of `gpu_ids`
    (CUDA_VISIBLE_DEVICES names). Without GPUs, each JAX process gets its
    share of host devices instead."""
    # The parts share the full-size check's references through the cache:
    # a workload's reference is computed by the first part that checks it.
    cli = [*run.flags, *extra, f"--out={folder}", "--resume", f"--git_commit={commit}",
           "--noprogress", "--nosummary", f"--reference_cache={reference_cache.DEFAULT_DIR}"]
    module = [sys.executable, "-m", "lcab.experiments"]
    if run.launcher == defined.PLAIN:
        return Launch([(module + cli, {"CUDA_VISIBLE_DEVICES": ",".join(gpu_ids)}
                        if gpu_ids else {})])
    port = _free_port()
    count = run.processes
    per_process = max(1, _cp_size(run) // count)
    shares = [",".join(gpu_ids[i * per_process:(i + 1) * per_process]) for i in range(count)]
    if run.launcher == defined.JAX_PROCESSES:
        return Launch([
            (module + cli + [f"--jax_coordinator=127.0.0.1:{port}", f"--jax_num_processes={count}",
                             f"--jax_process_id={index}"],
             {"CUDA_VISIBLE_DEVICES": shares[index]} if gpu_ids else
             {"XLA_FLAGS": f"--xla_force_host_platform_device_count={per_process}"})
            for index in range(count)])
    return Launch([
        ([sys.executable, "-m", "torch.distributed.run", f"--nnodes={count}",
          f"--nproc_per_node={per_process}", f"--node_rank={node}", "--rdzv_backend=c10d",
          f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id=lcab-{port}", "-m", "lcab.experiments",
          *cli], {"CUDA_VISIBLE_DEVICES": shares[node]} if gpu_ids else {})
        for node in range(count)])


def _cp_size(run: defined.Run) -> int:
    for flag in run.flags:
        if flag.startswith("--cp_size="):
            return int(flag.partition("=")[2])
    return run.processes


class Processes:
    """The started processes of one run. poll() them until it returns
    (exit status: the first non-zero, else 0; stopped at the limit). At the
    deadline, or when one of them fails while others wait for it (a
    rendezvous, a collective), the rest are stopped: SIGTERM, which the CLI
    turns into a resumable stop, then after a grace SIGKILL to every
    process they started."""

    def __init__(self, launch: Launch, deadline: float | None, cores: Sequence[int] = ()):
        pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
        # preexec_fn is safe here: the runner starts no threads.
        self.children = [subprocess.Popen(argv, env={**os.environ, **env},
                                          start_new_session=True,
                                          preexec_fn=pin)  # noqa: PLW1509
                         for argv, env in launch.commands]
        self.deadline = deadline
        self.stopping_since = None
        self.at_limit = False

    def poll(self) -> tuple[int, bool] | None:
        children = self.children
        if all(child.poll() is not None for child in children):
            codes = [child.wait() for child in children]
            return next((code for code in codes if code != 0), 0), self.at_limit
        now = time.monotonic()
        failed = any(child.poll() not in (None, 0) for child in children)
        if self.stopping_since is None and (
                failed or (self.deadline is not None and now > self.deadline)):
            self.at_limit = not failed
            self.stopping_since = now
            # The leaders only: each passes the stop on to its workers,
            # which finish as stopped. Signalling the whole group would
            # also kill a compiler (ptxas) mid-case, and that case would
            # read as an ERROR of the backend.
            _signal(children, signal.SIGTERM)
        elif self.stopping_since is not None and now > self.stopping_since + STOP_GRACE_S:
            _kill_trees(children)
        return None

    def interrupt(self) -> None:
        """Ctrl-C: pass it on (each CLI stops resumably); the caller waits
        out the grace (_wait_or_kill)."""
        _signal(self.children, signal.SIGINT)


def _signal(children: list[subprocess.Popen], signum: int) -> None:
    for child in children:
        if child.poll() is None:
            try:
                os.kill(child.pid, signum)
            except ProcessLookupError:
                pass


def _wait_or_kill(children: list[subprocess.Popen]) -> None:
    end = time.monotonic() + STOP_GRACE_S
    while any(child.poll() is None for child in children) and time.monotonic() < end:
        time.sleep(0.5)
    _kill_trees(children)


def _kill_trees(children: list[subprocess.Popen]) -> None:
    """SIGKILL each child and every process below it: torchrun starts its
    workers in sessions of their own, so a process group would miss them."""
    for child in children:
        for pid in [child.pid, *processes.descendants(child.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for child in children:
        child.wait()


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

    def check_card(self, folder: pathlib.Path, found: list[dict[str, str]]) -> None:
        """A sweep's rows come from one model of GPU: a call on another card
        (a machine that came as an H200 where the folder holds H100 rows)
        is refused before it adds a row, since its resumed parts would mix
        the two cards in one table."""
        here = _card(found)
        before = {_card(call.get("gpus") or []) for call in self.data["calls"]} - {"cpu"}
        if here != "cpu" and before and before != {here}:
            raise app.UsageError(
                f"{folder} holds rows measured on {', '.join(sorted(before))}; this machine "
                f"has {here}: give another --out (without --out, the folder is chosen "
                "for this machine's card)")

    def save(self) -> None:
        _write_whole(self.path, json.dumps(self.data, indent=1))


def _write_whole(path: pathlib.Path, text: str) -> None:
    """Write `text` to a file beside `path`, then put it in path's place:
    a stop part way leaves the old file whole."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def default_out(sweep: str, gpus: list[dict[str, str]],
                root: pathlib.Path | None = None, again: bool = False) -> pathlib.Path:
    """<root>/<date>-<device>-<sweep>/ (root: results/): the newest run of
    this sweep on this card while it has parts left (a call after midnight,
    or on a machine of fewer GPUs of the card, goes on with it: the
    card's current run is one, lcab.canonical.current), else a new one
    dated today. With `again` (a call that measures parts again) the card's
    newest run is the one even when finished: measuring again belongs to a
    run that has rows. A new run's device is the GPUs its widest part uses: a
    kernel sweep run on four GPUs (--parallel) is still a one-GPU sweep,
    h100, not h100x4."""
    root = canonical.RESULTS if root is None else pathlib.Path(root)
    widest = max(part.gpus for part in defined.parts(sweep))
    usable = min(len(machine.visible_gpu_ids(gpus)), widest)
    device = machine.device_label(gpus[:usable])
    card = canonical.card_of(device)
    for folder in canonical.folders(sweep, root):
        if canonical.card_of(canonical.parse_folder(folder.name)[1]) == card:
            if again or _unfinished(folder):
                return folder
            break  # the card's newest run is finished: a new one
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return root / canonical.folder_name(date, device, sweep)


def _card(found: list[dict[str, str]]) -> str:
    """The GPU model (h100, h200; cpu without a GPU), whatever the count."""
    return machine.device_label(found[:1])


def _unfinished(folder: pathlib.Path) -> bool:
    counts = defined.progress(folder)
    return counts is not None and counts[0] < counts[1]


def _commit() -> str:
    from lcab.provenance import named_commit

    try:
        commit = named_commit(COMMIT.value)
    except ValueError as exc:
        raise app.UsageError(str(exc)) from exc
    if commit in ("", "unknown", None):
        raise app.UsageError("no git history here: give --git_commit=<the commit measured>")
    return commit


def named_parts(values: Sequence[str], changed: Sequence[str]) -> list[str]:
    """Part names as a flag gives them, 'changed' standing for `changed`'s."""
    return [name for value in values
            for name in (changed if value == changed_parts.CHANGED else [value])]


def changed_among(folder: pathlib.Path, sweep: str) -> dict[str, list[str]]:
    """What 'changed' stands for (changed_parts.changed: part -> the backends
    whose standing rows predate a later change); where --parts names parts
    rather than 'changed', only those of them: --parts chooses the parts,
    --measure_again=changed what to do in them."""
    changed = changed_parts.changed(folder, defined.parts(sweep), State(folder, sweep).data)
    if PARTS.value and changed_parts.CHANGED not in PARTS.value:
        changed = {name: backends for name, backends in changed.items()
                   if name in PARTS.value}
    return changed


def chosen_parts(sweep: str, changed: Sequence[str] = ()) -> list[defined.Part]:
    """--parts in their order, then the --measure_again parts not among them;
    'changed' in either stands for the parts `changed` names (changed_among)."""
    every = {part.name: part for part in defined.parts(sweep)}
    names = named_parts(PARTS.value, changed) if PARTS.value else list(every)
    names += [name for name in named_parts(MEASURE_AGAIN.value, changed) if name not in names]
    unknown = [name for name in names if name not in every]
    if unknown:
        raise app.UsageError(f"{sweep} has no part {', '.join(unknown)}; its parts: "
                             f"{', '.join(every)}")
    return [every[name] for name in names]


def measure_again(state: State, folder: pathlib.Path, parts: Sequence[defined.Part],
                  commit: str, stamp: str,
                  backends: Sequence[str] | Mapping[str, Sequence[str]] = (),
                  only_predating: bool = False) -> list[str]:
    """Set each part to be measured from the start at `commit`: its rows
    files moved aside as <name>.before-<stamp>.jsonl and its record reset;
    with `backends` (the same for every part, or a part name -> backends),
    only those backends' rows move (set_aside_rows), so --resume measures
    only them again; with `only_predating` too (--measure_again=changed),
    only the rows of a mapped part's backends that predate a later change
    to their kernel (the tables' †), so only those cases run again. A part
    already set so at this commit (for the same backends) is left to
    resume, unless rows it measured since predate a later change to their
    kernel. The names of the parts set now."""
    again = []
    for part in parts:
        chosen = set(mark := _backends_of(backends, part.name))
        stale_only = only_predating and isinstance(backends, Mapping) and part.name in backends
        record = state.part(part.name)
        stale = changed_parts.predating(folder / part.folder)
        if already_set_again(record, commit, mark,
                             stale=any(not chosen or name in chosen for name in stale)):
            continue
        for path in sorted((folder / part.folder).glob("*.jsonl")):
            if ".before-" in path.name:
                continue
            aside = path.with_name(f"{path.stem}.before-{stamp}.jsonl")
            if chosen:
                set_aside_rows(path, aside, chosen, predating_only=stale_only)
            else:
                path.rename(aside)
        record.update(status=None, finished_runs=[], measured_again_at=commit,
                      measured_again_backends=mark)
        again.append(part.name)
    return again


def already_set_again(record: Mapping, commit: str, backends: Sequence[str], *,
                      stale: bool = False) -> bool:
    """Whether a part's record says it was set to be measured again (for
    these backends) at this commit, or at any commit and not yet done: its
    rows measured since are of the code at hand, so it resumes. `stale`:
    some of those rows predate a later change to their kernel (set at an
    older commit, stopped, and the kernel changed before this call), so it
    starts over instead."""
    return (bool(record.get("measured_again_at"))
            and record.get("measured_again_backends", []) == sorted(backends)
            and (record["measured_again_at"] == commit
                 or (record.get("status") != DONE and not stale)))


def _backends_of(backends: Sequence[str] | Mapping[str, Sequence[str]], name: str) -> list[str]:
    """The backends part `name` measures again (the same for every part, or
    a part name -> backends); [] for all of them."""
    return sorted(backends.get(name, ()) if isinstance(backends, Mapping) else backends)


def set_aside_rows(path: pathlib.Path, aside: pathlib.Path, backends: set[str], *,
                   predating_only: bool = False) -> None:
    """Move the rows of `backends` from rows file `path` to `aside` (a new
    file; nothing written where none match), each line as it was; with
    `predating_only`, only those measured before a later change to their
    kernel (lcab.registry.changes_since). Lines that are not a row (a
    damaged tail) stay."""
    kept, moved = [], []
    for line in path.read_text().splitlines(keepends=True):
        try:
            row = json.loads(line)
            backend = row.get("backend")
        except (ValueError, AttributeError):
            row, backend = None, None
        move = backend in backends and (not predating_only or bool(registry.changes_since(row)))
        (moved if move else kept).append(line)
    if moved:
        aside.write_text("".join(moved))
        _write_whole(path, "".join(kept))  # a stop part way loses no row of either file


def run_sweep(sweep: str, folder: pathlib.Path, parts: list[defined.Part], commit: str,
              extra: list[str], budget_s: float | None, *, retry: bool = False,
              min_run_s: float = 60, gpus: list[dict[str, str]] | None = None,
              parallel: bool = False, again: Sequence[str] = (),
              again_backends: Sequence[str] | Mapping[str, Sequence[str]] = (),
              again_only_predating: bool = False) -> int:
    """Run the parts that are not done, within the budget (with `parallel`,
    one-GPU parts side by side, one per GPU; the parts named in `again`
    from the start, or only `again_backends` in them, or with
    `again_only_predating` only their rows that predate a change, see
    measure_again);
    0 all done, 3 some remain, 1 one failed, 130 stopped by a signal."""
    from lcab.experiments.run_record import write_run_md  # pandas: only when running

    folder.mkdir(parents=True, exist_ok=True)
    state = State(folder, sweep)
    found = machine.gpus() if gpus is None else gpus
    state.check_card(folder, found)
    gpu_ids = machine.visible_gpu_ids(found) if found else []
    start = _now()
    call = {"start": start, "commit": commit, "gpus": found, "visible": gpu_ids,
            "versions": machine.versions(), "extra": extra, "budget_s": budget_s,
            "parallel": parallel}
    stamp = "".join(ch for ch in start if ch.isdigit())  # 20261128201533
    state.data["calls"].append(call)
    state.save()

    def set_again(part: defined.Part) -> None:
        """Set `part` to be measured again as it starts, not before: a part
        the budget never reaches keeps its rows and its record as they were."""
        if part.name not in again or not measure_again(state, folder, [part], commit, stamp,
                                                       again_backends, again_only_predating):
            return
        call.setdefault("measured_again", []).append(part.name)
        if own := _backends_of(again_backends, part.name):
            if isinstance(again_backends, Mapping):
                call.setdefault("measured_again_backends", {})[part.name] = own
                if again_only_predating:
                    call["measured_again_rows"] = changed_parts.CHANGED
            else:
                call["measured_again_backends"] = own
        state.save()

    deadline = None if budget_s is None else time.monotonic() + budget_s
    queue, waiting = [], []
    for part in parts:
        if gpu_ids and part.gpus > len(gpu_ids):
            print(f"== {part.name}: needs {part.gpus} GPUs, {len(gpu_ids)} visible here; "
                  "skipped", flush=True)
            waiting.append(part)
            continue
        # Done with other extra flags (a subset, a rehearsal) is not done
        # with these: it runs again (--resume keeps its rows).
        record = state.data["parts"].get(part.name, {})
        same = record.get("extra", []) == extra
        only = _backends_of(again_backends, part.name) if part.name in again else []
        # A part not done resumes every backend's missing cases, not only
        # those measured again: it needs every package.
        needs_of = only if record.get("status") == DONE else []
        # A part to be measured again (set aside as it starts) runs, done or not.
        kept = part.name not in again or already_set_again(record, commit, only)
        if kept and same and record.get("status") == FAILED and not retry:
            continue
        if kept and same and record.get("status") == DONE:
            missed = packages_its_rows_missed(folder, part, bool(found))
            if not missed:
                continue
            if missing_packages(part, bool(found)):
                print(f"== {part.name}: its rows say {', '.join(missed)} could not be "
                      "imported when they ran, nor here: left as it is", flush=True)
                continue
            print(f"== {part.name}: its rows say {', '.join(missed)} could not be imported "
                  "when they ran; it runs again (--resume retries those rows)", flush=True)
            record.update(status=None, finished_runs=[])
            state.save()
        elif missing := missing_packages(part, bool(found), needs_of):
            # Run without them, its rows would say UNAVAILABLE: measurements
            # lost to how the machine was set up, not to the backends.
            print(f"== {part.name}: needs {', '.join(missing)}, which cannot be imported "
                  "here; skipped", flush=True)
            waiting.append(part)
            continue
        queue.append(part)
    lanes = _Lanes(gpu_ids, parallel)
    running: list[_Running] = []
    ran = []
    stopped = False
    try:
        while running or (queue and not stopped):
            while queue and not stopped:
                ids = lanes.take(queue[0], running)
                if ids is None:
                    break  # the next part waits for GPUs: parts start in order
                part = queue.pop(0)
                if part.name in again and _seconds_left(deadline) < min_run_s:
                    lanes.give_back(ids)  # too little time: it stays as it stands
                    stopped = True
                    continue
                set_again(part)
                record = state.part(part.name)
                if record.get("extra", []) != extra:
                    record.update(status=None, finished_runs=[], extra=extra)
                started = _Running(part, record, ids, lanes.cores(ids))
                status = started.start_next(state, folder, commit, extra, deadline, min_run_s,
                                            beside=[r.part.name for r in running])
                if status == RUNNING:
                    running.append(started)
                    continue
                lanes.give_back(ids)
                stopped = status == STOPPED  # too little time left: nothing starts after it
            for entry in list(running):
                status = entry.step(state, folder, commit, extra, deadline, min_run_s,
                                    beside=[r.part.name for r in running if r is not entry])
                if status is None:
                    continue
                running.remove(entry)
                lanes.give_back(entry.gpu_ids)
                ran.append(entry.part)
                write_run_md(folder, state.data, parts)
                stopped = stopped or status == STOPPED
            if running:
                time.sleep(0.5)
    except KeyboardInterrupt:
        for entry in running:
            entry.processes.interrupt()
        _wait_or_kill([child for entry in running for child in entry.processes.children])
        for entry in running:
            entry.interrupted()
        state.save()
        write_run_md(folder, state.data, parts)
        print(f"lcab.experiments.canonical: stopped; run the same command again to go on "
              f"({folder})", file=sys.stderr, flush=True)
        return 130
    write_run_md(folder, state.data, parts)
    _print_summaries(folder, ran)
    statuses = [state.data["parts"].get(part.name, {}).get("status") for part in parts
                if part not in waiting]
    if FAILED in statuses:
        return 1
    # A part left in the queue (the budget ran out) may be one done before
    # that was to be measured again.
    return 0 if all(status == DONE for status in statuses) and not waiting and not queue else 3


class _Lanes:
    """Which GPUs (and CPU cores) are free. Without `parallel`, one part at
    a time on the first GPUs it needs; with it, one-GPU parts one per GPU,
    each with its share of the cores, and a part of several GPUs alone."""

    def __init__(self, gpu_ids: list[str], parallel: bool):
        self.gpu_ids = gpu_ids
        self.free = list(gpu_ids)
        self.parallel = parallel and len(gpu_ids) > 1
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        share = len(cores) // len(gpu_ids) if self.parallel else 0
        self._cores = {gpu: cores[i * share:(i + 1) * share] for i, gpu in enumerate(gpu_ids)}

    def take(self, part: defined.Part, running: list) -> list[str] | None:
        alone = not self.parallel or part.gpus > 1
        if running and (alone or any(r.part.gpus > 1 for r in running)):
            return None
        if not self.gpu_ids:
            return []
        if len(self.free) < part.gpus:
            return None
        ids, self.free = self.free[:part.gpus], self.free[part.gpus:]
        return ids

    def give_back(self, ids: list[str]) -> None:
        self.free = [gpu for gpu in self.gpu_ids if gpu in self.free or gpu in ids]

    def cores(self, ids: list[str]) -> list[int]:
        """The cores of a one-GPU part running beside others; [] for no pinning."""
        return self._cores.get(ids[0], []) if self.parallel and len(ids) == 1 else []


def missing_packages(part: defined.Part, on_gpu: bool = False,
                     backends: Sequence[str] = ()) -> list[str]:
    """The packages the part needs (Part.needs, and Part.gpu_needs where
    there is a GPU) that cannot be imported here: missing, or broken (the
    backend's own import would fail alike, as tokamax's without xprof).
    With `backends` (the part measured again for them alone, its other
    rows standing), only the GPU-only packages those backends require."""
    needed = part.packages(on_gpu)
    if backends and (wanted := _required_by(backends)) is not None:
        needed = tuple(name for name in needed if name in part.needs or name in wanted)
    missing = []
    for name in needed:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - any failure to import is a missing package
            missing.append(name)
    return missing


def _required_by(backends: Sequence[str]) -> set[str] | None:
    """The modules these backends require (Backend.requires); None where one
    of them cannot even be loaded here (then the part needs everything)."""
    wanted: set[str] = set()
    for name in backends:
        try:
            wanted.update(registry.all_backends()[name].load().requires)
        except Exception:  # noqa: BLE001 - a backend module that cannot load here
            return None
    return wanted


def packages_its_rows_missed(folder: pathlib.Path, part: defined.Part,
                             on_gpu: bool = False) -> list[str]:
    """The needed packages (Part.needs, and Part.gpu_needs where there is a
    GPU) that the part's UNAVAILABLE rows (the newest of each measurement: a
    rerun's row replaces them) say could not be imported when they ran (a
    machine set up without them)."""
    from lcab import results  # pandas: only when running

    files = sorted((folder / part.folder).glob("*.jsonl"))
    rows = results.newest_rows(results.read_rows(files)) if files else []
    reasons = [row.get("reason") or "" for row in rows if row.get("status") == "UNAVAILABLE"]
    return [name for name in part.packages(on_gpu)
            if any(f"cannot import {name}:" in reason for reason in reasons)]


def _seconds_left(deadline: float | None) -> float:
    """Seconds a run may still take (math.inf without a budget), the stop's
    grace kept inside the budget."""
    return math.inf if deadline is None else deadline - time.monotonic() - STOP_GRACE_S


class _Running:
    """One part in progress: its runs, one after the other, on its GPUs."""

    def __init__(self, part: defined.Part, record: dict, gpu_ids: list[str], cores: list[int]):
        self.part, self.record, self.gpu_ids, self.cores = part, record, gpu_ids, cores
        self.processes: Processes | None = None
        self.entry: dict = {}
        self.index = -1

    def start_next(self, state, folder, commit, extra, deadline, min_run_s, beside) -> str:
        """Start the part's next unfinished run: RUNNING; else the part's
        status, DONE when no run is left, STOPPED when too little time is."""
        part, record = self.part, self.record
        finished = record.get("finished_runs", [])
        self.index = next((i for i in range(self.index + 1, len(part.runs))
                           if i not in finished), None)
        if self.index is None:
            record["status"] = DONE
            state.save()
            return DONE
        seconds = _seconds_left(deadline)
        if seconds < min_run_s:
            record["status"] = STOPPED
            state.save()
            return STOPPED
        launch = launch_of(part.runs[self.index], folder / part.folder, commit, extra,
                           self.gpu_ids)
        print(f"== {_now()} {part.name} ({self.index + 1}/{len(part.runs)}): {part.what}"
              + (f" [beside {', '.join(beside)}]" if beside else "")
              + f"\n{launch.text()}", flush=True)
        self.entry = {"command": launch.text(), "start": _now()}
        if self.cores:
            self.entry["cores"] = spans_text(self.cores)
        if beside:
            self.entry["beside"] = list(beside)
        record["runs"].append(self.entry)
        record["status"] = STOPPED  # until it ends
        state.save()
        self.processes = Processes(launch, None if deadline is None
                                   else time.monotonic() + seconds, self.cores)
        return RUNNING

    def step(self, state, folder, commit, extra, deadline, min_run_s, beside) -> str | None:
        """Poll the current run; when it ends, record it and start the
        next. The part's status once it is over, else None."""
        result = self.processes.poll()
        if result is None:
            return None
        code, at_limit = result
        self.entry.update(end=_now(), exit=code, stopped_at_limit=at_limit)
        print(f"   {self.part.name}: exit {code}"
              f"{' (stopped at the time limit)' if at_limit else ''}", flush=True)
        record = self.record
        if at_limit or code != 0:
            record["status"] = STOPPED if at_limit else FAILED
            state.save()
            return record["status"]
        record.setdefault("finished_runs", []).append(self.index)
        status = self.start_next(state, folder, commit, extra, deadline, min_run_s, beside)
        return None if status == RUNNING else status

    def interrupted(self) -> None:
        if self.entry and "end" not in self.entry:
            self.entry.update(end=_now(), exit="stopped by a signal")


def _print_summaries(folder: pathlib.Path, ran: list[defined.Part]) -> None:
    from lcab.report.summary import summary_text

    for part in ran:
        rows = folder / part.folder
        if rows.exists() and any(rows.glob("*.jsonl")):
            print(f"\n## {part.name}\n\n{summary_text([rows])}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in canonical.SWEEPS:
        raise app.UsageError("give one sweep: " + ", ".join(
            f"{name} ({what})" for name, what in canonical.SWEEPS.items()))
    sweep = argv[1]
    chosen_parts(sweep)  # unknown part names stop here, before anything else
    wants_changed = changed_parts.CHANGED in (PARTS.value or []) + MEASURE_AGAIN.value
    if MEASURE_AGAIN_BACKENDS.value and not MEASURE_AGAIN.value:
        raise app.UsageError("--measure_again_backends needs --measure_again (the parts)")
    if MEASURE_AGAIN_BACKENDS.value and wants_changed:
        raise app.UsageError("'changed' picks each part's backends itself (those whose rows "
                             "predate a change): leave out --measure_again_backends")
    for name in MEASURE_AGAIN_BACKENDS.value:
        try:
            registry.check_backend_name(name)
        except ValueError as error:
            raise app.UsageError(f"--measure_again_backends: {error}") from None
    extra = shlex.split(EXTRA.value)
    found = machine.gpus()
    if LIST.value:
        if wants_changed and not OUT.value:
            raise app.UsageError("'changed' reads a run's rows: give --out (the run's folder)")
        folder = pathlib.Path(OUT.value) if OUT.value else pathlib.Path("OUT")
        changed = changed_among(folder, sweep) if wants_changed else {}
        for part in chosen_parts(sweep, list(changed)):
            print(f"{part.name}  ({part.gpus} GPU{'s' if part.gpus > 1 else ''}): {part.what}")
            if OUT.value and (said := changed_parts.describe(folder / part.folder)):
                print(f"  {said}")
            for run in part.runs:
                ids = [str(i) for i in range(part.gpus)]
                print("  " + launch_of(run, folder / part.folder, COMMIT.value or "COMMIT",
                                       extra, ids).text().replace("\n", "\n  "))
        return 0
    if OUT.value is None and RESULTS_ROOT.value is None and (extra or not found):
        # results/ holds the published runs: a subset or a CPU rehearsal goes elsewhere.
        raise app.UsageError("give --out: a run with --extra, or without a GPU, is not a "
                             "canonical run and does not go into results/")
    root = pathlib.Path(RESULTS_ROOT.value) if RESULTS_ROOT.value else None
    again_wanted = wants_changed or bool(MEASURE_AGAIN.value)
    folder = (pathlib.Path(OUT.value) if OUT.value
              else default_out(sweep, found, root, again=again_wanted))
    commit = _commit()
    if commit.endswith("+dirty") and canonical.is_gpu_run(folder.name):
        # A published row must name the files it measured; "+dirty" names
        # none. By name, wherever the folder lies: a borrowed machine writes
        # into a copy of results/.
        raise app.UsageError(
            f"the tree differs from {commit.removesuffix('+dirty')[:7]} (git status): commit "
            f"first, or give --out outside a canonical run's folder for a rehearsal")
    again_backends: Sequence[str] | Mapping[str, Sequence[str]] = MEASURE_AGAIN_BACKENDS.value
    changed: dict[str, list[str]] = {}
    if wants_changed:
        changed = changed_among(folder, sweep)
        print(f"== changed: {', '.join(changed) or 'no part'} (rows measured before a later "
              "change to their kernel)", flush=True)
        # A part also named outright moves every backend's rows, as named parts do.
        again_backends = {name: backends for name, backends in changed.items()
                          if name not in MEASURE_AGAIN.value}
    parts = chosen_parts(sweep, list(changed))
    again = list(dict.fromkeys(named_parts(MEASURE_AGAIN.value, list(changed))))  # each once
    # SIGTERM (an outer time limit) stops like Ctrl-C: children told, state saved.
    signal.signal(signal.SIGTERM, _interrupt)
    return run_sweep(sweep, folder, parts, commit, extra, BUDGET.value, retry=RETRY.value,
                     min_run_s=MIN_RUN.value, gpus=found, parallel=PARALLEL.value,
                     again=again, again_backends=again_backends,
                     again_only_predating=wants_changed)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def parse_flags(argv: list[str]) -> list[str]:
    """This module's flags; a bad one is a one-line usage error."""
    # absl's help flags, all of them, as the other console scripts take them.
    if any(arg in ("--help", "-h", "-?", "--helpshort", "--helpfull") for arg in argv[1:]):
        print(__doc__.strip() + "\n\nflags:\n" + FLAGS.get_help())
        sys.exit(0)
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
