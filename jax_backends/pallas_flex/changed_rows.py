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
# which imports JAX; a test holds the two equal), the forward's
# (backend.FORWARD_BLOCKS) and the largest head_dim and key block whose
# persistent forward fits in shared memory (mosaic_fwd_sm90.problem; tested
# too: 192-key blocks run one program per item), and the forward's wide key
# block (mosaic_fwd_sm90.WIDE_BLOCK_K).
MOSAIC_BACKWARD_BLOCK = 128
FORWARD_BLOCK = 128
PERSISTENT_MAX_HEAD_DIM = 192
PERSISTENT_MAX_BLOCK_K = 128
WIDE_BLOCK_K = 192


def split_by_default(row: Mapping) -> bool:
    """Whether dkv_split's default "auto" splits the dK/dV programs of the
    row's backward: a one-GPU row of jax.pallas_flex, or of a module over
    it, whose backward ran the Mosaic kernels with dkv_split unset, on a
    workload schedule.dkv_split splits. CP rows keep whole programs
    (PallasFlexBackend.cp_inner_defaults)."""
    options = _one_gpu_mosaic_options(row, "backward", "dkv_split")
    if options is None:
        return False
    blocks = tuple(int(options.get(key, MOSAIC_BACKWARD_BLOCK))
                   for key in ("backward_block_q", "backward_block_k"))
    geometry = _geometry(row, blocks)
    heads_q, heads_kv, batch = (int(row.get(field)) for field in ("heads_q", "heads_kv", "batch"))
    return schedule.dkv_split(geometry, heads_kv * batch, heads_q // heads_kv, "auto",
                              mosaic=True) > 1


def persistent_by_default(row: Mapping) -> bool:
    """Whether forward_grid's default "auto" runs the row's forward on the
    persistent grid: a one-GPU row of jax.pallas_flex (or of a module over
    it) whose forward ran the Mosaic kernel with forward_grid unset, at a
    head_dim and key block whose persistent tiles fit, on a workload whose
    programs walk few enough keys (schedule.forward_grid). CP rows keep a
    program per item (PallasFlexBackend.cp_inner_defaults)."""
    options = _one_gpu_mosaic_options(row, "forward", "forward_grid")
    if options is None:
        return False
    geometry = _forward_geometry(row, options)
    fits = (int(row.get("head_dim")) <= PERSISTENT_MAX_HEAD_DIM
            and geometry.block_k <= PERSISTENT_MAX_BLOCK_K)
    return schedule.forward_grid(geometry, "auto", fits) == "persistent"


def head_major_by_default(row: Mapping) -> bool:
    """Whether rows_launch's default "auto" starts the row's forward rows
    head after head: a one-GPU row of jax.pallas_flex (or of a module over
    it) whose forward ran the Mosaic kernel with rows_launch unset, on a
    workload whose programs walk many keys (schedule.rows_launch). CP rows
    keep every head of a q block together (cp_inner_defaults)."""
    options = _one_gpu_mosaic_options(row, "forward", "rows_launch")
    if options is None:
        return False
    return schedule.rows_launch(_forward_geometry(row, options), "auto") == "head_major"


def wide_keys_by_default(row: Mapping) -> bool:
    """Whether the forward of the row, its key block unset, ran 128 keys a
    step where it steps 192 by default now: a one-GPU row of
    jax.pallas_flex (or of a module over it) whose forward ran the Mosaic
    kernel with block_k unset and the grid not set persistent, on a
    workload schedule.forward_key_block widens. CP rows keep 128
    (cp_inner_defaults)."""
    ran_wide = _default_key_block_ran_wide(row)
    return ran_wide is False and _wide_by_default(row)


def narrow_keys_by_default(row: Mapping) -> bool:
    """Whether the forward of the row, its key block unset, ran 192 keys a
    step (its note says so) where the default steps 128 now: the workloads
    whose tiles the mask cuts more than schedule.WIDE_MAX_CUT_SHARE."""
    return _default_key_block_ran_wide(row) is True and not _wide_by_default(row)


def mosaic_backward(row: Mapping) -> bool:
    """Whether the row's backward may have run the Mosaic kernels: every
    row of jax.pallas_flex or over it (CP, a module) but those whose notes
    say the backward ran Triton (a row without notes: unsure, so yes)."""
    return "backward Triton" not in str(row.get("notes") or "")


def _default_key_block_ran_wide(row: Mapping) -> bool | None:
    """Whether a one-GPU Mosaic forward row with block_k unset and the grid
    not set persistent ran 192-key steps (its note); None for other rows."""
    options = _one_gpu_mosaic_options(row, "forward", "block_k")
    if options is None or options.get("forward_grid") == "persistent":
        return None
    return f"{WIDE_BLOCK_K}-key steps" in str(row.get("notes") or "")


def _wide_by_default(row: Mapping) -> bool:
    """Whether schedule.forward_key_block widens the row's workload now."""
    options = _one_gpu_mosaic_options(row, "forward", "block_k") or {}
    geometry = _forward_geometry(row, options)
    return schedule.forward_key_block(geometry, _number(row.get("head_dim"), 0),
                                      WIDE_BLOCK_K) == WIDE_BLOCK_K


def _one_gpu_mosaic_options(row: Mapping, direction: str, option: str) -> dict | None:
    """The pallas_flex options of a one-GPU row whose `direction` ran the
    Mosaic kernels with `option` unset (None: any other row)."""
    direct = row.get("backend") == NAME
    if not (direct or inner_kernel(row) == NAME):
        return None
    if row.get("suite") == "cp" or _number(row.get("cp_size"), 1) > 1:
        return None
    if f"{direction} Mosaic GPU" not in str(row.get("notes") or ""):
        return None
    options = json_field(row.get("options" if direct else "inner_options"))
    return None if option in options else options


def _forward_geometry(row: Mapping, options: Mapping) -> plan.Geometry:
    """The plan geometry of the row's forward, at the blocks it set."""
    blocks = tuple(int(options.get(key, FORWARD_BLOCK)) for key in ("block_q", "block_k"))
    return _geometry(row, blocks)


def _geometry(row: Mapping, blocks: tuple[int, int]) -> plan.Geometry:
    """The plan geometry of the row's mask at these blocks (reports ask once
    per shown row; cached)."""
    fields = ("mask", "seqlen", "mask_fingerprint", "mask_params")
    key = (*(json.dumps(json_field(row.get(field)), sort_keys=True) if field == "mask_params"
             else str(row.get(field)) for field in fields), blocks)
    if key not in _geometry_cache:
        _geometry_cache[key] = plan.make_plan(mask_of(row), *blocks).geometry
    return _geometry_cache[key]


_geometry_cache: dict[tuple, plan.Geometry] = {}


def _number(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
