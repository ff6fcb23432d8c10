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


def _module_file(target: str) -> pathlib.Path:
    return ROOT / (target.split(":")[0].replace(".", "/") + ".py")


def test_no_backend_name_is_a_branch_condition_outside_its_module():
    """Backends declare what they can do; nothing outside a backend's own
    module and the registry compares with or looks up a backend's name
    (`== "jax.cudnn"`, `in ("jax.fa3", ...)`, a dict keyed by names)."""
    sys.path.insert(0, str(ROOT))
    from lcab import registry

    entries = registry.all_backends()
    sources = [path for top in PACKAGES for path in (ROOT / top).rglob("*.py")]
    registry_file = ROOT / "lcab" / "registry.py"
    found = []
    for path in sources:
        if path == registry_file:
            continue
        text = path.read_text()
        for name, entry in entries.items():
            if path == _module_file(entry.target):
                continue
            quoted = re.escape(f'"{name}"')
            branch = (rf"(==|!=)\s*{quoted}|{quoted}\s*(==|!=)"
                      rf"|\bin\s*[\(\[{{][^\)\]}}]*{quoted}|^\s*{quoted}\s*:")
            for match in re.finditer(branch, text, re.M):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not found, found


def _read_by_tests() -> set[str]:
    """Repository files the tests name: string literals that are paths
    under results/, experiments/, docs/ or tests/data/, `ROOT / "a" / "b"`
    chains, and the top-level files."""
    named = set()
    for path in (ROOT / "tests").glob("*.py"):
        text = path.read_text()
        for chain in re.findall(r'(?:ROOT|root)((?:\s*/\s*"[^"]+")+)', text):
            named.add("/".join(re.findall(r'"([^"]+)"', chain)))
        named |= set(re.findall(r'"((?:results|experiments|docs|tests/data)/[^"<>*\n]+)"', text))
    sources = (*PACKAGES, "tests")  # py_library srcs, checked above
    return {name for name in named
            if (ROOT / name).exists() and name.split("/")[0] not in sources}


def test_build_gives_the_tests_every_file_they_read():
    import fnmatch

    build = (ROOT / "BUILD").read_text()
    test_block = build[build.index("py_test("):]
    data = re.search(r"data = (.*?),\n", test_block).group(1)
    patterns = re.findall(r'"([^"]+)"', data)
    read = _read_by_tests()
    assert {"README.md", "BUILD", "experiments/pallas_flex_tile_efficiency.py"} <= read
    missing = sorted(
        name for name in read
        if not any(fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(name + "/x", pattern)
                   for pattern in patterns))
    assert not missing, f"add these to the py_test data in BUILD: {missing}"
