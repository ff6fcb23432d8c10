"""python -m lcab.trace_overlap TRACE [TRACE ...]: how much of a CP run's
communication its compute hides, read from a profiler trace.

Both frameworks write the Chrome trace-event format: JAX's
`jax.profiler.trace(..., create_perfetto_trace=True)` (perfetto_trace.json.gz)
and torch.profiler's `export_chrome_trace`. Per GPU, the kernels are split
into communication (NCCL kernels, XLA's collectives and peer-to-peer
copies, by name) and compute (every other kernel; copies and memsets
within one GPU count as neither); the busy time of each is the union of its
kernels' intervals, and the hidden communication is the part of it during
which a compute kernel also ran. A ring that overlaps well hides most of its
transfers; an all-gather strategy hides none by design.

Below each overlap table, the kernels that took the most time, per GPU
(summed over the trace; names cut at their template arguments): where a
step's time goes, and whether the GPUs carry the same work.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import pathlib
import re
import sys

import numpy as np

COMMUNICATION = re.compile(
    r"nccl|sendrecv|allgather|all-gather|all_gather|alltoall|all-to-all|all_to_all|"
    r"collective-permute|ppermute|reducescatter|reduce-scatter|memcpyp2p", re.IGNORECASE)
# The copy engine's other work (a copy within one GPU, a memset) is neither:
# counted as compute it made a rank whose inputs were placed from it look
# busier than the others.
LOCAL_COPY = re.compile(r"^mem(?:cpy(?!p2p)|set)", re.IGNORECASE)
# Processes that hold device activity: JAX/XLA's "/device:GPU:0", torch's
# GPU streams (their kernels carry cat "kernel" instead).
_DEVICE_PROCESS = re.compile(r"/device:(?:GPU|TPU):(\d+)")


@dataclasses.dataclass(frozen=True)
class Overlap:
    device: str
    compute_us: float
    communication_us: float
    hidden_us: float

    @property
    def hidden_fraction(self) -> float:
        return self.hidden_us / self.communication_us if self.communication_us else float("nan")


def load_events(path: str | pathlib.Path) -> list[dict]:
    path = pathlib.Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def _union(intervals: list[tuple[float, float]]) -> np.ndarray:
    """Sorted, disjoint [start, end) intervals covering the given ones."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return np.array(merged, dtype=np.float64).reshape(-1, 2)


def _length(intervals: np.ndarray) -> float:
    return float(np.sum(intervals[:, 1] - intervals[:, 0])) if len(intervals) else 0.0


def _intersection(a: np.ndarray, b: np.ndarray) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        low, high = max(a[i, 0], b[j, 0]), min(a[i, 1], b[j, 1])
        total += max(0.0, high - low)
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return total


def device_kernels(events: list[dict]) -> dict[str, list[dict]]:
    """Complete ("X") device events per device name."""
    process_names = {e["pid"]: e["args"]["name"] for e in events
                     if e.get("ph") == "M" and e.get("name") == "process_name"}
    found: dict[str, list[dict]] = {}
    for event in events:
        if event.get("ph") != "X" or not event.get("dur"):
            continue
        process = str(process_names.get(event.get("pid"), ""))
        match = _DEVICE_PROCESS.search(process)
        if match:
            device = f"GPU {match.group(1)}"
        elif event.get("cat") == "kernel":
            device = f"GPU {event.get('args', {}).get('device', event.get('pid'))}"
        else:
            continue
        found.setdefault(device, []).append(event)
    return found


def overlap(events: list[dict]) -> list[Overlap]:
    out = []
    for device, kernels in sorted(device_kernels(events).items()):
        spans = {True: [], False: []}
        for kernel in kernels:
            if LOCAL_COPY.search(kernel.get("name", "")):
                continue
            start = float(kernel["ts"])
            spans[bool(COMMUNICATION.search(kernel.get("name", "")))].append(
                (start, start + float(kernel["dur"])))
        communication, compute = _union(spans[True]), _union(spans[False])
        out.append(Overlap(device, _length(compute), _length(communication),
                           _intersection(communication, compute)))
    return out


def table(overlaps: list[Overlap]) -> str:
    lines = ["| device | compute ms | communication ms | hidden ms | hidden |",
             "|:--|--:|--:|--:|--:|"]
    for o in overlaps:
        lines.append(f"| {o.device} | {o.compute_us / 1e3:.2f} | {o.communication_us / 1e3:.2f} "
                     f"| {o.hidden_us / 1e3:.2f} | {o.hidden_fraction:.0%} |")
    return "\n".join(lines)


def kernel_name(event: dict) -> str:
    """A kernel's name without its template or argument list."""
    return event.get("name", "").split("(")[0].split("<")[0] or "?"


def kernel_times(events: list[dict]) -> dict[str, dict[str, tuple[float, int]]]:
    """Per device, each kernel name's summed duration (us) and call count."""
    out: dict[str, dict[str, tuple[float, int]]] = {}
    for device, kernels in device_kernels(events).items():
        sums: dict[str, tuple[float, int]] = {}
        for kernel in kernels:
            name = kernel_name(kernel)
            total, count = sums.get(name, (0.0, 0))
            sums[name] = (total + float(kernel["dur"]), count + 1)
        out[device] = sums
    return out


def breakdown_table(events: list[dict], top: int = 10) -> str:
    """The `top` kernels by their largest time on any GPU, ms per GPU (and
    calls on the first GPU); the rest summed in one line."""
    times = kernel_times(events)
    devices = sorted(times)

    def us(device: str, name: str) -> float:
        return times[device].get(name, (0.0, 0))[0]

    names = sorted({name for sums in times.values() for name in sums},
                   key=lambda name: (-max(us(d, name) for d in devices), name))
    lines = ["| kernel | calls | " + " | ".join(f"{d} ms" for d in devices) + " |",
             "|:--|--:|" + "--:|" * len(devices)]
    for name in names[:top]:
        cells = " | ".join(f"{us(d, name) / 1e3:.2f}" for d in devices)
        lines.append(f"| {name} | {times[devices[0]].get(name, (0.0, 0))[1]} | {cells} |")
    if len(names) > top:
        rest = [sum(us(d, name) for name in names[top:]) for d in devices]
        lines.append(f"| {len(names) - top} others | | "
                     + " | ".join(f"{us / 1e3:.2f}" for us in rest) + " |")
    return "\n".join(lines)


def find_traces(path: str | pathlib.Path) -> list[pathlib.Path]:
    """A trace file, or every trace under a directory (--profile_dir's
    folders): JAX's perfetto_trace.json.gz (not the TensorBoard copy beside
    it) and torch's rank<N>.trace.json."""
    path = pathlib.Path(path)
    if path.is_file():
        return [path]
    perfetto = sorted(path.rglob("perfetto_trace.json.gz"))
    beside = {trace.parent for trace in perfetto}
    others = [t for t in sorted(path.rglob("*.trace.json*")) if t.parent not in beside]
    return perfetto + others


def main(argv: list[str]) -> int:
    paths = [trace for given in argv for trace in find_traces(given)]
    if not paths:
        print("usage: python -m lcab.trace_overlap TRACE_OR_DIRECTORY [...] (no traces found)",
              file=sys.stderr)
        return 2
    for path in paths:
        events = load_events(path)
        found = overlap(events)
        print(f"{path}\n")
        print(table(found) if found else "no device kernels in this trace (a CPU run?)")
        if found:
            print()
            print(breakdown_table(events))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
