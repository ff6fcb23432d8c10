"""--list_backends: every registered backend, where it runs, what it claims."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLUGIN = "--backend_modules=tests.fake_backends"


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "lcab.experiments", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def heads(stdout: str) -> dict[str, str]:
    """backend -> its first line (framework, suite, availability)."""
    return {line.split()[0]: line for line in stdout.splitlines()
            if line and not line.startswith(" ")}


def test_a_framework_lists_its_backends_their_claims_and_why_one_cannot_run(tmp_path):
    run = cli(PLUGIN, "--framework=numpy", "--list_backends", f"--out={tmp_path / 'out'}")
    assert run.returncode == 0, run.stderr
    listed = heads(run.stdout)
    assert set(listed) >= {"numpy.reference", "numpy.causal_only", "numpy.missing"}
    assert all(name.startswith("numpy.") for name in listed)  # --framework filters
    assert listed["numpy.reference"].endswith("framework=numpy  suite=kernel  available")
    assert ("UNAVAILABLE: cannot import a_package_that_is_not_installed"
            in listed["numpy.missing"])
    block = run.stdout.split("numpy.tunable ")[1].split("\nnumpy.")[0]
    assert "directions: fwd, bwd" in block and "options: variant (str)" in block
    assert "directions: fwd\n" in run.stdout.split("numpy.causal_only ")[1]
    assert not (tmp_path / "out").exists()


def test_the_builtin_backends_are_listed_with_their_masks():
    run = cli("--framework=jax", "--suite=kernel", "--list_backends", timeout=300)
    assert run.returncode == 0, run.stderr
    listed = heads(run.stdout)
    assert listed["jax.xla"].endswith("framework=jax  suite=kernel  available")
    assert "jax.cp_ring" not in listed  # --suite, given, filters too
    xla = run.stdout.split("jax.xla ")[1].split("\njax.")[0]
    assert "masks: " in xla and "causal_document" in xla
    assert "UNAVAILABLE: " in run.stdout  # tokamax, fa3 or a GPU kernel, on a CPU
