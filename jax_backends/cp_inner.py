"""The inner kernels of the JAX context-parallel strategies.

A CP strategy runs an inner kernel backend from the registry
(`--backend_options=jax.cp_ring:inner=jax.xla`). Every rank, and for a ring
every step, attends its own exact sub-mask (lcab.cp.sub_mask): its query
tokens against the K/V tokens it holds. The inner backend's own
`supports()` must accept each such sub-workload, or the strategy is
UNSUPPORTED with the inner's reason; nothing runs a different mask.

All-gather and Ulysses need only the output, so they call the inner
backend's own `build()` per rank, one branch per distinct sub-workload
chosen by the rank's index (`by_rank`); every branch is in the one program,
so an inner that builds a dense mask (jax.xla inside all-gather) holds every
rank's S/cp x S mask as constants on each device.

Ring-type strategies merge partial results by log-sum-exp and take each
step's gradients from the final out and lse, so they need a *ring kernel*:
jax.pallas_flex's (per-rank plan tables) or, for jax.xla, the dense one
here (a boolean mask per rank and step as a sharded input, O((S/cp)^2)
cells a step, scores and accumulation in float32; empty steps are computed
too). Other inner kernels return no log-sum-exp through their APIs and are
UNSUPPORTED inside a ring. An inner that cannot run here (jax.cudnn or
jax.fa3 without a GPU) makes the strategy UNAVAILABLE, naming the inner.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jax_backends import flex_kernel, flex_plan
from lcab import expressions, registry
from lcab.backend import Backend, Support
from lcab.masks import AttnMask
from lcab.workloads import Workload

DEFAULT = "jax.pallas_flex"
PALLAS = "jax.pallas_flex"
DENSE = "jax.xla"

# Why an inner kernel cannot sit inside a ring (it has no (out, lse) form).
_NO_LSE = {
    "jax.cudnn": "jax.nn.dot_product_attention returns the output only, no log-sum-exp",
    "jax.fa3": ("flash_attn3_jax's public flash_mha and flash_mha_varlen return the output "
                "only; the log-sum-exp stays inside the package"),
}

Labelled = Sequence[tuple[str, Workload]]  # ("rank 1 step 2", its sub-workload)


# ----- choosing and loading ------------------------------------------------
def inner_names() -> tuple[str, ...]:
    """Every JAX kernel backend of the registry (plugins included)."""
    return tuple(registry.backend_names("jax", "kernel"))


def load_inner(name: str, options: dict) -> Backend:
    """The inner backend, built with its options; ValueError for a bad name,
    registry.Unavailable (naming the inner) where it cannot run here."""
    if name not in inner_names():
        raise ValueError(f"inner={name!r} is not one of {', '.join(inner_names())}")
    if options and name != PALLAS:
        raise ValueError(f"{', '.join(sorted(options))} apply to inner={PALLAS} only, "
                         f"not inner={name}")
    try:
        return registry.load_backend(name, {key: str(value) for key, value in options.items()})
    except registry.Unavailable as exc:
        raise registry.Unavailable(f"inner {name}: {exc}") from exc


# ----- what the inner must run -----------------------------------------------
def _empty(workload: Workload) -> bool:
    # A sub-mask with no visible pair needs no kernel: it contributes nothing.
    return len(workload.mask.slice_table) == 0


def sub_support(name: str, inner: Backend, labelled: Labelled) -> Support:
    """Whether `inner` runs every non-empty sub-workload exactly; how lists
    the distinct ways it does (one when the ranks agree)."""
    hows, directions = [], None
    for label, workload in labelled:
        if _empty(workload):
            continue
        support = inner.supports(workload)
        if not support.ok:
            return Support.no(
                f"inner {name} cannot run the sub-mask of {label} "
                f"({workload.seqlen_q} x {workload.seqlen_k}): {support.reason}")
        if support.how not in hows:
            hows.append(support.how)
        if support.directions is not None:
            directions = tuple(d for d in (directions or support.directions)
                               if d in support.directions)
    return Support.yes(" / ".join(hows) or "every sub-mask empty", directions)


def ring_support(name: str, inner: Backend, labelled: Labelled, steps: int) -> Support:
    """sub_support for a ring: the inner needs a ring kernel (out and lse)."""
    if name not in _RING_KERNELS:
        why = _NO_LSE.get(name, f"{name} offers no (out, log-sum-exp) form")
        return Support.no(f"a ring merges partial results by log-sum-exp and takes each step's "
                          f"gradients from the final out and lse; inner {name}: {why}")
    support = sub_support(name, inner, labelled)
    if not support.ok or name == PALLAS:
        return support
    # The dense kernel: one boolean (S/cp)^2 mask per step on every rank.
    cells = steps * labelled[0][1].seqlen_q * labelled[0][1].seqlen_k
    if cells > expressions.DENSE_MASK_CELLS:
        return Support.no(f"the dense ring kernel of inner {name} holds {steps} step masks of "
                          f"{labelled[0][1].seqlen_q} x {labelled[0][1].seqlen_k} per rank, "
                          f"over {expressions.DENSE_MASK_CELLS} cells")
    return Support.yes(DenseRing.how, support.directions)


# ----- all-gather and Ulysses: the inner's own build, per rank ---------------
def _built(inner: Backend, workload: Workload) -> Callable:
    if _empty(workload):
        return lambda q, k, v: jnp.zeros_like(q)
    return inner.build(workload)


def by_rank(inner: Backend, workloads: Sequence[Workload], axis) -> Callable:
    """f(q, k, v) inside shard_map: rank r runs inner.build(workloads[r]).

    shard_map runs one program, so ranks with different sub-masks select
    their branch by jax.lax.axis_index; equal sub-workloads share one.
    """
    distinct = list(dict.fromkeys(workloads))
    functions = [_built(inner, workload) for workload in distinct]
    if len(functions) == 1:
        return functions[0]
    branch = jnp.asarray([distinct.index(workload) for workload in workloads], jnp.int32)

    def attend(q, k, v):
        return jax.lax.switch(branch[jax.lax.axis_index(axis)], functions, q, k, v)

    return attend


# ----- ring kernels: (out, lse) and per-step gradients -----------------------
@dataclasses.dataclass(frozen=True)
class PallasRing:
    """jax.pallas_flex with per-(rank, step) plan tables as arrays."""

    forward_geometry: flex_plan.Geometry
    backward_geometry: flex_plan.Geometry
    lowering: flex_kernel.Lowering
    # Each step continues from the running (out, lse) inside the kernel
    # (attend_onto) instead of a separate log-sum-exp merge pass.
    merge_in_kernel: bool = False

    @classmethod
    def for_masks(cls, inner: Backend, masks: Sequence[AttnMask], workload: Workload):
        """The kernel and the masks' (forward, backward) tables, stacked on
        axis 0 (the backward's blocks as the inner chooses them for the
        workload: PallasFlexBackend.backward_blocks)."""
        tiling = inner.tiling
        blocks = inner.backward_blocks(workload.dtype, workload.head_dim)
        forward = [flex_plan.make_plan(m, tiling.block_q, tiling.block_k) for m in masks]
        backward = [flex_plan.make_plan(m, *blocks) for m in masks]
        as_arrays = lambda tree: jax.tree.map(jnp.asarray, tree)  # noqa: E731
        forward_geometry, forward_tables = flex_plan.stack_plans(forward)
        backward_geometry, backward_tables = flex_plan.stack_plans(backward)
        tables = (as_arrays(forward_tables), as_arrays(backward_tables))
        return cls(forward_geometry, backward_geometry, inner.lowering), tables

    def attend(self, q, k, v, tables):
        forward_tables, backward_tables = tables
        return flex_kernel.flex_attention_with_tables(
            q, k, v, self.forward_geometry, forward_tables, self.backward_geometry,
            backward_tables, self.lowering)

    def attend_onto(self, q, k, v, partial, tables):
        """(out float32, lse) of the rows over these keys and those of
        `partial` ((out, lse) so far, None at the first step)."""
        return flex_kernel.flex_attention_onto(q, k, v, partial, self.forward_geometry,
                                               tables[0], self.lowering)

    def gradients(self, q, k, v, out, lse, dout, tables):
        return flex_kernel.block_gradients(q, k, v, out, lse, dout, self.backward_geometry,
                                           tables[1], self.lowering)

    def gradients_onto(self, q, k, v, out, lse, dout, sums, tables):
        """The running float32 (dq, dk, dv) plus this step's share."""
        return flex_kernel.block_gradients(q, k, v, out, lse, dout, self.backward_geometry,
                                           tables[1], self.lowering, onto=sums)


