"""jax.pallas_flex's attention op: the lowering chosen per direction, the
padding to the plan's blocks, and the custom VJP.

`flex_attention(q, k, v, plan, ...)` returns (out, lse) and is
differentiable; `flex_attention_with_tables` takes the plan's tables as
arrays (context-parallel ranks pass their own), and `block_gradients`
gives one K/V block's share of the gradients from the rows' final out and
lse (a ring's backward). Layout (batch, seq, heads, head_dim); K/V may have
fewer heads than Q (GQA): a Q head reads its group's K/V head, and dK/dV
programs loop over the group's Q heads, so nothing is repeated in memory.

Each direction runs one of two lowerings: Triton (triton.py; also the
CPU's, in Pallas interpret mode) or, on Hopper, Mosaic GPU
(mosaic_fwd_sm90.py, mosaic_bwd_sm90.py), chosen by `Lowering`: "auto"
takes Mosaic where its `problem` finds nothing in the way. lse is
returned in natural log; a row that sees nothing gives out 0 and lse -inf
(lcab.reference's convention).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_backends import _shared
from jax_backends.pallas_flex import mosaic_bwd_sm90, mosaic_fwd_sm90, triton
from jax_backends.pallas_flex.plan import FlexPlan, Geometry
from jax_backends.pallas_flex.schedule import (DKV_LAUNCHES, DKV_SPLITS, FORWARD_GRIDS,
                                               ROWS_LAUNCHES, dkv_schedule, forward_grid,
                                               rows_launch)

_LN2 = math.log(2.0)

LOWERINGS = ("auto", "triton", "mosaic")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lowering:
    """Which lowering runs each direction, and each lowering's config.

    forward, backward: "triton", "mosaic" (Hopper only) or "auto" (Mosaic
    where it fits, else Triton). interpret: run the Triton kernels in
    Pallas interpret mode (a CPU; Mosaic has none). dkv_launch: the order
    dK/dV programs start in, "head_major" (one kv head after another, the
    running programs share a K/V head in L2), "heads_together" (every head
    of a block together: no long program starts last) or "auto" (the
    latter only where the plan's heaviest program would trail).
    dkv_split: dK/dV programs for each K/V head's block, each over a share
    of the head's query heads (DKV_SPLITS; "1": one over all, as every row
    before 2026-12-02 ran; "auto", the default, splits short sequences'
    Mosaic backward: schedule.dkv_split says how).
    rows_launch: the order the Mosaic forward's and dQ's programs (one per
    q block and head) start in, "heads_together" (every head of a q block
    together, blocks heaviest first; batch the slowest axis), "head_major"
    or "auto", the default: the forward as schedule.rows_launch chooses
    (head after head where rows are long), dQ heads together (every
    backward row so far; dQ's order is unmeasured). The Triton kernels
    launch rows head after head whatever it says (v4b, docs/pallas_flex.md).
    forward_grid: the Mosaic forward's grid (FORWARD_GRIDS): "per_item"
    (one program per q block and head, every row before 2026-12-03),
    "persistent" (one per SM walking items in turn; sets
    mosaic_forward.persistent) or "auto", the default (persistent where
    a program's items are short: schedule.forward_grid).
    """

    forward: str = "auto"
    backward: str = "auto"
    interpret: bool = False
    dkv_launch: str = "auto"
    rows_launch: str = "auto"
    dkv_split: str = "auto"
    forward_grid: str = "auto"
    triton: triton.Config = triton.Config()
    mosaic_forward: mosaic_fwd_sm90.Config = mosaic_fwd_sm90.Config()
    mosaic_backward: mosaic_bwd_sm90.Config = mosaic_bwd_sm90.Config()

    def __post_init__(self):
        for field, value, choices in (("forward", self.forward, LOWERINGS),
                                      ("backward", self.backward, LOWERINGS),
                                      ("dkv_launch", self.dkv_launch, DKV_LAUNCHES),
                                      ("rows_launch", self.rows_launch, ROWS_LAUNCHES),
                                      ("dkv_split", self.dkv_split, DKV_SPLITS),
                                      ("forward_grid", self.forward_grid, FORWARD_GRIDS)):
            if value not in choices:
                raise ValueError(f"{field}={value!r}: choose one of {', '.join(choices)}")
        for direction in ("forward", "backward"):
            if self.interpret and getattr(self, direction) == "mosaic":
                raise ValueError(f"{direction}=mosaic has no interpret mode (a CUDA GPU only)")

    def mosaic_problem(self, direction: str, block_q: int, block_k: int, dtype,
                       head_dim: int) -> str | None:
        """Why the "forward" or "backward" of these blocks and inputs cannot
        be Mosaic's (None: it is)."""
        chosen = getattr(self, direction)
        if self.interpret or chosen == "triton":
            return f"{direction}={chosen}, interpret={self.interpret}"
        if direction == "forward":  # "auto" falls back to per_item where persistent won't fit
            config = self._forward_config(self.forward_grid == "persistent")
            problem = mosaic_fwd_sm90.problem(block_q, block_k, dtype, head_dim, config)
        else:
            problem = mosaic_bwd_sm90.problem(block_q, block_k, dtype, head_dim)
        return _shared.gpu_problem(capability=mosaic_fwd_sm90.SM90, exact=True) or problem

    def mosaic_forward_for(self, plan: Geometry, dtype, head_dim: int) -> mosaic_fwd_sm90.Config:
        """The Mosaic forward's config for this plan and inputs, its grid
        as forward_grid chooses."""
        fits = mosaic_fwd_sm90.problem(plan.block_q, plan.block_k, dtype, head_dim,
                                       self._forward_config(True)) is None
        grid = forward_grid(plan, self.forward_grid, fits)
        return self._forward_config(grid == "persistent")

    def _forward_config(self, persistent: bool) -> mosaic_fwd_sm90.Config:
        return dataclasses.replace(self.mosaic_forward, persistent=persistent)

    def is_mosaic(self, direction: str, block_q: int, block_k: int, dtype, head_dim: int) -> bool:
        """Mosaic where asked; with "auto", where it fits. An explicit
        "mosaic" that does not fit raises (the backend's mask_support
        reports it first)."""
        problem = self.mosaic_problem(direction, block_q, block_k, dtype, head_dim)
        if getattr(self, direction) == "mosaic" and problem:
            raise ValueError(f"{direction}=mosaic: {problem}")
        return problem is None


def _forward(q, k, v, plan: Geometry, tables, lowering: Lowering):
    """(out, lse2) of the padded inputs."""
    if lowering.is_mosaic("forward", plan.block_q, plan.block_k, q.dtype, q.shape[3]):
        config = lowering.mosaic_forward_for(plan, q.dtype, q.shape[3])
        together = rows_launch(plan, lowering.rows_launch) == "heads_together"
        return mosaic_fwd_sm90.forward(q, k, v, plan, tables, config, together)
    return triton.forward(q, k, v, plan, tables, lowering.triton, lowering.interpret)


def _backward(q, k, v, delta, lse2, dout, plan: Geometry, tables, lowering: Lowering):
    """(dq, dk, dv) of the padded inputs."""
    mosaic = lowering.is_mosaic("backward", plan.block_q, plan.block_k, q.dtype, q.shape[3])
    order, split = dkv_schedule(plan, k.shape[2] * q.shape[0], q.shape[2] // k.shape[2],
                                lowering.dkv_launch, lowering.dkv_split, mosaic)
    together = order == "heads_together"
    if mosaic:
        return mosaic_bwd_sm90.backward(q, k, v, dout, lse2, delta, plan, tables,
                                        together, lowering.mosaic_backward,
                                        lowering.rows_launch != "head_major", split)
    return triton.backward(q, k, v, delta, lse2, dout, plan, tables, lowering.triton,
                           lowering.interpret, together, split)


def _pad(x, length):
    extra = length - x.shape[1]
    return x if extra == 0 else jnp.pad(x, ((0, 0), (0, extra), (0, 0), (0, 0)))


def flex_attention(q, k, v, forward_plan: FlexPlan, backward_plan: FlexPlan | None = None,
                   lowering: Lowering = Lowering()):
    """(out, lse) of attention under the plans' mask; differentiable in q, k, v.

    q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, kv_heads,
    head_dim) with heads a multiple of kv_heads. lse: (batch, heads, seqlen_q)
    float32, natural log, -inf on rows that see nothing. The backward walks
    backward_plan (the same mask, other block sizes), forward_plan if None.
    """
    backward_plan = backward_plan or forward_plan
    as_arrays = lambda plan: jax.tree.map(jnp.asarray, plan.tables())  # noqa: E731
    return flex_attention_with_tables(
        q, k, v, forward_plan.geometry, as_arrays(forward_plan),
        backward_plan.geometry, as_arrays(backward_plan), lowering)


def flex_attention_with_tables(q, k, v, forward_geometry: Geometry, forward_tables,
                               backward_geometry: Geometry, backward_tables,
                               lowering: Lowering = Lowering()):
    """flex_attention with the plans' tables as (possibly traced) arrays:
    inside shard_map each context-parallel rank passes its own tables
    (plan.stack_plans), compiled once for their shared geometry."""
    _check(q, k, v, forward_geometry, backward_geometry)
    return _attention(forward_geometry, backward_geometry, lowering, q, k, v,
                      forward_tables, backward_tables)


def _check(q, k, v, *geometries):
    if q.ndim != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape} are not (b, s, h, d) "
                         "with matching batch and head_dim")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"{q.shape[2]} query heads are not a multiple of {k.shape[2]} kv heads")
    for geometry in geometries:
        if (geometry.seqlen_q, geometry.seqlen_k) != (q.shape[1], k.shape[1]):
            raise ValueError(f"a plan for {geometry.seqlen_q} x {geometry.seqlen_k} tokens was "
                             f"given q of {q.shape[1]} and k of {k.shape[1]}")


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _attention(forward_geometry, backward_geometry, lowering, q, k, v, forward_tables,
               backward_tables):
    return _forward_padded(forward_geometry, forward_tables, lowering, q, k, v)


