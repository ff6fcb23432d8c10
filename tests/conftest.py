"""Shared test setup: GPU tests run only where a GPU is visible."""

import pytest
from hypothesis import settings

from lcab.experiments import presets

# Derandomised: CI sees the same examples on every run.
settings.register_profile("lcab", deadline=None, max_examples=60, derandomize=True)
settings.load_profile("lcab")


def pytest_collection_modifyitems(config, items):
    if presets.has_gpu():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (no nvidia-smi on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
