"""--dry_run: what a sweep would do, decided without running anything.

For every row the run would write it says what happens: `run`, or the
status the runner writes without running (UNAVAILABLE, UNSUPPORTED, ERROR
where the backend's own supports() raises), or `done` when --resume finds
its row settled. The decisions come from the backends' claims (the
registry's load_backend, Backend.directions and Backend.supports), taken
in the runner's order, on each case's own workload: masks are built as the
run builds them, but nothing is compiled, probed or timed. What only
running can tell (a wrong answer, OOM, an error in the kernel) is said
once, at the end. Jobs that torchrun runs one process per rank are listed
as decided at run time: their backends read the process group.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from lcab import registry, results
from lcab.experiments import launch
from lcab.runner import Case, claims_of, describe
from lcab.status import Status
from lcab.workloads import format_seqlen

RUN = "run"
DONE = "done"
AT_RUN_TIME = "at run time"
_PER_RANK = "each torchrun rank decides it"
_AFTER = ("Decided only when the run runs: the correctness probe (MISMATCH), the full-size "
          "check, out of memory (OOM) and errors in the kernels (ERROR).")


def text(jobs: Sequence[launch.Job], resume: bool) -> str:
    """The dry run of `jobs`: one line per row the run would write."""
    blocks, counts = [], collections.Counter()
    for job in jobs:
        block, job_counts = _job_text(job, resume)
        blocks.append(block)
        counts += job_counts
    totals = ", ".join(f"{count} {decision}" for decision, count in counts.items())
    return "\n\n".join([
        "Dry run: nothing runs and no rows are written.", *blocks,
        f"In all: {totals or 'nothing to do'}.\n{_AFTER}"])


def attention_claims(case: Case, backend) -> dict[str, tuple[str, str]]:
    """direction -> (decision, why) of a case whose backend loaded: the
    checks lcab.runner makes before it probes (lcab.runner.claims_of)."""
    claims = claims_of(case, backend)
    decided = {}
    for group, status in ((claims.missing, claims.missing_status),
                          (claims.refused, Status.UNSUPPORTED)):
        if group:
            decided |= {d: (status.value, group[1]) for d in group[0]}
    if claims.failure is not None:  # the runner writes it as an ERROR row
        return decided | {d: (Status.ERROR.value, f"harness: {describe(claims.failure)}")
                          for d in case.directions if d not in decided}
    return decided | {d: (RUN, claims.support.how) for d in claims.directions}


def _job_text(job: launch.Job, resume: bool) -> tuple[str, collections.Counter]:
    done = results.done_keys([job.path], settled_only=True) if resume else set()
    cases, notes = list(job.cases), []
    if job.skip_unavailable and not job.per_rank:
        reasons = {name: launch.left_out(name, job.record_unavailable)
                   for name in dict.fromkeys(c.backend for c in cases)}
        notes += [f"left out (no rows): {name}: {why}"
                  for name, why in reasons.items() if why]
        cases = [case for case in cases if not reasons[case.backend]]
    loaded = _backends(job, cases)
    labels = _mask_labels(cases)
    lines, counts = [], collections.Counter()
    for case in cases:
        claims = _claims(job, case, loaded)
        for part, key in zip(case.parts, case.keys(case.options(job.settings))):
            decision, why = (DONE, "--resume: its settled row is there") if key in done \
                else claims[part]
            lines.append((*_cells(case, part, labels), decision, why))
            counts[decision] += 1
    header = (f"{job.framework} {job.suite}: {sum(counts.values())} rows into {job.path}"
              f"{_shape(cases)}")
    if job.per_rank:
        notes.append(f"torchrun runs this job ({job.ranks} ranks): what its backends can run "
                     "depends on the process group, so each rank decides it when it runs")
    return "\n".join([header, *_aligned(lines, _headings(cases)), *notes]), counts


def _backends(job: launch.Job, cases: Sequence) -> dict:
    """backend name -> the loaded backend, or the Unavailable it raised."""
    if job.per_rank:
        return {}
    loaded = {}
    for name in dict.fromkeys(c.backend for c in cases if isinstance(c, Case)):
        try:
            loaded[name] = registry.load_backend(name, job.settings.options_for(name))
        except registry.Unavailable as exc:
            loaded[name] = exc
    return loaded


def _claims(job: launch.Job, case, loaded: dict) -> dict:
    """part -> (decision, why) for one case, not counting --resume."""
    if job.per_rank:
        return {part: (AT_RUN_TIME, _PER_RANK) for part in case.parts}
    if not isinstance(case, Case):  # a collective: its runtime checks it on the devices
        return {part: (RUN, "its device count and a check on known values come first")
                for part in case.parts}
    backend = loaded[case.backend]
    if isinstance(backend, registry.Unavailable):
        return {part: (Status.UNAVAILABLE.value, str(backend)) for part in case.parts}
    return attention_claims(case, backend)


def _headings(cases: Sequence) -> tuple[str, ...]:
    if cases and not isinstance(cases[0], Case):
        return ("collective", "ranks", "bytes", "decision", "why")
    return ("backend", "mask", "seqlen", "direction", "decision", "why")


def _cells(case, part, labels: dict) -> tuple[str, ...]:
    if not isinstance(case, Case):
        return (f"{case.framework}.{case.op}", str(case.ranks), format_seqlen(part))
    mask = case.workload.mask
    return (case.backend, labels[id(mask)], format_seqlen(case.workload.seqlen_q), part)


def _mask_labels(cases: Sequence) -> dict[int, str]:
    """id of each case's mask -> its name, with the parameters that tell it
    from the other masks of its family and length in the sweep
    (block-sparse masks at several kept fractions and block sizes)."""
    settings: dict[tuple, dict[int, dict]] = collections.defaultdict(dict)
    for case in cases:
        if isinstance(case, Case):
            mask = case.workload.mask
            settings[(mask.name, mask.seqlen_q)][id(mask)] = mask.params
    labels = {}
    for (name, _), masks in settings.items():
        varying = [key for key in dict.fromkeys(k for p in masks.values() for k in p)
                   if len({repr(p.get(key)) for p in masks.values()}) > 1]
        for identity, params in masks.items():
            shown = ",".join(f"{key}={params.get(key)}" for key in varying)
            labels[identity] = f"{name}({shown})" if shown else name
    return labels


def _shape(cases: Sequence) -> str:
    """The sweep's fixed shape, said once (every case of a job shares it)."""
    workloads = {(c.workload.batch, c.workload.heads_q, c.workload.heads_kv,
                  c.workload.head_dim, c.workload.dtype) for c in cases if isinstance(c, Case)}
    if len(workloads) != 1:
        return ""
    batch, heads_q, heads_kv, head_dim, dtype = workloads.pop()
    return f" (batch {batch}, heads {heads_q}:{heads_kv}, head_dim {head_dim}, {dtype})"


def _aligned(rows: list[tuple[str, ...]], headings: tuple[str, ...]) -> list[str]:
    """`rows` under `headings` in columns, the last one unpadded."""
    if not rows:
        return ["  (no rows)"]
    table = [headings, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(headings) - 1)]
    return ["  " + "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]).rstrip()
            for row in table]
