"""The correctness gate: every backend is checked before it is timed.

A probe workload keeps what decides correctness (mask family and the code
path the backend takes for it, dtype, head_dim, GQA ratio) at a size the
float64 reference handles: the workload's own mask when it is short, else
the same mask with its sizes scaled to `backend.probe_seqlen` tokens, else
the family with structure-revealing parameters (lcab.masks.small), whichever
first takes the same path (Support.how) as the timed case; at most two K/V
heads and a batch of at most two.

A backend whose kernels pipeline over tiles declares what its probe must
reach (Backend.probe_needs): then the probe is the shortest unaligned
length, up to MAX_SIZED_PROBE, at which one of those masks makes every
pass's busiest program visit enough tiles and see enough runs of unmasked
tiles (each as far as the timed case does), and the backend pinned to the
timed case's own decisions (Backend.pinned_to) runs it. A probe that falls
short says so in the row's notes.
Queries and keys are drawn with a larger spread than N(0, 1) so attention is
peaked: a kernel that lets one wrong key in then moves its output by O(1),
far beyond rounding error, instead of by 1/row_length.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from lcab import reference
from lcab.backend import Backend, ProbeNeeds
from lcab.masks import FAMILIES_BY_NAME, AttnMask, small_mask
from lcab.masks.schedule import FULL
from lcab.masks.small import scaled_mask
from lcab.runtime import Runtime
from lcab.workloads import Workload

# Max error allowed, relative to the largest magnitude in the reference
# tensor, per input dtype. Low precision stores P and the output rounded.
TOLERANCE = {"float32": 5e-3, "float16": 1.5e-2, "bfloat16": 4e-2}
PROBE_SPREAD = 2.0  # std of q and k entries: scores have std PROBE_SPREAD**2
_MAX_CUSTOM_PROBE = 2048  # a hand-built mask is probed as it is up to this size
# A workload up to this many probe lengths long is probed with its own mask.
_OWN_MASK_PROBE_FACTOR = 4
# Longest probe sized by Backend.probe_needs (the float64 reference is dense).
MAX_SIZED_PROBE = 2560


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Normalised max errors of one probe; bwd covers out and dq, dk, dv."""

    fwd_err: float
    bwd_err: float | None
    tolerance: float
    probe: str  # a short description of the probe workload
    note: str = ""  # set when the probe could not take the timed code path
    # The probe's backward raised (its forward ran): the bwd row fails with
    # it, the fwd row does not.
    bwd_failure: Exception | None = None
    # The probe workload, its error per tensor (out, of the forward alone or
    # of fwd+bwd when the backward ran, then dq, dk, dv) and the seconds it
    # took: a workload that is its own probe was checked in full by it
    # (lcab.runner.probe_as_check).
    workload: Workload | None = None
    errors: dict[str, float] = dataclasses.field(default_factory=dict)
    seconds: float | None = None

    def ok(self, direction: str) -> bool:
        err = self.error(direction)
        return err is not None and err <= self.tolerance

    def error(self, direction: str) -> float | None:
        return self.fwd_err if direction == "fwd" else self.bwd_err


def _probe_masks(workload: Workload, seqlen: int):
    """Candidate probe masks, most faithful to the timed workload first."""
    mask = workload.mask
    if mask.name not in FAMILIES_BY_NAME:
        if max(mask.seqlen_q, mask.seqlen_k) > _MAX_CUSTOM_PROBE:
            raise ValueError(
                f"cannot probe custom mask {mask.name!r} of {mask.seqlen_q} x "
                f"{mask.seqlen_k}: only registered families are probed at small size"
            )
        yield mask
        return
    if mask.seqlen_q <= _OWN_MASK_PROBE_FACTOR * seqlen:
        yield mask
    else:
        yield scaled_mask(mask, seqlen)
    yield small_mask(mask.name, seqlen)


def probe_workload(workload: Workload, mask, heads_kv: int | None = None) -> Workload:
    """The small workload that stands in for `workload` in the gate."""
    heads_kv = min(workload.heads_kv, 2) if heads_kv is None else heads_kv
    return dataclasses.replace(
        workload,
        batch=min(workload.batch, 2),
        heads_kv=heads_kv,
        heads_q=heads_kv * workload.gqa_ratio,
        seqlen_q=mask.seqlen_q,
        seqlen_k=mask.seqlen_k,
        mask=mask,
    )


def choose_probe(
    backend: Backend, workload: Workload, timed_how: str | None = None, sized: bool = True
) -> tuple[Workload, str]:
    """The probe that runs the same code path (Support.how) as the timed case.

    Returns the probe and a note that is empty unless only a probe taking
    another path, or one short of the backend's ProbeNeeds, was possible
    (the note then says which). `sized` False leaves the backend's
    ProbeNeeds aside: where the full-size check (lcab.fullcheck) runs the
    timed workload itself, a probe sized to reach its pipelines repeats it.
    """
    if timed_how is None:
        timed_how = backend.supports(workload).how
    needs = backend.probe_needs(workload) if sized else None
    if needs is not None and workload.mask.name in FAMILIES_BY_NAME:
        if max(workload.seqlen_q, workload.seqlen_k) > MAX_SIZED_PROBE:
            return _sized_probe(backend, workload, needs, timed_how)
        # Short enough to be probed as itself: the timed pipelines exactly.
        probe = probe_workload(workload, workload.mask, backend.probe_heads_kv(workload))
        if backend.supports(probe).how == timed_how:
            return probe, ""
    return _first_probe(backend, workload, timed_how)