def _forward_padded(plan, tables, lowering, q, k, v):
    """_forward on inputs padded to the plan's blocks, (out, natural lse) cut back."""
    seq_q = q.shape[1]
    out, lse2 = _forward(_pad(q, plan.padded_q), _pad(k, plan.padded_k),
                         _pad(v, plan.padded_k), plan, tables, lowering)
    return out[:, :seq_q], lse2[:, :, :seq_q] * _LN2


def _lse2_padded(lse, length):
    """A natural (batch, heads, seq) lse in base 2, padded with -inf rows."""
    tail = ((0, 0), (0, 0), (0, length - lse.shape[2]))
    return jnp.pad(lse / _LN2, tail, constant_values=-jnp.inf)


def _attention_fwd(forward_geometry, backward_geometry, lowering, q, k, v, forward_tables,
                   backward_tables):
    out, lse = _forward_padded(forward_geometry, forward_tables, lowering, q, k, v)
    return (out, lse), (q, k, v, out, lse, forward_tables, backward_tables)


def _attention_bwd(forward_geometry, backward_geometry, lowering, residuals, cotangents):
    q, k, v, out, lse, forward_tables, backward_tables = residuals
    dout, dlse = cotangents
    dq, dk, dv = block_gradients(q, k, v, out, lse, dout, backward_geometry, backward_tables,
                                 lowering, dlse)
    return dq, dk, dv, no_gradients(forward_tables), no_gradients(backward_tables)


