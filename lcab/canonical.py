"""Where the canonical sweeps' committed rows live, and which are newest.

A canonical sweep is one of the named sweeps LCAB publishes (the seed
blog's kernel benchmark, the seed paper's masks, its sparsity sweep, the CP
set). Each run of one on a GPU machine lands in
``results/<date>-<device>-<sweep>/`` (lcab.experiments.canonical writes it,
with its RUN.md). The model reads the newest folder of each sweep; the
results pages read the current run of each card (a newer run on one card
supersedes the older ones there, never another card's), and the README's
headline the most complete of those (lcab.report.sources.headline_folders).
Folders are found from this package's location, so any working directory
will do.
"""

from __future__ import annotations

import json
import pathlib
import re

# The repository root: results/ and experiments/ live there.
ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"

# sweep name -> what it is, in a few words (the names are folder suffixes).
SWEEPS = {
    "blog": "the seed blog's kernel benchmark: six masks, 1k-64k",
    "paper": "the seed paper's static masks, 1k-48k",
    "sparsity": "the seed paper's block-sparse sweeps",
    "cp": "context parallelism: every strategy of both frameworks at cp 2 and 4",
}

# The subfolder of a run holding parts that repeat another part as a cluster
# starts it (multi-process JAX, torchrun nodes): compared with the part they
# repeat in RUN.md, never read into tables (they would stand in for it).
RERUNS = "reruns"

# A run's record of its parts (lcab.experiments.canonical writes it).
STATE_NAME = "parts.json"
DONE = "done"

_FOLDER = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})-(?P<device>[a-z0-9]+(?:x\d+)?)-(?P<sweep>[a-z]+)$")


def folder_name(date: str, device: str, sweep: str) -> str:
    """``<date>-<device>-<sweep>``, e.g. 2026-11-27-h100-blog."""
    if sweep not in SWEEPS:
        raise ValueError(f"unknown sweep {sweep!r}; canonical sweeps: {', '.join(SWEEPS)}")
    name = f"{date}-{device}-{sweep}"
    if not _FOLDER.match(name):
        raise ValueError(f"{name!r} is not <YYYY-MM-DD>-<device>-<sweep> (device: lower-case "
                         "letters and digits, e.g. h100 or h100x4)")
    return name


def parse_folder(name: str) -> tuple[str, str, str] | None:
    """(date, device, sweep) of a canonical results folder's name, else None."""
    match = _FOLDER.match(name)
    if not match or match["sweep"] not in SWEEPS:
        return None
    return match["date"], match["device"], match["sweep"]


def is_gpu_run(name: str) -> bool:
    """Whether a folder named `name` holds a canonical run on GPUs
    (<date>-<device>-<sweep>, the device not "cpu": runs on a CPU are
    rehearsals and never count)."""
    parsed = parse_folder(name)
    return parsed is not None and parsed[1] != "cpu"


def folders(sweep: str, results: pathlib.Path | None = None) -> list[pathlib.Path]:
    """Every committed GPU run of one canonical sweep, newest first: by
    date, then, among runs of one day (on two kinds of card, say), the one
    with more parts done, then by name. Runs on a CPU are rehearsals and
    never count."""
    if sweep not in SWEEPS:
        raise ValueError(f"unknown sweep {sweep!r}; canonical sweeps: {', '.join(SWEEPS)}")
    results = RESULTS if results is None else results  # read when called: tests move it
    found = [path for path in results.glob("*-*-*") if path.is_dir()
             and is_gpu_run(path.name) and parse_folder(path.name)[2] == sweep]
    return sorted(found, key=lambda path: (parse_folder(path.name)[0], parts_done(path),
                                           path.name), reverse=True)


def parts_done(folder: pathlib.Path) -> int:
    """How many parts its parts.json records as done (0 without one)."""
    try:
        record = json.loads((folder / STATE_NAME).read_text())
    except (OSError, ValueError):
        return 0
    return len(done_parts(record))


def done_parts(record: dict) -> set[str]:
    """The names of a parts.json record's parts that are done; a part done
    with --extra flags (a subset) is not."""
    return {name for name, part in record.get("parts", {}).items()
            if part.get("status") == DONE and not part.get("extra")}


def is_rerun(path: pathlib.Path, folder: pathlib.Path) -> bool:
    """Whether `path`, inside a run's `folder`, belongs to a rerun part."""
    return RERUNS in path.relative_to(folder).parts


def newest(sweep: str, results: pathlib.Path | None = None) -> pathlib.Path | None:
    """The newest run of a canonical sweep, or None if none is committed."""
    runs = folders(sweep, results)
    return runs[0] if runs else None


def newest_all(results: pathlib.Path | None = None) -> dict[str, pathlib.Path]:
    """sweep -> its newest committed run, for the sweeps that have one."""
    return {sweep: path for sweep in SWEEPS if (path := newest(sweep, results))}


def card_of(device: str) -> str:
    """The card of a folder's device name, without the GPU count: h200x4 -> h200."""
    return re.sub(r"x\d+$", "", device)


def current(sweep: str, results: pathlib.Path | None = None) -> list[pathlib.Path]:
    """The newest run of the sweep on each card, the one with the most parts
    done first (then the newer). Runs on two cards are both current: their
    numbers never mix, and neither supersedes the other."""
    runs: dict[str, pathlib.Path] = {}
    for path in folders(sweep, results):  # newest first: the first of a card wins
        runs.setdefault(card_of(parse_folder(path.name)[1]), path)
    return sorted(runs.values(), key=lambda path: (parts_done(path), parse_folder(path.name)[0],
                                                   path.name), reverse=True)
