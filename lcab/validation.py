"""The correctness gate: every backend is checked before it is timed.

A probe workload keeps what decides correctness (mask family and the code
path the backend takes for it, dtype, head_dim, GQA ratio) at a size the
float64 reference handles: the workload's own mask when it is short, else
the same mask with its sizes scaled to `backend.probe_seqlen` tokens, else
the family with structure-revealing parameters (lcab.masks.small), whichever
first takes the same path (Support.how) as the timed case; at most two K/V
heads and a batch of at most two.
Queries and keys are drawn with a larger spread than N(0, 1) so attention is
peaked: a kernel that lets one wrong key in then moves its output by O(1),
far beyond rounding error, instead of by 1/row_length.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lcab import reference
from lcab.backend import Backend
from lcab.masks import FAMILIES_BY_NAME, small_mask
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


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Normalised max errors of one probe; bwd covers out and dq, dk, dv."""

    fwd_err: float
    bwd_err: float | None
    tolerance: float
    probe: str  # a short description of the probe workload
    note: str = ""  # set when the probe could not take the timed code path

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
    backend: Backend, workload: Workload, timed_how: str | None = None
) -> tuple[Workload, str]:
    """The probe that runs the same code path (Support.how) as the timed case.

    Returns the probe and a note that is empty unless only a probe taking
    another path was possible (the note then says which).
    """
    if timed_how is None:
        timed_how = backend.supports(workload).how
    fallback = None
    for mask in _probe_masks(workload, backend.probe_seqlen):
        probe = probe_workload(workload, mask, backend.probe_heads_kv(workload))
        support = backend.supports(probe)
        if support.ok and support.how == timed_how:
            return probe, ""
        if support.ok and fallback is None:
            fallback = (probe, f"probe took the path {support.how!r}")
    if fallback is None:
        raise ValueError(f"no correctness probe of {workload.mask.name} is supported")
    return fallback


def _normalised_error(got: np.ndarray, want: np.ndarray) -> float:
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
    fwd_err = _normalised_error(got_out, want_out)
    bwd_err = None
    if backward:
        wants = reference.attention_grads(
            rounded["q"], rounded["k"], rounded["v"], probe.mask, rounded["dout"]
        )
        gots = runtime.forward_backward(
            fn, device["q"], device["k"], device["v"], device["dout"]
        )
        errors = [
            _normalised_error(_to_layout(runtime.to_numpy(got), backend.layout), want)
            for got, want in zip(gots, (want_out, *wants))
        ]
        bwd_err = max(errors)
    description = (
        f"{probe.mask.name} at {sq}x{sk}, b{b}, h{hq}:{hkv}, d{d}, {probe.dtype}"
    )
    return Verdict(fwd_err, bwd_err, TOLERANCE[probe.dtype], description, note)
