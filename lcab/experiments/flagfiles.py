"""Flagfiles read the way absl reads them, except where an include is found.

absl resolves every --flagfile against the working directory, so a named
sweep including `--flagfile=common.flags` would only work from one folder.
Here a --flagfile named inside a flagfile is found relative to that
flagfile's folder; one given on the command line stays relative to the
working directory. The CLI expands every --flagfile before absl parses
(`parse_flags`), so absl never sees one; a missing file, a cycle or a line
that is no flag is a one-line error naming the file.

Within a file, as in absl: blank lines and lines starting with # or // are
skipped, every other line (stripped) is one argument, a later value wins.
"""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Sequence

_DIRECTIVES = ("--flagfile", "-flagfile")


class FlagfileError(ValueError):
    """A flagfile that cannot be read: missing, in a cycle, or malformed."""


class MissingFlagfile(FlagfileError, FileNotFoundError):
    """A --flagfile names a file that does not exist."""


def expand(argv: Sequence[str], cwd: str | os.PathLike | None = None) -> list[str]:
    """`argv` (without the program name) with every --flagfile replaced by
    its file's arguments, includes expanded in place. Relative paths on the
    command line are taken from `cwd` (default: the working directory)."""
    base = pathlib.Path(cwd) if cwd is not None else pathlib.Path.cwd()
    expanded: list[str] = []
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--":  # absl stops reading flags here, and so do we
            return [*expanded, arg, *rest]
        if arg in _DIRECTIVES:
            if not rest:
                raise FlagfileError(f"{arg} is given without a file")
            arg = f"{arg}={rest.pop(0)}"
        name = _named_file(arg)
        if name is None:
            expanded.append(arg)
        else:
            expanded += _read(_resolve(name, base, arg), ())
    return expanded


def arguments(path: str | os.PathLike) -> list[str]:
    """The arguments of one flagfile, its includes expanded (lcab.experiments.presets)."""
    return _read(pathlib.Path(path).expanduser().absolute(), ())


def parse_flags(argv: Sequence[str]) -> list[str]:
    """absl's flags_parser for app.run: expand the flagfiles, then parse as
    absl does (its usage message on a bad flag). A flagfile that cannot be
    read ends the program with one line naming it."""
    from absl import app

    try:
        expanded = expand(argv[1:])
    except FlagfileError as exc:
        sys.stderr.write(f"FATAL Flags parsing error: {exc}\n")
        sys.exit(1)
    return app.parse_flags_with_usage([argv[0], *expanded])


def _named_file(arg: str) -> str | None:
    """The file of a --flagfile=PATH argument, else None."""
    for directive in _DIRECTIVES:
        if arg.startswith(f"{directive}="):
            return arg[len(directive) + 1:].strip()
    return None


def _resolve(name: str, base: pathlib.Path, where: str) -> pathlib.Path:
    if not name:
        raise FlagfileError(f"{where}: --flagfile names no file")
    path = pathlib.Path(name).expanduser()
    # normpath, not resolve: messages show the path as named, without "sub/.."
    return pathlib.Path(os.path.normpath(path if path.is_absolute() else base / path))


def _read(path: pathlib.Path, including: tuple[pathlib.Path, ...]) -> list[str]:
    """The arguments of the flagfile at `path`, included by the chain
    `including` (outermost first)."""
    named_by = f" (named in {including[-1]})" if including else ""
    if not path.is_file():
        problem = "is not a file" if path.exists() else "does not exist"
        raise MissingFlagfile(f"flagfile {path} {problem}{named_by}")
    real = path.resolve()
    if real in {p.resolve() for p in including}:
        chain = " -> ".join(str(p) for p in (*including, path))
        raise FlagfileError(f"flagfile {path} includes itself: {chain}")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise FlagfileError(f"flagfile {path} cannot be read{named_by}: {exc}") from None
    arguments: list[str] = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", "//")):
            continue
        if not line.startswith("-"):
            raise FlagfileError(f"{path}:{number}: {line!r} is not a --flag")
        if line.split()[0] in _DIRECTIVES:  # absl would take the line as one unknown flag
            raise FlagfileError(f"{path}:{number}: write {line.split()[0]}=PATH on one line")
        name = _named_file(line)
        if name is None:
            arguments.append(line)
        else:  # an include: relative to this file's folder
            where = f"{path}:{number}"
            arguments += _read(_resolve(name, path.parent, where), (*including, path))
    return arguments
