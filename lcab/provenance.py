"""Where a result came from: the LCAB commit that produced it."""

from __future__ import annotations

import subprocess

from lcab.canonical import ROOT as _ROOT


def git_commit() -> str:
    """HEAD of the LCAB checkout, '+dirty' when modified; 'unknown' outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(_ROOT), "rev-parse", "HEAD"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if status else "")