def no_gradients(tables):
    """The (float0) cotangents of a custom_vjp's integer plan tables."""
    return jax.tree.map(lambda t: np.zeros(t.shape, jax.dtypes.float0), tables)


def block_gradients(q, k, v, out, lse, dout, geometry: Geometry, tables, lowering: Lowering,
                    dlse=None):
    """dq, dk, dv of attention of q against this k, v block, where out and lse
    are the rows' final values over *all* their keys (so a ring backward can
    take each block's share in turn), and dlse the lse's own cotangent."""
    seq_q, seq_k = q.shape[1], k.shape[1]
    # dS = P * (dP - delta) with delta = rowsum(dO * O) - dlse: lse's own
    # cotangent (context-parallel merges differentiate through it) enters
    # here, since d lse / d S = P. One cheap pass, left to XLA.
    delta = jnp.einsum("bshd,bshd->bhs", dout.astype(jnp.float32), out.astype(jnp.float32))
    if dlse is not None:
        delta = delta - dlse.astype(jnp.float32)
    tail = ((0, 0), (0, 0), (0, geometry.padded_q - seq_q))
    lse2 = _lse2_padded(lse, geometry.padded_q)
    pad_q = lambda x: _pad(x, geometry.padded_q)  # noqa: E731
    dq, dk, dv = _backward(pad_q(q), _pad(k, geometry.padded_k), _pad(v, geometry.padded_k),
                           jnp.pad(delta, tail), lse2, pad_q(dout.astype(q.dtype)), geometry,
                           tables, lowering)
    return dq[:, :seq_q], dk[:, :seq_k], dv[:, :seq_k]


_attention.defvjp(_attention_fwd, _attention_bwd)
