"""Where a result came from: the LCAB commit that produced it, and the commit a
run may record for it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lcab.canonical import ROOT as _ROOT

# Measured rows and the pages made from them are not code: a GPU machine that
# receives the tree without the settled studies (to keep a call's copy small)
# still runs exactly the commit's code, so these paths do not make it "+dirty".
NOT_CODE = ("results", "docs")


def git_commit(root: Path | str = _ROOT) -> str:
    """HEAD of the LCAB checkout at `root`, '+dirty' when a tracked file outside
    NOT_CODE differs from it; 'unknown' outside git."""
    excluded = [f":(exclude){path}" for path in NOT_CODE]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no",
             "--", ".", *excluded],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if status else "")


def named_commit(given: str | None) -> str:
    """The commit a run records: `given` (--git_commit), else git_commit().

    A given name that is this checkout's HEAD while its tracked files differ
    from HEAD is refused: the rows would claim a tree they were not measured
    on. That happens where a tree is copied with git metadata older than its
    files (a GPU machine that receives the working tree beside an earlier
    snapshot's .git), so `--git_commit=$(git rev-parse HEAD)` run there names
    the old commit. A name that says "+dirty" itself is taken as given."""
    found = git_commit()
    if not given:
        return found
    head, dirty = found.removesuffix("+dirty"), found.endswith("+dirty")
    if dirty and not given.endswith("+dirty") and len(given) >= 7 and head.startswith(given):
        raise ValueError(
            f"--git_commit={given} is this checkout's HEAD, but its tracked files differ from "
            f"it (git status): name the commit whose files these are (taken where that commit "
            f"was made), commit the changes, or leave --git_commit out to record "
            f"{head[:7]}+dirty")
    return given
