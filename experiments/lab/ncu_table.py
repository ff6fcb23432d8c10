"""The counters of an Nsight Compute raw CSV that say what each kernel waits
on, one column per kernel (experiments/lab/backward_profile.sh).

    python3 experiments/lab/ncu_table.py RAW.csv [--stalls=8]

RAW.csv is `ncu --import REPORT --page raw --csv`: a row of metric names, a
row of their units, then one row per profiled kernel. Printed: the kernel's
time, registers, throughput against the SM's and memory's peaks, the
tensor pipe's active share, issue activity, and its warps' largest stall
reasons (cycles a warp spends stalled per issued instruction, by reason).
"""

from __future__ import annotations

import argparse
import csv
import re

# (label, metric name pattern): the first column matching each is shown.
SHOWN = (
    ("time", r"^gpu__time_duration\.sum$"),
    ("registers / thread", r"^launch__registers_per_thread$"),
    ("grid", r"^launch__grid_size$"),
    ("SM throughput %", r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$"),
    ("memory throughput %",
     r"^gpu__compute_memory_throughput\.avg\.pct_of_peak_sustained_elapsed$"),
    ("DRAM throughput %", r"^dram__throughput\.avg\.pct_of_peak_sustained_elapsed$"),
    ("L2 hit %", r"^lts__t_sector_hit_rate\.pct$"),
    ("tensor pipe active % (wgmma)",
     r"^sm__pipe_tensor_op_gmma_cycles_active\.avg\.pct_of_peak_sustained_active$"),
    ("tensor pipe active % (any)",
     r"^sm__pipe_tensor_cycles_active\.avg\.pct_of_peak_sustained_active$"),
    ("issue active %", r"^smsp__issue_active\.avg\.pct_of_peak_sustained_active$"),
    ("local memory loads (sectors)", r"^l1tex__t_sectors_pipe_lsu_mem_local_op_ld\.sum$"),
    ("local memory stores (sectors)", r"^l1tex__t_sectors_pipe_lsu_mem_local_op_st\.sum$"),
    ("shared bank conflicts", r"^l1tex__data_bank_conflicts_pipe_lsu_mem_shared\.sum$"),
)
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")


def read(path: str) -> tuple[list[str], list[str], list[list[str]]]:
    with open(path, newline="") as handle:
        rows = [row for row in csv.reader(handle) if row]
    start = next(i for i, row in enumerate(rows) if "Kernel Name" in row)
    return rows[start], rows[start + 1], rows[start + 2:]


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw_csv")
    parser.add_argument("--stalls", type=int, default=8, help="Stall reasons shown.")
    args = parser.parse_args()
    names, units, kernels = read(args.raw_csv)
    title = [f"{row[names.index('Kernel Name')].split('_mosaic')[0]} #{row[names.index('ID')]}"
             for row in kernels]
    print("| counter | " + " | ".join(title) + " |")
    print("|---|" + "---:|" * len(kernels))
    for label, pattern in SHOWN:
        column = next((i for i, name in enumerate(names) if re.match(pattern, name)), None)
        if column is not None:
            unit = f" ({units[column]})" if units[column] else ""
            print(f"| {label}{unit} | " + " | ".join(row[column] for row in kernels) + " |")
    stalls = {m.group(1): i for i, name in enumerate(names) if (m := STALL.match(name))}
    total = {reason: sum(number(row[i]) or 0.0 for row in kernels)
             for reason, i in stalls.items()}
    for reason in sorted(total, key=total.get, reverse=True)[:args.stalls]:
        cells = " | ".join(row[stalls[reason]] for row in kernels)
        print(f"| stall: {reason} (cycles per issue) | {cells} |")


if __name__ == "__main__":
    main()
