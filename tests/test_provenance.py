"""The commit a run records (lcab.provenance.named_commit): a commit named
with --git_commit is recorded as given, except this checkout's own HEAD
while its tracked files differ from it, which both CLIs refuse with a
message before anything runs (a copied tree whose git metadata is older
than its files would otherwise label new code's rows with the old commit)."""

import subprocess
import sys

import pytest

from lcab import provenance
from lcab.canonical import ROOT

HEAD = "c3030ee1d678f114d0b149a7751982a134d9217c"


@pytest.fixture
def checkout(monkeypatch):
    """Make git_commit() report `found`, as a checkout in that state would."""
    return lambda found: monkeypatch.setattr(provenance, "git_commit", lambda: found)


def test_a_modified_head_cannot_be_named_as_the_commit_measured(checkout):
    checkout(HEAD + "+dirty")
    for named in ("c3030ee", HEAD):
        with pytest.raises(ValueError, match=rf"--git_commit={named} is this checkout's HEAD, "
                                             r"but its tracked files differ.*c3030ee\+dirty"):
            provenance.named_commit(named)
    # Another commit (the files' own, named where it was made) is taken as
    # given, as is a name that says it is modified; none names what git says.
    assert provenance.named_commit("be18a1e") == "be18a1e"
    assert provenance.named_commit(HEAD + "+dirty") == HEAD + "+dirty"
    assert provenance.named_commit(None) == provenance.named_commit("") == HEAD + "+dirty"


def test_a_clean_head_or_a_tree_outside_git_is_named_freely(checkout):
    checkout(HEAD)
    assert provenance.named_commit("c3030ee") == "c3030ee"
    assert provenance.named_commit(None) == HEAD
    checkout("unknown")
    assert provenance.named_commit("c3030ee") == "c3030ee"


def _cli(module: str, *argv: str) -> subprocess.CompletedProcess:
    """`python -m module argv` with git_commit() reporting a modified HEAD."""
    script = ("import runpy, sys; from lcab import provenance; "
              f"provenance.git_commit = lambda: {HEAD + '+dirty'!r}; "
              f"sys.argv = [{module!r}, *{list(argv)!r}]; "
              f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=False, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("module,argv", [
    ("lcab.experiments", ("--dry_run", "--backends=jax.xla", "--masks=causal",
                          "--seqlens=256")),
    ("lcab.experiments.canonical", ("blog", "--parts=jax-1k-8k-full", "--budget_s=1")),
])
def test_both_clis_refuse_it_with_a_message_and_no_traceback(module, argv, tmp_path):
    found = _cli(module, *argv, f"--out={tmp_path / 'out'}", "--git_commit=c3030ee")
    assert found.returncode != 0
    assert "--git_commit=c3030ee is this checkout's HEAD" in found.stderr
    assert "Traceback" not in found.stderr
    assert not any((tmp_path / "out").rglob("*.jsonl"))


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "HOME": str(root),
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def test_only_code_makes_a_checkout_dirty(tmp_path):
    """A tree copied without its settled results or generated pages runs the
    commit's code, so it is named by the commit alone; a changed module is not."""
    for path in ("lcab/attention.py", "results/study/rows.jsonl", "docs/results/page.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "c")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "results/study/rows.jsonl").unlink()
    (tmp_path / "docs/results/page.md").write_text("regenerated\n")
    assert provenance.git_commit(tmp_path) == head
    (tmp_path / "lcab/attention.py").write_text("changed\n")
    assert provenance.git_commit(tmp_path) == head + "+dirty"
    assert provenance.git_commit(tmp_path / "missing") == "unknown"
