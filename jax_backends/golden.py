"""Golden data: a run's outputs and gradients kept with orbax, and later
runs of the same workload compared against them (`--golden_dir`).

The first run of a workload (mask, shapes, dtype, input seed) saves out
(and dq, dk, dv when it ran the backward); every later run of it -- another
kernel, a context-parallel strategy, a run at scale -- restores them in its
own sharding and reports the largest normalised difference. Arrays are
saved and restored by every host for its own shards, so a multi-host CP
run is checked against a single-device run of the same inputs.
"""

from __future__ import annotations

import pathlib
import re

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp


def golden_key(case_key: str, with_gradients: bool) -> str:
    """A directory name for one case's golden arrays."""
    safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", case_key)
    return f"{safe}-{'fwd_bwd' if with_gradients else 'fwd'}"


def golden_error(directory, key: str, arrays: dict) -> float | None:
    """None after saving `arrays` as the golden data of `key`; afterwards the
    largest normalised difference (max |a - g| / max |g|) over the arrays."""
    path = pathlib.Path(directory).absolute() / key
    checkpointer = ocp.StandardCheckpointer()
    if not path.exists():
        checkpointer.save(path, arrays)
        checkpointer.wait_until_finished()
        return None
    like = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), arrays)
    golden = checkpointer.restore(path, like)
    return max(_normalised(arrays[name], golden[name]) for name in arrays)


def _normalised(got, want) -> float:
    got, want = got.astype(jnp.float32), want.astype(jnp.float32)
    scale = jnp.maximum(jnp.max(jnp.abs(want)), 1e-6)
    error = jnp.where(jnp.all(jnp.isfinite(got)), jnp.max(jnp.abs(got - want)) / scale, jnp.inf)
    return float(error)
