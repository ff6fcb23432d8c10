"""Flagfiles: an include is found relative to the flagfile naming it, from
any working directory; a missing file or a cycle is a one-line error."""

import os
import pathlib
import subprocess
import sys

import pytest

from lcab.experiments import flagfiles, presets

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLUGIN = "--backend_modules=tests.fake_backends"


def cli(*args, cwd, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "lcab.experiments", "--noprogress", *args],
        capture_output=True, text=True, cwd=cwd, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture
def sweeps(tmp_path):
    """sweeps/top.flags includes shared/base.flags, which includes ../more.flags."""
    folder = tmp_path / "sweeps"
    (folder / "shared").mkdir(parents=True)
    (folder / "top.flags").write_text(
        "# a named sweep\n--flagfile=shared/base.flags\n--masks=causal\n")
    (folder / "shared" / "base.flags").write_text(
        "--flagfile=../more.flags\n--heads=2:1\n// another comment\n\n--masks=full\n")
    (folder / "more.flags").write_text("--seqlens=96\n--head_dim=8\n--noflush_l2\n")
    return folder


def test_includes_are_relative_to_the_file_naming_them(sweeps, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The command line's flagfile is relative to the working directory.
    expanded = flagfiles.expand(["--iters=1", "--flagfile=../sweeps/top.flags", "--dtype=float32"],
                                cwd=elsewhere)
    assert expanded == ["--iters=1", "--seqlens=96", "--head_dim=8", "--noflush_l2",
                        "--heads=2:1", "--masks=full", "--masks=causal", "--dtype=float32"]
    # The two-argument spelling, and nothing read after "--".
    assert flagfiles.expand(["--flagfile", str(sweeps / "more.flags"), "--", "--flagfile=x"]) == [
        "--seqlens=96", "--head_dim=8", "--noflush_l2", "--", "--flagfile=x"]


def test_presets_read_includes_relative_to_their_file(sweeps):
    assert presets.read(sweeps / "top.flags") == {
        "seqlens": "96", "head_dim": "8", "flush_l2": "false", "heads": "2:1",
        "masks": "causal"}
    # The repository's named sweeps include common.flags by a relative path.
    assert "--flagfile=common.flags" in (ROOT / "experiments" / "seed_blog.flags").read_text()
    assert presets.read(ROOT / "experiments" / "seed_blog.flags")["iters"] == "10"


@pytest.mark.parametrize("files, message", [
    ({"a.flags": "--flagfile=b.flags\n", "b.flags": "--flagfile=a.flags\n"},
     "a.flags includes itself: {d}/a.flags -> {d}/b.flags -> {d}/a.flags"),
    ({"a.flags": "--flagfile=a.flags\n"}, "a.flags includes itself"),
    ({"a.flags": "--iters=1\n--flagfile=nowhere/b.flags\n"},
     "flagfile {d}/nowhere/b.flags does not exist (named in {d}/a.flags)"),
    ({"a.flags": "iters=1\n"}, "{d}/a.flags:1: 'iters=1' is not a --flag"),
    ({"a.flags": "--flagfile common.flags\n"}, "write --flagfile=PATH on one line"),
    ({"a.flags": "--flagfile=\n"}, "--flagfile names no file"),
])
def test_bad_flagfiles_are_errors_naming_the_file(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(flagfiles.FlagfileError) as raised:
        flagfiles.expand(["--flagfile=a.flags"], cwd=tmp_path)
    assert message.format(d=tmp_path) in str(raised.value)


def test_the_cli_reads_nested_flagfiles_from_any_working_directory(sweeps, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = cli("--flagfile=../sweeps/top.flags", "--backends=numpy.reference", PLUGIN,
              "--directions=fwd", "--dry_run", f"--out={tmp_path / 'out'}", cwd=elsewhere)
    assert run.returncode == 0, run.stderr
    assert "heads 2:1, head_dim 8" in run.stdout
    cases = [line.split()[:4] for line in run.stdout.splitlines()
             if line.strip().startswith("numpy.")]
    assert cases == [["numpy.reference", "causal", "96", "fwd"]]


def test_the_repositorys_sweeps_run_from_another_directory(tmp_path):
    run = cli(f"--flagfile={ROOT / 'experiments' / 'seed_blog.flags'}",
              "--backends=numpy.reference", PLUGIN, "--masks=causal", "--seqlens=64",
              "--dry_run", f"--out={tmp_path / 'out'}", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "heads 64:8, head_dim 128, bfloat16" in run.stdout  # from its include, common.flags


@pytest.mark.parametrize("files, flagfile, message", [
    ({"a.flags": "--flagfile=a.flags\n"}, "a.flags", "a.flags includes itself"),
    ({}, "missing.flags", "missing.flags does not exist"),
    ({"a.flags": "--flagfile=gone.flags\n"}, "a.flags", "gone.flags does not exist (named in"),
])
def test_the_cli_stops_at_a_bad_flagfile_with_one_line(tmp_path, files, flagfile, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    run = cli(f"--flagfile={flagfile}", f"--out={tmp_path / 'out'}", cwd=tmp_path, timeout=60)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert message in run.stderr and str(tmp_path) in run.stderr
    assert not (tmp_path / "out").exists()
