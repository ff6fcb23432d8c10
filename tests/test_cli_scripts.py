"""The console scripts: lcab-run, lcab-report, lcab-model, lcab-advise and lcab-sweep."""

import importlib.metadata
import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = {
    "lcab-run": "lcab.experiments.__main__:console_main",
    "lcab-report": "lcab.report.__main__:console_main",
    "lcab-model": "lcab.model.__main__:console_main",
    "lcab-advise": "lcab.advise.__main__:console_main",
    "lcab-sweep": "lcab.experiments.canonical:console_main",
}


def test_the_console_scripts_are_declared():
    declared = {ep.name: ep.value for ep in importlib.metadata.entry_points(
        group="console_scripts") if ep.name.startswith("lcab-")}
    if not declared:
        pytest.skip("lcab is not installed (pip install -e .)")
    assert declared == SCRIPTS


def test_lcab_run_is_the_experiments_cli():
    from lcab.experiments.__main__ import console_main

    (script,) = [ep for ep in importlib.metadata.entry_points(group="console_scripts")
                 if ep.name == "lcab-run"] or [None]
    if script is None:
        pytest.skip("lcab is not installed (pip install -e .)")
    assert script.load() is console_main
    path = shutil.which("lcab-run")
    if path is None:
        pytest.skip("lcab-run is not on PATH")
    run = subprocess.run([path, "--backend_modules=tests.fake_backends", "--framework=numpy",
                          "--list_backends"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    assert "numpy.reference  framework=numpy  suite=kernel  available" in run.stdout


@pytest.mark.parametrize("module", sorted({target.split(":")[0] for target in SCRIPTS.values()}))
@pytest.mark.parametrize("flag", ["--help", "--helpshort", "--helpfull"])
def test_every_console_script_takes_absl_s_help_flags(module, flag):
    """Each script answers absl's help flags with its usage and its flags
    (absl's own scripts exit 1 after help, lcab-sweep 0: either is help)."""
    run = subprocess.run(["python", "-m", module.removesuffix(".__main__"), flag],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode in (0, 1), run.stderr
    assert "Unknown command line flag" not in run.stderr + run.stdout
    assert "--" in run.stdout and "flags" in run.stdout.lower(), run.stdout[-2000:]
