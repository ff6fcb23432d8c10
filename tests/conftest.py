"""Shared test setup: GPU tests run only where a GPU is visible; on a CPU,
JAX gets 8 host devices so context parallelism runs in the tests.

LCAB_TEST_SHARD=I/N keeps the I-th of N contiguous parts of the collected
tests (0-based), so N processes can share a long GPU suite; contiguous,
so tests that share a reference (tests/conformance.py's AtFullSize) stay
together."""

import os

import pytest
from hypothesis import settings

from lcab.experiments import presets

_HOST_DEVICES = "--xla_force_host_platform_device_count=8"
if not presets.has_gpu() and _HOST_DEVICES not in os.environ.get("XLA_FLAGS", ""):
    # Before any test imports jax: the flag is read when jax starts.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_HOST_DEVICES}".strip()

# Derandomised: CI sees the same examples on every run.
settings.register_profile("lcab", deadline=None, max_examples=60, derandomize=True)
settings.load_profile("lcab")


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected theirs
def pytest_collection_modifyitems(config, items):
    shard = os.environ.get("LCAB_TEST_SHARD")
    if shard:
        index, count = (int(part) for part in shard.split("/"))
        begin, end = len(items) * index // count, len(items) * (index + 1) // count
        config.hook.pytest_deselected(items=items[:begin] + items[end:])
        items[:] = items[begin:end]
    if presets.has_gpu():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (no nvidia-smi on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
