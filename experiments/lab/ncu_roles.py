"""Where each warpgroup of a warp-specialized Mosaic GPU kernel spends its
stall samples, from Nsight Compute's per-SASS export
(experiments/lab/backward_profile.sh writes it as sass.csv.gz).

    python3 experiments/lab/ncu_roles.py SASS.csv[.gz]

SASS.csv is `ncu --import REPORT --page source --csv --print-source=sass`:
for each kernel a "Kernel Name" line, a header, then one row per
instruction with its warp-state samples. A Mosaic kernel with a memory
warpgroup lays its code out as: a prologue every warp runs, the compute
warpgroups' code (from `USETMAXREG.TRY_ALLOC`, set_max_registers "increase",
to the first EXIT after it), the memory warpgroup's (from
`USETMAXREG.DEALLOC` to its last EXIT), then the mbarrier waits' retry loops
out of line. Within each part an mbarrier wait (`SYNCS.PHASECHK`, with the
branch after it into its retry loop, where a waiting warp's samples land)
and a wait for wgmma results (`WARPGROUP.DEPBAR`) are told apart from the
rest. A memory warpgroup whose warps wait on every sample holds about its
share of the warps (4 of 12 with two compute warpgroups) of all samples:
that wait costs the tensor cores nothing; the compute warpgroups' mbarrier
waits (operands not yet loaded) would.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import re

PARTS = ("prologue", "compute warpgroups", "memory warpgroup", "retry loops")
KINDS = ("mbarrier wait", "wgmma wait", "other")


def kernels(text: str) -> dict[str, list[tuple[str, int]]]:
    """Kernel name -> its instructions as (SASS text, samples), in address order."""
    found = {}
    for block in re.split(r'^"Kernel Name",', text, flags=re.MULTILINE)[1:]:
        name, table = block.split("\n", 1)
        rows = [row for row in csv.reader(io.StringIO(table)) if row]
        header, body = rows[0], rows[1:]
        source, samples = header.index("Source"), header.index("# Samples")
        found[name.strip().strip(",").strip('"')] = [
            (row[source].strip(), int(row[samples] or 0)) for row in body if len(row) > samples]
    return found


def part_of_each(code: list[str]) -> list[str]:
    """The part of the kernel (PARTS) each instruction belongs to."""
    def first(pattern: str, start: int = 0) -> int:
        return next(i for i in range(start, len(code)) if re.search(pattern, code[i]))

    compute = first(r"USETMAXREG\.TRY_ALLOC")
    memory = first(r"USETMAXREG\.DEALLOC", compute)
    exits = [i for i in range(memory, len(code)) if re.search(r"\bEXIT\b", code[i])]
    retry = exits[-1] + 1 if exits else len(code)
    return [PARTS[0] if i < compute else PARTS[1] if i < memory else PARTS[2] if i < retry
            else PARTS[3] for i in range(len(code))]


def kind_of_each(code: list[str]) -> list[str]:
    """What each instruction is (KINDS): an mbarrier poll and the branch that
    follows it into its retry loop, a wait for wgmma results, or other."""
    kinds = []
    for i, text in enumerate(code):
        polls = "SYNCS.PHASECHK" in text
        into_retry = i > 0 and "SYNCS.PHASECHK" in code[i - 1] and re.search(r"\bBRA\b", text)
        kinds.append(KINDS[0] if polls or into_retry
                     else KINDS[1] if "WARPGROUP.DEPBAR" in text else KINDS[2])
    return kinds


def shares(instructions: list[tuple[str, int]]) -> dict[tuple[str, str], float]:
    """(part, kind) -> per cent of the kernel's samples."""
    code = [text for text, _ in instructions]
    total = sum(samples for _, samples in instructions) or 1
    split: dict[tuple[str, str], float] = {}
    for part, kind, (_, samples) in zip(part_of_each(code), kind_of_each(code), instructions):
        split[part, kind] = split.get((part, kind), 0.0) + 100.0 * samples / total
    return split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sass_csv")
    args = parser.parse_args()
    opener = gzip.open if args.sass_csv.endswith(".gz") else open
    with opener(args.sass_csv, "rt") as handle:
        found = kernels(handle.read())
    names = [name.split("_mosaic")[0] for name in found]
    split = [shares(instructions) for instructions in found.values()]
    print("| % of stall samples | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for part in PARTS:
        print(f"| {part} | " + " | ".join(
            f"{sum(s.get((part, kind), 0.0) for kind in KINDS):.1f}" for s in split) + " |")
        for kind in KINDS:
            print(f"| - {kind} | " + " | ".join(
                f"{s.get((part, kind), 0.0):.1f}" for s in split) + " |")


if __name__ == "__main__":
    main()