def _first_probe(backend: Backend, workload: Workload, timed_how: str, note: str = ""):
    """The first of _probe_masks that takes the timed path (with `note`),
    else the first the backend runs at all (with a note saying so)."""
    fallback = None
    for mask in _probe_masks(workload, backend.probe_seqlen):
        probe = probe_workload(workload, mask, backend.probe_heads_kv(workload))
        support = backend.supports(probe)
        if support.ok and support.how == timed_how:
            return probe, note
        if support.ok and fallback is None:
            fallback = (probe, f"probe took the path {support.how!r}")
    if fallback is None:
        raise ValueError(f"no correctness probe of {workload.mask.name} is supported")
    return fallback


@dataclasses.dataclass(frozen=True)
class Reach:
    """How far a mask's tiles go on one pass of one tiling: the most tiles
    one program visits and the most separate runs of unmasked tiles in one
    program (by_q: forward and dQ programs, one per query block; by_k:
    dK/dV programs, one per K/V block)."""

    tiles: int
    runs: int


def reach(mask: AttnMask, block_q: int, block_k: int) -> tuple[Reach, Reach]:
    """(by_q, by_k) Reach of `mask` tiled block_q x block_k."""
    schedule = mask.block_schedule(block_q, block_k)
    return _reach_of(schedule), _reach_of(schedule.transposed())


def _reach_of(schedule) -> Reach:
    if len(schedule.q_block) == 0:
        return Reach(0, 0)
    tiles = np.bincount(schedule.q_block).max()
    full = schedule.state == FULL
    owner, block = schedule.q_block[full], schedule.k_block[full]
    starts = np.ones(len(owner), dtype=bool)  # a full tile not right after its row's last
    starts[1:] = (owner[1:] != owner[:-1]) | (block[1:] != block[:-1] + 1)
    runs = np.bincount(owner[starts]).max() if starts.any() else 0
    return Reach(int(tiles), int(runs))


def _targets_of(mask: AttnMask, needs: ProbeNeeds) -> list[Reach]:
    """Per tiling and pass, what the probe must reach: the needs, capped
    by what the timed mask itself reaches."""
    wanted = []
    for tiling in _tilings(needs):
        for timed in reach(mask, *tiling):
            wanted.append(Reach(min(needs.min_tiles, timed.tiles),
                                min(needs.min_full_runs, timed.runs)))
    return wanted


def _tilings(needs: ProbeNeeds) -> list[tuple[int, int]]:
    return list(dict.fromkeys(needs.tilings))  # each once, in order


def _shortfall(mask: AttnMask, needs: ProbeNeeds, wanted: list[Reach]) -> list[str]:
    """What `mask` fails to reach of `wanted` (empty: it meets every target)."""
    missing = []
    passes = [(tiling, name) for tiling in _tilings(needs) for name in ("forward/dQ", "dK/dV")]
    got = [r for tiling in _tilings(needs) for r in reach(mask, *tiling)]
    for (tiling, name), have, want in zip(passes, got, wanted):
        where = f"{name} at {tiling[0]}x{tiling[1]}"
        if have.tiles < want.tiles:
            missing.append(f"{where}: {have.tiles} of {want.tiles} tiles per program")
        if have.runs < want.runs:
            missing.append(f"{where}: {have.runs} of {want.runs} runs of unmasked tiles")
    blocks = {block for tiling in needs.tilings for block in tiling}
    if needs.unaligned and any(mask.seqlen_q % block == 0 for block in blocks):
        missing.append(f"length {mask.seqlen_q} is a multiple of a block")
    return missing


