"""The RUN.md of a canonical run, written from its parts.json: what ran,
where, with which code, and whether the cluster-style runs reproduce the
single-process ones."""

from __future__ import annotations

import collections
import pathlib
import re
import statistics

from lcab import canonical, registry, results
from lcab.experiments import canonical_parts as defined
from lcab.experiments import changed_parts

# Within noise: the median of a cluster-style run against the same case's
# single-process median (repeats of one case on one machine differ by a
# few per cent; see docs/harness.md on spread).
SAME_WITHIN = 0.10


def _plain(text: str, folder: pathlib.Path) -> str:
    """Commands as a reader reruns them: paths into the checkout relative to
    it, `python` for the interpreter, OUT for the run's folder (wherever the
    machine that ran them had them)."""
    text = re.sub(r"(?<=[=\s])/\S*/" + re.escape(folder.name) + r"(?=/|\s|$)", "OUT", text)
    text = re.sub(r"(?<=[=\s])/\S*?/(?=experiments/)", "", text)
    return re.sub(r"(^|\s)/\S*/python3?(?=\s)", r"\1python", text, flags=re.MULTILINE)


def _row_counts(folder: pathlib.Path) -> str:
    """Statuses of the rows that stand: a case measured again (a resumed
    ERROR) counts once, as its newest row."""
    rows = results.newest_rows(results.read_rows([folder])) if folder.exists() else []
    counts = collections.Counter(row["status"] for row in rows)
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no rows"


def _case(row) -> tuple:
    """What two runs' rows must share to be the same measurement here."""
    return (row["backend"], row["mask"], row["seqlen"], row["direction"],
            results.options_key(row.get("options")))


def comparison(single: pathlib.Path, cluster: pathlib.Path) -> tuple[list[str], float | None]:
    """Markdown lines comparing two folders' OK rows case by case (the
    cluster-style run's median over the single-process one's), and the
    largest deviation from 1. Each case takes the single-process row of
    the cluster row's own commit where there is one (the same code), else
    the newest, and says which commits it set side by side."""
    def ok_rows(path):
        rows = results.read_rows([path]) if path.exists() else []
        return [r for r in rows if r["status"] == "OK"]

    ours = {_case(r): r for r in results.newest_rows(ok_rows(cluster))}
    singles: dict[tuple, list[dict]] = {}
    for row in ok_rows(single):
        singles.setdefault(_case(row), []).append(row)
    shared = sorted(set(ours) & set(singles))
    if not shared:
        return ["no case has an OK row in both runs yet"], None
    lines = [("| backend | mask | S | direction | single-process ms | this run ms | ratio | "
              "commits |"), "|---|---|---:|---|---:|---:|---:|---|"]
    worst, mixed = 0.0, 0
    for case in shared:
        mine = ours[case]
        commit = results.short_commit(mine.get("git_commit"))
        same = [r for r in singles[case] if results.short_commit(r.get("git_commit")) == commit]
        theirs = results.newest_rows(same or singles[case])[0]
        ratio = mine["median_ms"] / theirs["median_ms"]
        worst = max(worst, abs(ratio - 1))
        if same:
            commits = f"both {commit}"
        else:
            mixed += 1
            commits = f"single {results.short_commit(theirs.get('git_commit'))}, this {commit}"
        lines.append(f"| {case[0]} | {case[1]} | {case[2]} | {case[3]} | "
                     f"{theirs['median_ms']:.3f} | {mine['median_ms']:.3f} | {ratio:.3f} | "
                     f"{commits} |")
    verdict = "within" if worst <= SAME_WITHIN else "NOT within"
    lines.append(f"\n{len(shared)} cases; largest deviation {worst:.1%}, {verdict} "
                 f"{SAME_WITHIN:.0%}."
                 + (f" {mixed} of them set rows of two commits side by side (no single-process "
                    "row of the cluster run's commit): measure both again to compare like "
                    "with like." if mixed else ""))
    return lines, worst


def remeasured(part_folder: pathlib.Path) -> list[str]:
    """Markdown lines setting a part measured again (--measure_again) beside
    the rows it replaced (its `*.before-*.jsonl`): per backend, the new
    median time over the old of every case OK both times, apart where a
    registered change to the backend (lcab.registry.Change) lies between
    the two rows, so what is left shows how closely the sweep reproduces;
    [] for a part never measured again."""
    before = sorted(part_folder.glob("*.before-*.jsonl"))
    if not before:
        return []
    now = [path for path in sorted(part_folder.glob("*.jsonl")) if path not in before]

    def ok(paths):
        rows = results.newest_rows(results.read_rows(paths)) if paths else []
        return {_case(r): r for r in rows if r["status"] == "OK"}

    old, new = ok(before), ok(now)
    groups: dict[tuple[str, bool], list[float]] = {}
    for case in sorted(set(old) & set(new)):
        then, again = old[case], new[case]
        measured = results.parsed_time(again.get("timestamp"))
        changed = any(measured is None or results.parsed_time(change.when) <= measured
                      for change in registry.changes_since(then))
        groups.setdefault((case[0], changed), []).append(
            again["median_ms"] / then["median_ms"])
    if not groups:
        return ["no case is OK both times yet"]
    lines = ["| backend | cases | new / old time, median | range | a change to it between |",
             "|---|---:|---:|---|---|"]
    steady = []
    for (backend, changed), ratios in sorted(groups.items()):
        lines.append(f"| {backend} | {len(ratios)} | {statistics.median(ratios):.3f} | "
                     f"{min(ratios):.3f}-{max(ratios):.3f} | {'yes' if changed else 'no'} |")
        if not changed:
            steady += ratios
    if steady:
        worst = max(abs(ratio - 1) for ratio in steady)
        lines.append(f"\nWithout a change between them, {len(steady)} cases differ by at most "
                     f"{worst:.1%} (one case's time, new over old).")
    return lines


