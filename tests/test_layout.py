"""Project layout: framework-free core, BUILD coverage, CI == README."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("lcab", "jax_backends", "torch_backends")

BLOCK_FRAMEWORKS = """
import importlib.abc, pkgutil, sys
BLOCKED = ("jax", "jaxlib", "torch", "flax", "triton")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
import lcab
for module in pkgutil.walk_packages(lcab.__path__, "lcab."):
    if not module.name.endswith("__main__"):
        __import__(module.name)
print("imported", len(sys.modules))
"""


def test_lcab_imports_without_jax_or_torch():
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_FRAMEWORKS], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("imported")


def test_every_source_file_is_in_build():
    build = (ROOT / "BUILD").read_text()
    listed = set(re.findall(r'"([\w/]+\.py)"', build))
    test_names = re.search(r"for name in \[(.*?)\]", build, re.S).group(1)
    listed |= {f"tests/{name}.py" for name in re.findall(r'"(test_\w+)"', test_names)}
    sources = {
        str(path.relative_to(ROOT))
        for top in (*PACKAGES, "tests")
        for path in (ROOT / top).rglob("*.py")
    }
    missing = sorted(sources - listed)
    assert not missing, f"add these to BUILD: {missing}"
    stale = sorted(path for path in listed if not (ROOT / path).exists())
    assert not stale, f"BUILD lists files that do not exist: {stale}"
    for package in PACKAGES:
        assert f'name = "{package}"' in build


def _readme_block_after(heading: str) -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split(f"## {heading}", 1)[1]
    return re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()


def test_ci_runs_exactly_the_readme_test_command():
    command = _readme_block_after("Install and test")
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"TEST_COMMAND='{command}'" in ci
    assert "-eq 5" in ci  # pytest's "no tests collected" fails CI


def test_readme_run_command_installs_the_project():
    command = _readme_block_after("Install and run")
    assert command.startswith('pip install "torch==2.13.0" -e ".[')
    assert "python -m lcab." in command
