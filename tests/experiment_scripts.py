"""The scripts under experiments/ (not a package) imported by path, once
each: some define absl flags at import, which a second import would
define again."""

import functools
import importlib.util
import pathlib

_EXPERIMENTS = pathlib.Path(__file__).resolve().parent.parent / "experiments"


@functools.cache
def load(name: str):
    """experiments/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, _EXPERIMENTS / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script
