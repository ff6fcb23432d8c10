"""Golden data: a run's inputs, outputs and gradients kept with orbax, and
later runs of the same workload compared against them (`--golden_dir`).

The first run of a workload (mask, shapes, dtype, input seed) saves its
inputs (q, k, v and the output cotangent) and results (out, and dq, dk, dv
when it ran the backward), all in the (batch, seq, heads, dim) layout.
Every later run of it -- another kernel, a context-parallel strategy, a run
at scale, the other framework -- runs on the saved inputs and reports the
largest normalised difference from the saved results.

The store is framework-neutral: orbax is imported only when a store is
read or written, so a torch run keeps golden data without this module
importing a framework itself.

JAX saves jax.Arrays (each host its own shards); every run reads the store
back as NumPy arrays on the host (`restore_numpy`) and places the inputs
as its runtime places any input, so a CP run at scale, on any mesh, is
checked against a single-device run, and the torch runtime reads and
writes the same orbax checkpoint.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np

INPUT_NAMES = ("q", "k", "v", "dout")


def golden_key(case_key: str, with_gradients: bool) -> str:
    """A directory name for one case's golden arrays."""
    safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", case_key)
    return f"{safe}-{'fwd_bwd' if with_gradients else 'fwd'}"


def _path(directory, key: str) -> pathlib.Path:
    return pathlib.Path(directory).absolute() / key


def exists(directory, key: str) -> bool:
    return _path(directory, key).exists()


def save(directory, key: str, inputs: dict, results: dict) -> None:
    """Keep `inputs` and `results` (jax or NumPy arrays) as the golden data of key."""
    import orbax.checkpoint as ocp  # only where golden data is asked for

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(_path(directory, key), {"inputs": inputs, "results": results})
    checkpointer.wait_until_finished()


def restore_numpy(directory, key: str) -> dict:
    """The golden arrays as NumPy arrays on the host (no device is touched)."""
    import orbax.checkpoint as ocp  # only where golden data is asked for

    path = _path(directory, key)
    checkpointer = ocp.PyTreeCheckpointer()
    tree = checkpointer.metadata(path).item_metadata.tree
    return checkpointer.restore(path, restore_args=_as_numpy(tree, ocp.RestoreArgs))


def _as_numpy(tree, restore_args):
    """Restore arguments asking for NumPy arrays, one per leaf of the
    store's (nested dict) tree."""
    if isinstance(tree, dict):
        return {name: _as_numpy(leaf, restore_args) for name, leaf in tree.items()}
    return restore_args(restore_type=np.ndarray)


def normalised_error(results: dict, golden: dict) -> float:
    """Largest max|a - g| / max|g| over the named arrays; inf for non-finite."""
    return max(_normalised(np.asarray(results[name], np.float32),
                           np.asarray(golden[name], np.float32)) for name in results)


def _normalised(got: np.ndarray, want: np.ndarray) -> float:
    if got.shape != want.shape:
        raise ValueError(f"golden shape {want.shape} differs from the run's {got.shape}")
    if not np.all(np.isfinite(got)):
        return float("inf")
    scale = max(float(np.max(np.abs(want))), 1e-6)
    return float(np.max(np.abs(got - want))) / scale
