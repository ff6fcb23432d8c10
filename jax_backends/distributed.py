"""Multi-process JAX: jax.distributed from the CLI's settings, and global arrays.

One process per host (or per GPU), all running the same sweep in the same
order; a CP mesh spans every process's devices. The CLI passes its
--jax_coordinator / --jax_num_processes / --jax_process_id (or
--jax_distributed_auto, where jax.distributed detects SLURM or Open MPI)
in an environment variable (lcab.processes), because runtimes are built by
the registry, without arguments. Inputs are replicated global arrays, so every
process holds the same values and any sharding is a local slice of them.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lcab.processes import JAX_DISTRIBUTED, jax_coordinates

_started = False


def initialize_from_environment() -> None:
    """Join the processes named in the environment (lcab.processes), once;
    a no-op in a single-process run."""
    global _started
    setting = os.environ.get(JAX_DISTRIBUTED)
    if _started or not setting:
        return
    # CPU devices of different processes exchange collectives through gloo
    # (GPUs use NCCL whatever this says).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if setting == "auto":
        jax.distributed.initialize()
    else:
        coordinator, processes, process_id = jax_coordinates(setting)
        jax.distributed.initialize(coordinator, num_processes=processes, process_id=process_id)
    _started = True


def multi_process() -> bool:
    return jax.process_count() > 1


def replicated_sharding() -> NamedSharding:
    """Every device of every process holds the whole array."""
    return NamedSharding(Mesh(np.array(jax.devices()), ("all",)), PartitionSpec())


def global_from_host(array: np.ndarray, dtype) -> jax.Array:
    """A replicated global array of a host array every process holds alike."""
    array = np.asarray(array, dtype=dtype)
    return jax.make_array_from_callback(array.shape, replicated_sharding(),
                                        lambda index: array[index])


def to_host(array: jax.Array) -> np.ndarray:
    """The whole array on this host, whatever its sharding."""
    if array.is_fully_addressable:
        return np.asarray(array)
    if array.is_fully_replicated:
        return np.asarray(array.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def slowest(values: list[float]) -> list[float]:
    """Element-wise maximum over processes (a step ends with its slowest rank)."""
    if not multi_process():
        return list(values)
    gathered = multihost_utils.process_allgather(np.asarray(values, np.float64))
    return [float(v) for v in np.max(np.asarray(gathered).reshape(-1, len(values)), axis=0)]