def write_run_md(folder: pathlib.Path, state: dict, parts=()) -> pathlib.Path:
    """RUN.md from parts.json; `parts` adds to the sweep's defined parts
    (what each is, which part it must reproduce)."""
    sweep = state["sweep"]
    parts = list({part.name: part for part in [*defined.parts(sweep), *parts]}.values())
    lines = [f"# {sweep}: {canonical.SWEEPS[sweep]}", "",
             "Written by `python -m lcab.experiments.canonical` after each run; the raw record "
             "is `parts.json` beside this file. Rerun (resuming what is missing):", "",
             f"    python -m lcab.experiments.canonical {sweep} --out=OUT", "", "## Calls", ""]
    machine_before = None
    for number, call in enumerate(state["calls"], 1):
        gpus = call.get("gpus") or []
        budget = f", budget {call['budget_s']} s" if call.get("budget_s") else ""
        extra = f", extra flags `{' '.join(call['extra'])}`" if call.get("extra") else ""
        if call.get("parallel"):
            extra += ", one-GPU parts side by side (--parallel)"
        if call.get("measured_again"):
            extra += (", measured again from the start: "
                      + ", ".join(f"`{name}`" for name in call["measured_again"]))
            only = call.get("measured_again_backends")
            if isinstance(only, dict):  # --measure_again=changed: each part its own
                rows = (" rows measured before a later change" if
                        call.get("measured_again_rows") == changed_parts.CHANGED else "")
                extra += "".join(f"; in `{part}` only " + ", ".join(
                    f"`{name}`" for name in names) + rows for part, names in only.items())
            elif only:
                extra += " (only " + ", ".join(f"`{name}`" for name in only) + ")"
        lines.append(f"{number}. {call['start']}, commit `{call['commit']}`{budget}{extra}")
        machine = (gpus, call.get("versions"))
        if machine == machine_before:
            lines.append("   - the same GPUs and versions as the call before")
            continue
        machine_before = machine
        # nvidia-smi's order: GPU i is CUDA_VISIBLE_DEVICES=i in the commands.
        cards = "; ".join(f"{'GPU %d: ' % i if len(gpus) > 1 else ''}{g.get('name')} serial "
                          f"{g.get('serial')} (driver {g.get('driver_version')})"
                          for i, g in enumerate(gpus)) or "no GPU (CPU)"
        versions = ", ".join(f"{k} {v}" for k, v in (call.get("versions") or {}).items())
        lines += [f"   - {len(gpus)} GPU(s): {cards}", f"   - {versions}"]
    lines += ["", "## Parts", "", "| part | what | status | rows |", "|---|---|---|---|"]
    by_name = {part.name: part for part in parts}
    for name, record in state["parts"].items():
        what = by_name[name].what if name in by_name else ""
        status = record.get("status") or "not run"
        if record.get("extra"):
            status += f" (with `{' '.join(record['extra'])}`)"
        where = by_name[name].folder if name in by_name else name
        lines.append(f"| `{name}` | {what} | {status} | {_row_counts(folder / where)} |")
    lines += ["", "## Commands", ""]
    for name, record in state["parts"].items():
        for run in record["runs"]:
            limit = " (stopped at the time budget; resumed by the next call)" \
                if run.get("stopped_at_limit") else ""
            where = f", CPU cores {run['cores']}" if run.get("cores") else ""
            if run.get("beside"):
                where += ", beside " + ", ".join(f"`{other}`" for other in run["beside"])
            lines += [f"- `{name}`, {run['start']} to {run.get('end', '?')}{where}, exit "
                      f"{run.get('exit', '?')}{limit}:", "", "  ```bash",
                      *("  " + line for line in _plain(run["command"], folder).splitlines()),
                      "  ```", ""]
    for part in parts:
        if part.same_as and part.name in state["parts"]:
            table, _ = comparison(folder / part.same_as, folder / part.folder)
            lines += [f"## `{part.name}` against `{part.same_as}`", "",
                      f"Its rows are in `{part.folder}/`, which tables do not read: they "
                      "check the path a cluster takes, and the single-process part stands in "
                      "the tables.", "", *table, ""]
    for name in state["parts"]:
        where = by_name[name].folder if name in by_name else name
        if table := remeasured(folder / where):
            lines += [f"## `{name}` measured again", "",
                      ("Against the rows it replaced (`*.before-*.jsonl`, still read by the "
                       "tables where no newer row stands):"), "", *table, ""]
    if state.get("notes"):
        lines += ["## Notes", "", *(f"- {note}" for note in state["notes"]), ""]
    path = folder / "RUN.md"
    path.write_text("\n".join(lines) + "\n")
    return path