@dataclasses.dataclass(frozen=True)
class DenseRing:
    """jax.xla's ring kernel: dense boolean masks, XLA einsums, float32 inside."""

    how = ("dense boolean mask per rank and step (O(S^2/cp^2) memory a step), out and lse "
           "from XLA einsums in float32; GQA unrepeated")
    merge_in_kernel: ClassVar[bool] = False  # XLA merges after each step

    @classmethod
    def for_masks(cls, inner: Backend, masks: Sequence[AttnMask], workload: Workload):
        return cls(), np.stack([m.to_dense(expressions.DENSE_MASK_CELLS) for m in masks])

    def attend(self, q, k, v, visible):
        return dense_attention(q, k, v, visible)

    def gradients(self, q, k, v, out, lse, dout, visible):
        return dense_block_gradients(q, k, v, out, lse, dout, visible)


_RING_KERNELS = {PALLAS: PallasRing, DENSE: DenseRing}
MERGES_IN_KERNEL = (PALLAS,)  # ring kernels that can continue from a running (out, lse)


def ring_kernel(name: str, inner: Backend, masks: Sequence[AttnMask], workload: Workload,
                merge_in_kernel: bool = False):
    """(kernel, tables stacked on axis 0) of a ring-capable inner."""
    kernel, tables = _RING_KERNELS[name].for_masks(inner, masks, workload)
    if merge_in_kernel:  # the strategy admits it for MERGES_IN_KERNEL only
        kernel = dataclasses.replace(kernel, merge_in_kernel=True)
    return kernel, tables


