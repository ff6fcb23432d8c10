"""What `python -m lcab.experiments` runs when a setting is not given: a
named sweep's flagfile, the only place its values are written.

Without a GPU it is experiments/cpu_smoke.flags (a CPU sweep of well under a minute);
with one, experiments/seed_kernels.flags (the seed blog's kernel sweep). A
flag given on the command line or in a --flagfile always wins. The files are
found from this package's location, so any working directory will do.
"""

from __future__ import annotations

import pathlib
import shutil

from lcab.canonical import ROOT  # experiments/ lives there
from lcab.experiments import flagfiles

CPU_FLAGFILE = ROOT / "experiments" / "cpu_smoke.flags"
GPU_FLAGFILE = ROOT / "experiments" / "seed_kernels.flags"


def has_gpu() -> bool:
    """A GPU is visible to this machine (without importing a framework)."""
    return shutil.which("nvidia-smi") is not None


def flagfile() -> pathlib.Path:
    """The preset flagfile of this machine."""
    return GPU_FLAGFILE if has_gpu() else CPU_FLAGFILE


def read(path: pathlib.Path) -> dict[str, str]:
    """flag name -> value text of a flagfile, its --flagfile includes read in
    place, each relative to the flagfile naming it (a later line wins, as
    in absl). A relative `path` is taken from the repository root.
    `--name` reads as "true" and `--noname` as name -> "false", absl's
    spelling of boolean flags."""
    path = pathlib.Path(path)
    if not path.is_absolute():
        path = ROOT / path
    if not path.exists():
        raise FileNotFoundError(
            f"no preset flagfile at {path} (is lcab installed without its experiments/ "
            "directory?); give the sweep's settings as flags or with --flagfile")
    values: dict[str, str] = {}
    for argument in flagfiles.arguments(path):
        name, equals, text = argument.lstrip("-").partition("=")
        if equals:
            values[name] = text
        elif name.startswith("no"):
            values[name[2:]] = "false"
        else:
            values[name] = "true"
    return values


def current() -> dict[str, str]:
    """The preset of this machine: flag name -> value text."""
    return read(flagfile())
