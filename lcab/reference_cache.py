"""The full-size check's reference results, kept on disk between processes.

The check (lcab.fullcheck) computes a float32 reference once per workload and
keeps it in memory for the next backend of the same process. A canonical
sweep runs one process per part, and its CP parts at 32k tokens per GPU time
one strategy each, so every part recomputed the same reference at 128k
tokens: the check took 73-98 s of a part's 95-150 s on an H200 (check_s,
2026-11-29), most of it the reference (the compiles are the rest), for the same
numbers each time. With a cache folder (`--reference_cache`), the first
process to need a reference writes it and the others read it.

An entry is named by a hash of everything its values depend on (the check's
key, the direction, the framework, its versions and device, and the source
of the files that make the inputs and the reference), so any change to those
starts a new entry instead of reusing an old one. Writes go to a temporary
name and are renamed into place, so a reader (another rank or process) sees a
whole entry or none. The folder is kept under MAX_BYTES, oldest entries first.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
import warnings
from collections.abc import Sequence

import numpy as np

# Where the canonical sweeps keep it on the machine they run on (not in the
# repository: a 128k entry is about 2.3 GB).
DEFAULT_DIR = pathlib.Path(tempfile.gettempdir()) / "lcab-reference-cache"
# The folder's bound: a few 128k workloads' entries (both tiers, backward).
MAX_BYTES = 24 * 2**30
SUFFIX = ".npz"


def entry_name(parts: Sequence, files: Sequence[str | os.PathLike] = ()) -> str:
    """The entry of a reference: a hash of `parts` (reprs) and of the bytes
    of `files` (the code the values come from)."""
    digest = hashlib.sha256(repr(tuple(parts)).encode())
    for path in files:
        digest.update(pathlib.Path(path).read_bytes())
    return digest.hexdigest()[:40]


def load(folder: str | os.PathLike, name: str) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """(selection arrays, sampled-row arrays) of entry `name`, or None when
    there is none or it cannot be read (then it is removed)."""
    path = pathlib.Path(folder) / f"{name}{SUFFIX}"
    if not path.is_file():
        return None
    try:
        with np.load(path) as stored:
            selection = [stored[f"selection_{i}"] for i in range(int(stored["n_selection"]))]
            sampled = [stored[f"sampled_{i}"] for i in range(int(stored["n_sampled"]))]
    except Exception as exc:  # noqa: BLE001 - a damaged entry is a miss, not a failure
        warnings.warn(f"reference cache: {path} unreadable ({exc}); computing it again")
        path.unlink(missing_ok=True)
        return None
    os.utime(path)  # recently used: evicted last
    return selection, sampled


def save(folder: str | os.PathLike, name: str, selection: Sequence[np.ndarray],
         sampled: Sequence[np.ndarray]) -> None:
    """Write entry `name` whole (a temporary file renamed into place), then
    drop the oldest entries past MAX_BYTES. A failure to write (a full disk)
    costs a warning: the check has its answer either way."""
    folder = pathlib.Path(folder)
    arrays = {f"selection_{i}": np.asarray(a, dtype=np.float32) for i, a in enumerate(selection)}
    arrays |= {f"sampled_{i}": np.asarray(a, dtype=np.float32) for i, a in enumerate(sampled)}
    temporary = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".tmp", delete=False) as handle:
            temporary = pathlib.Path(handle.name)
            np.savez(handle, n_selection=len(selection), n_sampled=len(sampled), **arrays)
        os.replace(temporary, folder / f"{name}{SUFFIX}")
    except OSError as exc:
        warnings.warn(f"reference cache: could not write {name} in {folder} ({exc})")
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        return
    evict(folder, keep=name)


def evict(folder: pathlib.Path, keep: str, max_bytes: int = MAX_BYTES) -> list[str]:
    """Remove the least recently used entries until the folder is within
    max_bytes (never `keep`, the one just written); their names."""
    entries = sorted(folder.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime)
    total = sum(p.stat().st_size for p in entries)
    removed = []
    for path in entries:
        if total <= max_bytes:
            break
        if path.stem == keep:
            continue
        total -= path.stat().st_size
        path.unlink(missing_ok=True)
        removed.append(path.stem)
    return removed