def _sized_lengths(needs: ProbeNeeds) -> list[int]:
    """Candidate probe lengths, shortest first: from min_tiles of the largest
    block on, never a multiple of a block when `unaligned` (blocks are
    even, so an odd length)."""
    block = max(max(tiling) for tiling in needs.tilings)
    length = needs.min_tiles * block + (block // 2 + 1 if needs.unaligned else 0)
    lengths = []
    while length <= MAX_SIZED_PROBE:
        lengths.append(length)
        length = 2 * length - (1 if needs.unaligned else 0)
    return lengths or [MAX_SIZED_PROBE - (0 if not needs.unaligned else 1)]


def _sized_masks(mask: AttnMask, seqlen: int):
    """Stand-ins of `mask` at `seqlen`, most faithful first: every size
    scaled; windows, blocks and prefixes kept at their timed size (documents
    scaled); the family's structure-revealing parameters."""
    yield scaled_mask(mask, seqlen)
    try:
        yield scaled_mask(mask, seqlen, keep_sizes=True)
    except ValueError:
        pass  # a kept size does not fit this length
    yield small_mask(mask.name, seqlen)


def stand_in(mask: AttnMask, seqlen: int, needs: ProbeNeeds) -> AttnMask:
    """`mask` at `seqlen` tokens reaching what `needs` asks of it (as far as
    `mask` itself does), else the candidate that misses least."""
    wanted = _targets_of(mask, needs)
    ranked = sorted(_sized_masks(mask, seqlen),
                    key=lambda m: len(_shortfall(m, needs, wanted)))
    return ranked[0]


def _sized_probe(backend: Backend, workload: Workload, needs: ProbeNeeds,
                 timed_how: str) -> tuple[Workload, str]:
    """The shortest probe of Backend.probe_needs that takes the timed path."""
    wanted = _targets_of(workload.mask, needs)
    best = None
    for seqlen in _sized_lengths(needs):
        for mask in _sized_masks(workload.mask, seqlen):
            probe = probe_workload(workload, mask, backend.probe_heads_kv(workload))
            if seqlen > MAX_SIZED_PROBE // 2:  # the float64 reference's memory
                probe = dataclasses.replace(probe, batch=1)
            support = backend.supports(probe)
            if not (support.ok and support.how == timed_how):
                continue
            missing = _shortfall(mask, needs, wanted)
            if not missing:
                return probe, ""
            if best is None or len(missing) < len(best[1]):
                best = (probe, missing)
    if best is None:
        return _first_probe(backend, workload, timed_how,
                            "probe could not be sized to the timed pipelines")
    probe, missing = best
    return probe, f"probe ({probe.seqlen_q} tokens) short of the timed pipelines: " + "; ".join(
        missing)


def normalised_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|, infinite where got is not finite."""
    if not np.all(np.isfinite(got)):
        return float("inf")
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-6)
    return float(np.max(np.abs(got - want), initial=0.0)) / scale


def _to_layout(array: np.ndarray, layout: str) -> np.ndarray:
    return array if layout == "bshd" else np.swapaxes(array, 1, 2)


def check(
    backend: Backend, runtime: Runtime, workload: Workload, *, backward: bool, seed: int = 0
) -> Verdict:
    """Run the backend on the probe of `workload` and compare with lcab.reference."""
    probe, note = choose_probe(backend, workload)
    return check_probe(backend, runtime, probe, note=note, backward=backward, seed=seed)


def check_probe(
    backend: Backend, runtime: Runtime, probe: Workload, *, note: str = "", backward: bool,
    seed: int = 0,
) -> Verdict:
    """Run the backend on a chosen probe workload and compare with lcab.reference."""
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    b, sq, sk, hq, hkv, d = (
        probe.batch, probe.seqlen_q, probe.seqlen_k, probe.heads_q, probe.heads_kv, probe.head_dim
    )
    host = {
        "q": rng.standard_normal((b, sq, hq, d)) * PROBE_SPREAD,
        "k": rng.standard_normal((b, sk, hkv, d)) * PROBE_SPREAD,
        "v": rng.standard_normal((b, sk, hkv, d)),
        "dout": rng.standard_normal((b, sq, hq, d)),
    }
    device = {
        name: runtime.from_numpy(_to_layout(array, backend.layout), probe.dtype)
        for name, array in host.items()
    }
    # The reference sees exactly the rounded values the kernel sees.
    rounded = {
        name: _to_layout(runtime.to_numpy(array), backend.layout)
        for name, array in device.items()
    }
    fn = backend.build(probe)
    want_out, _ = reference.attention(rounded["q"], rounded["k"], rounded["v"], probe.mask)
    got_out = _to_layout(
        runtime.to_numpy(runtime.forward(fn, device["q"], device["k"], device["v"])),
        backend.layout,
    )
    fwd_err = normalised_error(got_out, want_out)
    errors = {"out": fwd_err}
    bwd_err = bwd_failure = None
    if backward:
        try:
            gots = runtime.forward_backward(
                fn, device["q"], device["k"], device["v"], device["dout"]
            )
        except Exception as exc:  # noqa: BLE001 - the backward's own failure
            runtime.cleanup()
            bwd_failure = exc
        else:
            wants = reference.attention_grads(
                rounded["q"], rounded["k"], rounded["v"], probe.mask, rounded["dout"]
            )
            errors.update(
                (name, normalised_error(_to_layout(runtime.to_numpy(got), backend.layout), want))
                for name, got, want in zip(("out", "dq", "dk", "dv"), gots, (want_out, *wants))
            )
            bwd_err = max(errors.values())
    description = (
        f"{probe.mask.name} at {sq}x{sk}, b{b}, h{hq}:{hkv}, d{d}, {probe.dtype}"
    )
    return Verdict(fwd_err, bwd_err, TOLERANCE[probe.dtype], description, note, bwd_failure,
                   workload=probe, errors=errors, seconds=time.perf_counter() - start)
