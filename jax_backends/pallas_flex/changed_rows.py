"""Which measured rows a change to jax.pallas_flex can move: the scopes of
its registry Changes (lcab.registry.Change.scope), judged from the row
alone, without JAX (reports ask them for every row they show)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from jax_backends.pallas_flex import plan, schedule
from lcab.model.validation import mask_of
from lcab.results import inner_kernel, json_field

NAME = "jax.pallas_flex"
# The Mosaic backward's blocks where a row set none (mosaic_bwd_sm90.BLOCK,
# which imports JAX; a test holds the two equal).
MOSAIC_BACKWARD_BLOCK = 128


def split_by_default(row: Mapping) -> bool:
    """Whether dkv_split's default "auto" splits the dK/dV programs of the
    row's backward: a one-GPU row of jax.pallas_flex, or of a module over
    it, whose backward ran the Mosaic kernels with dkv_split unset, on a
    workload schedule.dkv_split splits. CP rows keep whole programs
    (PallasFlexBackend.cp_inner_defaults)."""
    direct = row.get("backend") == NAME
    if not (direct or inner_kernel(row) == NAME):
        return False
    if row.get("suite") == "cp" or _number(row.get("cp_size"), 1) > 1:
        return False
    if "backward Mosaic GPU" not in str(row.get("notes") or ""):
        return False
    options = json_field(row.get("options" if direct else "inner_options"))
    if "dkv_split" in options:
        return False
    blocks = tuple(int(options.get(key, MOSAIC_BACKWARD_BLOCK))
                   for key in ("backward_block_q", "backward_block_k"))
    fields = ("mask", "seqlen", "mask_fingerprint", "mask_params", "heads_q", "heads_kv",
              "batch")
    key = (*(json.dumps(json_field(row.get(field)), sort_keys=True) if field == "mask_params"
             else str(row.get(field)) for field in fields), blocks)
    if key not in _split_cache:  # reports ask once per shown row
        geometry = plan.make_plan(mask_of(row), *blocks).geometry
        heads_q, heads_kv, batch = (int(row.get(field)) for field in fields[4:])
        _split_cache[key] = schedule.dkv_split(geometry, heads_kv * batch, heads_q // heads_kv,
                                               "auto", mosaic=True)
    return _split_cache[key] > 1


_split_cache: dict[tuple, int] = {}


def _number(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