def no_gradients(tables):
    """Cotangents of integer or boolean tables (float0 zeros)."""
    return flex_kernel.no_gradients(tables)


# ----- the dense XLA kernel ----------------------------------------------------
def _grouped(q, kv_heads):
    """(b, s, h, d) -> (b, s, kv_heads, group, d): query head h reads K/V head
    h // group, so nothing is repeated."""
    b, s, h, d = q.shape
    return q.reshape(b, s, kv_heads, h // kv_heads, d)


def _scores(q, k, visible):
    """Masked, scaled float32 scores (b, kv_heads, group, sq, sk)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", _grouped(q, k.shape[2]), k,
                        preferred_element_type=jnp.float32) * scale
    return jnp.where(visible, scores, -jnp.inf)


def dense_attention(q, k, v, visible):
    """(out, lse) of attention under a dense (sq, sk) boolean mask.

    lse is (b, heads, sq) float32, natural log; a row that sees nothing
    gives out 0 and lse -inf (flex_kernel's and lcab.reference's convention).
    """
    b, sq, h, d = q.shape
    scores = _scores(q, k, visible)
    peak = scores.max(axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    weights = jnp.exp(scores - peak)
    total = weights.sum(axis=-1, keepdims=True)
    lse = jnp.where(total > 0, jnp.log(jnp.where(total > 0, total, 1.0)) + peak, -jnp.inf)
    probs = weights / jnp.where(total > 0, total, 1.0)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs.astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    return out.reshape(b, sq, h, d).astype(q.dtype), lse[..., 0].reshape(b, h, sq)


def dense_block_gradients(q, k, v, out, lse, dout, visible):
    """float32 dq, dk, dv of attention of q against this K/V block, where out
    and lse are the rows' final values over all their keys (a ring's step)."""
    b, sq, h, d = q.shape
    kv_heads = k.shape[2]
    scale = 1.0 / math.sqrt(d)
    lse = lse.reshape(b, kv_heads, h // kv_heads, sq)[..., None]
    probs = jnp.exp(_scores(q, k, visible) - jnp.where(jnp.isfinite(lse), lse, 0.0))
    dout_g = _grouped(dout, kv_heads).astype(jnp.float32)
    delta = jnp.einsum("bqhgd,bqhgd->bhgq", dout_g,
                       _grouped(out, kv_heads).astype(jnp.float32))[..., None]
    dv = jnp.einsum("bhgqk,bqhgd->bkhd", probs, dout_g)
    dprobs = jnp.einsum("bqhgd,bkhd->bhgqk", dout_g, v.astype(jnp.float32))
    dscores = probs * (dprobs - delta) * scale
    dq = jnp.einsum("bhgqk,bkhd->bqhgd", dscores, k.astype(jnp.float32)).reshape(b, sq, h, d)
    dk = jnp.einsum("bhgqk,bqhgd->bkhd", dscores, _grouped(q, kv_heads).astype(jnp.float32))
    return dq, dk, dv
