"""What a canonical run's RUN.md says about the machine: its GPUs (name,
serial, driver) and the versions of the packages that measured, found
without importing a framework."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess

_GPU_QUERY = "name,serial,uuid,driver_version,memory.total"
# Distributions whose versions decide a measurement.
PACKAGES = ("lcab", "numpy", "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin",
            "flax", "torch", "triton", "tokamax", "flash_attn3_jax", "flash-attn",
            "yunchang", "ring-flash-attn", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13")


def gpus() -> list[dict[str, str]]:
    """One dict per visible GPU (nvidia-smi's name, serial, uuid, driver,
    memory); empty without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        text = subprocess.run(["nvidia-smi", f"--query-gpu={_GPU_QUERY}",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    keys = _GPU_QUERY.split(",")
    return [dict(zip(keys, (field.strip() for field in line.split(","))))
            for line in text.splitlines() if line.strip()]


def device_label(found: list[dict[str, str]] | None = None) -> str:
    """The device part of a results folder's name: the GPU model in lower
    case (h100, h200), with x<count> for several GPUs; "cpu" without one."""
    found = gpus() if found is None else found
    if not found:
        return "cpu"
    match = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", found[0].get("name", ""))
    model = match.group(1).lower() if match else "gpu"
    return model if len(found) == 1 else f"{model}x{len(found)}"


def versions() -> dict[str, str]:
    """Python and each measurement-deciding package that is installed."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def visible_gpu_ids(found: list[dict[str, str]]) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them
    (nvidia-smi lists every card of the host, whatever that says)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [name.strip() for name in visible.split(",") if name.strip()]
    return [str(index) for index in range(len(found))]
