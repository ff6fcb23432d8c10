"""Summary of the GPU full-size conformance suite's rows (one JSON line per case):

    python3 experiments/conformance_summary.py conformance.jsonl

A markdown table, one line per backend: cases run, cases that failed, the
largest normalised error forward (out) and backward (out, dq, dk, dv) over
its passing cases, and the failing cases by name.
"""

from __future__ import annotations

import collections
import json
import sys


def main(path: str) -> None:
    cases = [json.loads(line) for line in open(path) if line.strip()]
    by_backend = collections.defaultdict(list)
    for case in cases:
        by_backend[case["backend"]].append(case)
    devices = sorted({case["device"] for case in cases})
    print(f"{len(cases)} cases on {', '.join(devices) or 'no device'}\n")
    print("| backend | cases | failed | max err fwd | max err bwd | failing cases |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for backend, mine in sorted(by_backend.items()):
        failing = [c for c in mine if not all(c["ok"].values())]
        fwd = [c["errors"]["out"] for c in mine if c["ok"].get("fwd")]
        bwd = [max(c["errors"].values()) for c in mine if c["ok"].get("bwd")]
        names = ", ".join(f"{c['mask']} {c['seqlen']} {c['heads']} {c['dtype']} "
                          f"({'/'.join(d for d, ok in c['ok'].items() if not ok)})"
                          for c in failing)
        print(f"| {backend} | {len(mine)} | {len(failing)} | "
              f"{max(fwd, default=float('nan')):.2g} | {max(bwd, default=float('nan')):.2g} | "
              f"{names} |")


if __name__ == "__main__":
    main(sys.argv[1])
