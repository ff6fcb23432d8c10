"""Which kernel and CP strategy for a mask, length and GPU count: each
candidate's expected per-GPU TFLOP/s from its committed row where one was
measured at exactly that point, else from lcab.model, labelled so.

    from lcab.advise import Question, recommend
    recommend(Question(mask="causal_document", seqlen=512 * 1024, gpus=64))

A point is **measured** when a counted row (OK, checked at full size) on
the asked card has the very mask (its fingerprint: family, length,
documents), heads, head_dim and dtype, and, on several GPUs, the same cp
size on one node (the rows come from one host). Everything else is
**modelled**: the strategy's model (lcab.model.strategies) with the
kernel curve of the kernel it runs inside, measured on that card, and the
links fitted to that card's comm rows. A modelled figure carries the
model's error at the nearest measured point of the same backend and
direction (the same mask where there is one; a one-GPU row is left out
of its own curve); where that error exceeds MAX_MODEL_ERROR_PCT, or no
point validates it, the candidate is listed but not ranked. Candidates
rank by the attention step's time, forward plus backward.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from lcab.advise.evidence import CpBackend, Evidence, counted, load, own_options, shown
from lcab.comm import AlphaBeta
from lcab.flops import attention_flops
from lcab.masks import canonical_name, make_mask, taken_params
from lcab.masks.mask import AttnMask
from lcab.model.coverage import CallLog
from lcab.model.network import INFINIBAND_NDR
from lcab.model.strategies import STRATEGIES, Shape, layout, predict
from lcab.model.validation import dispatch_of, ulysses_size_of
from lcab.results import default_options, json_field, options_key
from lcab.status import Status
from lcab.workloads import format_seqlen

FRAMEWORKS = ("jax", "torch")
DIRECTIONS = ("fwd", "bwd")
MAX_MODEL_ERROR_PCT = 25.0
MEASURED, MODELLED = "measured", "modelled"
EXTRAPOLATED = "extrapolated"
# Ends the note of a one-GPU candidate longer than any length its kernel ran:
# the guide tells such cells (nothing measured that long) from refused ones.
MEMORY_NOT_MODELLED = "memory is not modelled"
COLUMNS = ("rank", "framework", "kernel", "strategy", "backend", "dispatch", "layout",
           "fwd_tflops", "bwd_tflops", "fwd_ms", "bwd_ms", "step_ms", "source", "evidence",
           "model_error", "ranked", "note")


@dataclasses.dataclass(frozen=True)
class Question:
    """A user's training setup. mask_params: extra family parameters as
    (name, value) pairs, e.g. (("window", 1024),)."""
    mask: str
    seqlen: int
    gpus: int = 1
    framework: str = "any"
    device: str = "H100"
    gpus_per_node: int = 8
    heads_q: int = 64
    heads_kv: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"
    doc_distribution: str | None = "chatqa2_long_sft"
    doc_sampler: str | None = "magi_pack"
    doc_cap: float | None = None
    mask_params: tuple[tuple[str, object], ...] = ()
    mask_seed: int = 0
    inter_alpha_us: float = INFINIBAND_NDR.alpha_s * 1e6
    inter_gbps: float = INFINIBAND_NDR.beta_bytes_per_s / 1e9
    dispatches: tuple[str, ...] = ("balanced", "zigzag")

    def frameworks(self) -> tuple[str, ...]:
        return FRAMEWORKS if self.framework == "any" else (self.framework,)

    def check(self) -> None:
        """ValueError naming the flag, for a question that cannot be asked."""
        if self.framework not in (*FRAMEWORKS, "any"):
            raise ValueError(f"--framework={self.framework}: one of jax, torch, any")
        for name in ("seqlen", "gpus", "gpus_per_node", "heads_q", "heads_kv", "head_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"--{name}={getattr(self, name)}: must be at least 1")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"--heads={self.heads_q}:{self.heads_kv}: query heads must be a "
                             "multiple of the K/V heads")
        if self.seqlen % self.gpus:
            raise ValueError(f"--seqlen={self.seqlen} does not split over --gpus={self.gpus}")
        self.build_mask()

    def build_mask(self) -> AttnMask:
        name = canonical_name(self.mask)
        params = taken_params(name, distribution=self.doc_distribution,
                              sampler=self.doc_sampler, doc_cap=self.doc_cap)
        params.update(dict(self.mask_params))
        return make_mask(name, self.seqlen, seed=self.mask_seed, **params)

    def shape(self) -> Shape:
        return Shape(self.heads_q, self.heads_kv, self.head_dim, self.dtype)

    def inter(self) -> AlphaBeta:
        return AlphaBeta(self.inter_alpha_us * 1e-6, self.inter_gbps * 1e9)

    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    def text(self) -> str:
        nodes = f" on {self.nodes()} nodes of {self.gpus_per_node}" if self.nodes() > 1 else ""
        return (f"{self.mask} at {format_seqlen(self.seqlen)} tokens on {self.gpus} "
                f"{self.device}{'s' if self.gpus > 1 else ''}{nodes}, heads "
                f"{self.heads_q}:{self.heads_kv}, d={self.head_dim}, {self.dtype}, "
                f"framework {self.framework}")


def recommend(question: Question, evidence: Evidence | None = None) -> pd.DataFrame:
    """Every candidate for `question`, ranked ones first by step time; the
    columns are COLUMNS. Candidates that cannot run the question appear
    with ranked False, no figures and the reason in `note`."""
    question.check()
    evidence = evidence or load(question.device)
    mask = question.build_mask()
    found = _measured(question, evidence, mask)
    measured = {c["backend"] for c in found if c["source"] == MEASURED}
    found += _modelled(question, evidence, mask, measured | {c["backend"] for c in found})
    frame = pd.DataFrame(found, columns=[c for c in COLUMNS if c != "rank"])
    frame = frame.sort_values(["ranked", "step_ms", "framework", "backend"],
                              ascending=[False, True, True, True], na_position="last",
                              kind="stable").reset_index(drop=True)
    ranks = frame["ranked"].cumsum().where(frame["ranked"])
    frame.insert(0, "rank", ranks.astype("Int64"))
    return frame


# ----- measured -----------------------------------------------------------
def _same_point(row: dict, question: Question, fingerprint: str) -> bool:
    return (row.get("mask_fingerprint") == fingerprint and row.get("seqlen") == question.seqlen
            and row.get("heads_q") == question.heads_q and row.get("heads_kv") == question.heads_kv
            and row.get("head_dim") == question.head_dim and row.get("dtype") == question.dtype
            and row.get("batch") == 1 and row.get("framework") in question.frameworks()
            and row.get("direction") in DIRECTIONS)


def _measured(question: Question, evidence: Evidence, mask: AttnMask) -> list[dict]:
    """Candidates from rows at exactly this point (and the reasons of rows
    that did not run it)."""
    if question.gpus > question.gpus_per_node:
        return []  # every row ran on one node
    fingerprint = mask.fingerprint()
    groups: dict[tuple, dict[str, dict]] = {}
    for row in evidence.rows:
        if not _same_point(row, question, fingerprint):
            continue
        if question.gpus == 1 and row.get("suite") != "kernel":
            continue
        if question.gpus > 1 and (row.get("suite") != "cp" or row.get("cp_size") != question.gpus):
            continue
        key = (row["framework"], row["backend"], options_key(own_options(row)),
               _dispatch(row) if question.gpus > 1 else "-")
        groups.setdefault(key, {})[row["direction"]] = row
    found = []
    for (framework, backend, options, dispatch), rows in sorted(groups.items()):
        name = backend if default_options(json_field(options)) else f"{backend} [{options}]"
        first = next(iter(rows.values()))
        strategy = str(first.get("strategy") or "?") if question.gpus > 1 else "-"
        kernel = str(first.get("inner") or "?") if question.gpus > 1 else name
        candidate = _empty(framework, kernel, strategy, name, dispatch, MEASURED)
        size = own_options(first).get("ulysses_size") or ulysses_size_of(first.get("notes"))
        if strategy == "usp" and size is None:
            # The row ran the backend's own Ulysses group, which its row does not give.
            candidate["layout"] = f"USP over {question.gpus} GPUs (the backend's Ulysses group)"
        elif strategy in STRATEGIES:
            candidate["layout"] = layout(strategy, question.gpus, question.heads_kv,
                                         question.gpus_per_node,
                                         ulysses_size=None if size is None else int(size))
        elif strategy != "?" and question.gpus > 1:
            candidate["layout"] = f"{strategy} over {question.gpus} GPUs"
        bad = [r for r in rows.values() if r.get("status") != "OK"]
        unchecked = [r for r in rows.values() if r.get("status") == "OK" and not counted(r)]
        if bad:
            row = bad[0]
            candidate["note"] = f"{row['status']}: {row.get('reason') or 'no reason recorded'}"
        elif unchecked:
            candidate["note"] = "not ranked: no full-size check stands behind its rows"
        for direction, row in rows.items():
            if counted(row):
                candidate[f"{direction}_tflops"] = float(row["tflops"])
                candidate[f"{direction}_ms"] = float(row["median_ms"])
        places = {d: _where(rows[d]) for d in DIRECTIONS if d in rows}
        candidate["evidence"] = (next(iter(places.values())) if len(set(places.values())) == 1
                                 else "; ".join(f"{d} {w}" for d, w in places.items()))
        candidate["ranked"] = not candidate["note"] and _complete(candidate)
        if not candidate["ranked"] and not candidate["note"]:
            candidate["note"] = "not ranked: one direction was not measured here"
        found.append(_finish(candidate))
    return found


def _dispatch(row: dict) -> str:
    """The dispatch a CP row ran ("-" where its notes name none: a row that did not run)."""
    notes = str(row.get("notes") or "")
    return dispatch_of(notes) if "dispatch=" in notes else "-"


def _where(row: dict) -> str:
    return (f"{shown(row.get('_source', ''))}, {row.get('device')}, "
            f"{str(row.get('timestamp'))[:10]}, commit {row.get('git_commit')}")


# ----- modelled -----------------------------------------------------------
def _modelled(question: Question, evidence: Evidence, mask: AttnMask,
              done: set[str]) -> list[dict]:
    found = []
    for framework in question.frameworks():
        if question.gpus == 1:
            for backend in evidence.kernel_backends(framework):
                if backend not in done:
                    found.append(_model_kernel(question, evidence, mask, framework, backend))
            continue
        backends = evidence.cp_backends(framework)
        if not backends:
            candidate = _empty(framework, "-", "-", f"{framework} CP", "-", MODELLED)
            candidate["note"] = (f"no counted {framework} CP row on {evidence.device}: nothing "
                                 "to calibrate the model on")
            found.append(_finish(candidate))
        for backend in backends:
            if backend.backend not in done:
                found.append(_model_cp(question, evidence, mask, backend))
        for backend, strategy in sorted(evidence.unmodelled_cp_backends(framework).items()):
            if backend not in done:
                candidate = _empty(framework, "-", strategy, backend, "-", MODELLED)
                candidate["note"] = (f"not measured at this point, and lcab.model has no form "
                                     f"of its strategy ({strategy})")
                found.append(_finish(candidate))
    return found


def _model_kernel(question, evidence, mask, framework, backend) -> dict:
    candidate = _empty(framework, backend, "-", backend, "-", MODELLED)
    # A curve is read across lengths, never across mask families: a kernel
    # is modelled only on a family it ran here (and said it could run).
    problem = evidence.family_problem(backend, mask.name)
    if problem:
        candidate["note"] = problem
        return _finish(candidate)
    curve = evidence.curve(backend, question.head_dim, question.dtype)
    memory = _memory_problem(evidence.family_rows(backend, mask.name), question.seqlen)
    area = mask.area()
    density = area / float(mask.seqlen_q * mask.seqlen_k)
    outside = []
    for direction in DIRECTIONS:
        if curve is None or direction not in curve.points:
            continue
        flops = attention_flops(area, batch=1, heads_q=question.heads_q,
                                head_dim=question.head_dim, direction=direction)
        tflops = curve.tflops(flops, density, direction)
        candidate[f"{direction}_tflops"] = tflops
        candidate[f"{direction}_ms"] = flops / (tflops * 1e12) * 1e3
        if not (curve.covers(flops, density, direction)
                and curve.has_density(density, direction)):
            outside.append(direction)
    return _judged(candidate, question, evidence, backend, mask, curve, outside, memory)


def _memory_problem(rows: list[dict], seqlen: int) -> str:
    """Why one GPU may not hold `seqlen` (memory is not modelled): an OOM
    row at that length or shorter, or a length past the longest it ran."""
    short_oom = [int(r["seqlen"]) for r in rows if r.get("status") == Status.OOM.value
                 and int(r["seqlen"]) <= seqlen]
    if short_oom:
        return f"it ran out of memory at {format_seqlen(min(short_oom))} on this card"
    longest = max((int(r["seqlen"]) for r in rows if counted(r)), default=0)
    if seqlen > longest:
        return (f"longer than the {format_seqlen(longest)} it ran on this card, and "
                f"{MEMORY_NOT_MODELLED}")
    return ""


def _model_cp(question, evidence, mask, backend: CpBackend) -> dict:
    candidate = _empty(backend.framework, backend.inner, backend.strategy, backend.backend,
                       "-", MODELLED)
    candidate["layout"] = layout(backend.strategy, question.gpus, question.heads_kv,
                                 question.gpus_per_node)
    # The strategy's model takes any mask (exact areas); its inner kernel's
    # curve must come from this family, and a strategy that refused the
    # family here is not modelled on it.
    problem = (evidence.family_problem(backend.backend, mask.name)
               if evidence.family_rows(backend.backend, mask.name) else ""
               ) or evidence.family_problem(backend.inner, mask.name)
    if problem:
        candidate["note"] = problem
        return _finish(candidate)
    curve = evidence.curve(backend.inner, question.head_dim, question.dtype)
    if curve is None or set(DIRECTIONS) - set(curve.points):
        candidate["note"] = (f"no counted single-GPU rows of {backend.inner} on "
                             f"{evidence.device} in both directions to calibrate the model on")
        return _finish(candidate)
    network = evidence.network(backend.framework, question.gpus_per_node, question.inter())
    best, problems = None, []
    for dispatch in question.dispatches:
        calls = CallLog(curve)  # the calls of this dispatch alone
        predicted = {d: predict(backend.strategy, mask, question.gpus, question.shape(), calls,
                                network, dispatch=dispatch, direction=d,
                                memory_bytes_per_s=evidence.memory_bytes_per_s)
                     for d in DIRECTIONS}
        problem = next((p.problem for p in predicted.values() if p.problem), "")
        if problem:
            problems.append(problem)
            continue
        seconds = sum(p.seconds for p in predicted.values())
        if best is None or seconds < best[0]:
            best = (seconds, dispatch, predicted, calls)
    if best is None:
        candidate["note"] = f"cannot run this: {problems[0]}"
        return _finish(candidate)
    _, candidate["dispatch"], predicted, calls = best
    for direction, p in predicted.items():
        candidate[f"{direction}_tflops"] = p.tflops_per_gpu
        candidate[f"{direction}_ms"] = p.seconds * 1e3
    outside = [d for d, c in calls.calls.items() if c.outside]
    return _judged(candidate, question, evidence, backend.backend, mask, curve, outside)


def _judged(candidate, question, evidence, backend, mask, curve, outside,
            memory: str = "") -> dict:
    """The model's figures with their evidence and error: ranked only where
    the nearest measured point holds the model within MAX_MODEL_ERROR_PCT
    (and, on one GPU, where the length is one it held)."""
    if curve is None:
        candidate["note"] = f"no counted rows of {backend} on {evidence.device} to model it"
        return _finish(candidate)
    errors = [_nearest_error(evidence, backend, direction, question, mask.name)
              for direction in DIRECTIONS]
    notes = []
    if memory:
        notes.append(f"not ranked: {memory}")
    if any(e is None for e in errors):
        notes.append("not ranked: no measured point of this backend validates the model")
    else:
        candidate["model_error"] = "; ".join(
            f"{d} {e[0]:+.0f} % at {e[1]}" for d, e in zip(DIRECTIONS, errors))
        worst = max(abs(e[0]) for e in errors)
        if worst > MAX_MODEL_ERROR_PCT:
            notes.append(f"not ranked: the model is off by {worst:.0f} % at the nearest "
                         f"measured point (over {MAX_MODEL_ERROR_PCT:.0f} %)")
    if outside:
        notes.append(f"kernel calls outside the measured sizes or densities "
                     f"({', '.join(outside)}): {EXTRAPOLATED}")
    if question.nodes() > 1:
        notes.append(f"spans {question.nodes()} nodes: links between them are "
                     f"{question.inter_gbps:.0f} GB/s per GPU (--inter_node_gbps), which no "
                     "measured row here checks")
    lengths = ", ".join(format_seqlen(n) for n in curve.lengths)
    folders = ", ".join(evidence.curve_folders(curve.backend, question.head_dim,
                                               question.dtype))
    candidate["evidence"] = (f"lcab.model on {curve.backend}'s curve ({curve.device}, "
                             f"{sum(curve.counts().values())} rows at {lengths} from {folders})")
    if candidate["strategy"] != "-":
        _, links = evidence.links(candidate["framework"], question.gpus_per_node,
                                  question.inter())
        candidate["evidence"] += (f"; links inside a node fitted to {len(links.rows)} "
                                  f"{candidate['framework']} comm rows" if links.rows else
                                  "; links inside a node: lcab.model's NVLink constants (no "
                                  f"{candidate['framework']} comm rows on this card)")
    candidate["note"] = "; ".join(notes)
    candidate["ranked"] = (not any(n.startswith("not ranked") for n in notes)
                           and _complete(candidate))
    return _finish(candidate)


def _nearest_error(evidence: Evidence, backend: str, direction: str, question: Question,
                   mask_name: str) -> tuple[float, str] | None:
    """(error %, where) of the model at the measured point of `backend`
    nearest the question: the same mask first, then the nearest cp size
    and length (on a log scale)."""
    frame = evidence.validation
    if frame.empty:
        return None
    mine = frame[(frame["backend"] == backend) & (frame["direction"] == direction)]
    if mine.empty:
        return None
    distance = ((mine["mask"] != mask_name) * 100.0
                + np.abs(np.log2(mine["cp"].astype(float) / question.gpus))
                + np.abs(np.log2(mine["seqlen"].astype(float) / question.seqlen)))
    best = mine.loc[distance.idxmin()]
    cp = f", cp {best['cp']}" if best["cp"] > 1 else ", 1 GPU"
    other = "" if best["mask"] == mask_name else " (another mask: none of this one measured)"
    return (float(best["error_pct"]),
            f"{best['mask']} {format_seqlen(int(best['seqlen']))}{cp}{other}")


# ----- rows ---------------------------------------------------------------
def _empty(framework, kernel, strategy, backend, dispatch, source) -> dict:
    return {"framework": framework, "kernel": kernel, "strategy": strategy, "backend": backend,
            "dispatch": dispatch, "layout": "one GPU" if strategy == "-" else "",
            "fwd_tflops": math.nan, "bwd_tflops": math.nan, "fwd_ms": math.nan,
            "bwd_ms": math.nan, "step_ms": math.nan, "source": source, "evidence": "",
            "model_error": "", "ranked": False, "note": ""}


def _complete(candidate: dict) -> bool:
    return all(math.isfinite(candidate[f"{d}_ms"]) for d in DIRECTIONS)


def _finish(candidate: dict) -> dict:
    if _complete(candidate):
        candidate["step_ms"] = candidate["fwd_ms"] + candidate["bwd_ms"]
    return candidate
