"""Small helpers compiled once per shape for the whole process.

The runtime clears JAX's caches after every case (a backend's executables
can hold large constants, such as a dense mask). The harness's own helpers
(random inputs, the full-size check's gathers and error norms, the finite
test) would then compile again for every backend of a workload, about a
dozen small compiles, 2-3 s of each case on an H100. They hold no such
constants, so their executables are kept here instead, out of JAX's caches.
"""

from __future__ import annotations

import jax

_EXECUTABLES: dict = {}


def call(fn, *args, **static):
    """fn(*args, **static), jitted with `static` as static arguments (or
    already jitted with them, with its own jit options) and compiled once
    per (fn, static values, shapes, dtypes, shardings)."""
    leaves, tree = jax.tree.flatten(args)
    key = (fn, tuple(sorted(static.items())), tree,
           tuple((x.shape, x.dtype, getattr(x, "sharding", None)) for x in leaves))
    compiled = _EXECUTABLES.get(key)
    if compiled is None:
        jitted = fn if hasattr(fn, "lower") else jax.jit(fn, static_argnames=tuple(static))
        compiled = jitted.lower(*args, **static).compile()
        _EXECUTABLES[key] = compiled
    return compiled(*args)
