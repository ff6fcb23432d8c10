"""What the JAX context-parallel strategies share.

Tokens go to ranks by a dispatch (lcab.cp: contiguous, zigzag or the
mask-aware balanced ones). Each rank's share of the mask against each K/V
shard it meets is cut from the slices exactly (lcab.cp.sub_mask) and handed
to the inner kernel, any JAX kernel backend of the registry chosen per run
(`inner`, default jax.pallas_flex): its own supports() must accept every
such sub-workload, or the strategy is UNSUPPORTED with the inner's reason;
nothing runs a different mask. An inner that cannot run here makes the
strategy UNAVAILABLE, naming the inner. Options other than the strategy's
own are the inner's (`--backend_options=jax.cp_ring:block_k=64`).

Called, a strategy takes natural-order arrays (the correctness checks);
timed, its inputs are first put in the dispatch order and split over the
mesh, outside the timed call (DispatchedAttention), as a training step
dispatches once per sequence, not once per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lcab import registry
from lcab.backend import Backend, Support
from lcab.cp.strategy import Strategy
from lcab.workloads import Workload

AXIS = "cp"
DEFAULT_INNER = "jax.pallas_flex"
SHARDED = PartitionSpec(AXIS)
SEQUENCE = PartitionSpec(None, AXIS)  # (batch, seq, heads, dim) split on seq

Labelled = Sequence[tuple[str, Workload]]  # ("rank 1 step 2", its sub-workload)


def shard_map(per_rank, mesh, in_specs, out_specs):
    # pallas_call outputs carry no varying-axes annotation, so shard_map's
    # check of them is off.
    return jax.shard_map(per_rank, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=False)


def inner_names() -> tuple[str, ...]:
    """Every JAX kernel backend of the registry (plugins included)."""
    return tuple(registry.backend_names("jax", "kernel"))


def _inner_class(name: str):
    if name not in inner_names():
        raise ValueError(f"inner={name!r} is not one of {', '.join(inner_names())}")
    return registry.all_backends()[name].load()


def empty(workload: Workload) -> bool:
    # A sub-mask with no visible pair needs no kernel: it contributes nothing.
    return len(workload.mask.slice_table) == 0


def sub_support(name: str, inner: Backend, labelled: Labelled) -> Support:
    """Whether `inner` runs every non-empty sub-workload exactly; how lists
    the distinct ways it does (one when the ranks agree)."""
    hows, directions = [], None
    for label, workload in labelled:
        if empty(workload):
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


def own(tables):
    """This rank's tables: the sharded first axis has length 1 here."""
    return jax.tree.map(lambda t: t[0], tables)


def with_tables(per_rank, mesh, tables, sequence=SEQUENCE, rank=SHARDED):
    """f(q, k, v): per_rank(q, k, v, tables) on every rank, q/k/v split by
    `sequence`, the tables' first axis by `rank`."""
    specs = jax.tree.map(lambda _: rank, tables)
    sharded = shard_map(per_rank, mesh, in_specs=(sequence, sequence, sequence, specs),
                        out_specs=sequence)
    return lambda q, k, v: sharded(q, k, v, tables)


def no_gradients(tables):
    """Cotangents of integer or boolean tables (float0 zeros)."""
    return jax.tree.map(lambda t: np.zeros(t.shape, jax.dtypes.float0), tables)


class ContextParallelBackend(Strategy, Backend):
    """Shared by the strategies: options, dispatch, the inner kernel, the mesh."""

    framework = "jax"
    suite = "cp"
    strategy: ClassVar[str] = ""
    requires = ("jax",)
    options = {"cp_size": int, "dispatch": str, "dispatch_chunks": int, "inner": str}

    @classmethod
    def parse_options(cls, raw: Mapping[str, str]) -> dict[str, Any]:
        """The strategy's own options, and the rest as the inner's (checked
        against the inner's declared options)."""
        mine = {key: value for key, value in raw.items() if key in cls.options}
        parsed = super().parse_options(mine)
        rest = {key: value for key, value in raw.items() if key not in cls.options}
        if rest:
            inner = parsed.get("inner", DEFAULT_INNER)
            try:
                parsed["inner_options"] = _inner_class(inner).parse_options(rest)
            except ValueError as exc:
                raise ValueError(f"{cls.name} options: {', '.join(sorted(cls.options))}; "
                                 f"the rest go to inner {inner}: {exc}") from None
        return parsed

    def __init__(self, cp_size: int = 2, dispatch: str = "zigzag",
                 inner: str = DEFAULT_INNER, inner_options: Mapping[str, Any] | None = None,
                 dispatch_chunks: int | None = None):
        self.set_layout(cp_size, dispatch, dispatch_chunks)
        self.inner_name = inner
        self.inner_options = dict(inner_options or {})
        inner_class = _inner_class(inner)
        inner_class(**self.inner_options)  # bad option values fail here, at once
        self.directions = inner_class.directions
        self.inner_backend: Backend | None = None  # load_dependencies() loads it

    def load_dependencies(self) -> None:
        # Not in __init__, which the CLI calls to check options: an inner
        # kernel may start JAX, which must first learn its host devices.
        options = {**_inner_class(self.inner_name).cp_inner_defaults,
                   **{key: str(value) for key, value in self.inner_options.items()}}
        try:
            self.inner_backend = registry.load_backend(self.inner_name, options)
        except registry.Unavailable as exc:
            raise registry.Unavailable(f"inner {self.inner_name}: {exc}") from exc

    def inner(self) -> tuple[str, dict[str, str]]:
        return self.inner_name, {key: str(value) for key, value in self.inner_options.items()}

    def mask_support(self, workload: Workload) -> Support:
        dispatch = self.dispatch_or_reason(workload, (
            self.layout_problem(workload, jax.device_count(), "devices", "jax sees")
            or self.strategy_problem(workload)))
        if isinstance(dispatch, str):
            return Support.no(dispatch)
        inner = self.inner_support(workload, dispatch)
        if not inner.ok:
            return inner
        return Support.yes(f"{self.strategy}; dispatch={self.dispatch_name}; "
                           f"inner {self.inner_name}: {inner.how}", inner.directions)

    def inner_support(self, workload: Workload, dispatch) -> Support:
        """Whether (and how) the inner kernel runs every rank's sub-workload."""
        return sub_support(self.inner_name, self.inner_backend,
                           self.sub_workloads(workload, dispatch))

    def sub_workloads(self, workload: Workload, dispatch) -> list[tuple[str, Workload]]:
        """(label, workload) of what the inner kernel runs on each rank."""
        raise NotImplementedError

    def tabled_kernel(self):
        """The inner's ring kernel where one compiled program serves every
        rank's sub-mask from sharded tables, else None (then each rank's
        sub-workload is built on its own)."""
        kernel = self.inner_backend.ring_kernel()
        return kernel if kernel is not None and kernel.from_tables else None

    def strategy_problem(self, workload: Workload) -> str | None:
        return None

    def mesh(self) -> Mesh:
        return Mesh(np.array(jax.devices()[: self.cp_size]), (AXIS,))

    def sequence_spec(self) -> PartitionSpec:
        """How the strategy's (batch, seq, heads, dim) inputs split over the mesh."""
        return SEQUENCE

    def build(self, workload: Workload):
        dispatch = self.dispatch(workload)
        sharding = NamedSharding(self.mesh(), self.sequence_spec())
        return DispatchedAttention(self.local_attention(workload, dispatch), dispatch.order(),
                                   sharding)

    def local_attention(self, workload: Workload, dispatch) -> Callable:
        """f(q, k, v) on dispatch-ordered global arrays."""
        raise NotImplementedError


class DispatchedAttention:
    """A strategy as validation and the runtime see it.

    Called, it takes natural-order arrays and returns the natural-order
    output (the permutations run inside). Timed (jax_backends.runtime), the
    inputs are put in the dispatch order and split over the mesh first,
    outside the timed call, and `timed` runs the strategy alone: a training
    step dispatches once per sequence, not once per layer.
    """

    def __init__(self, local, order: np.ndarray, sharding: NamedSharding):
        self.local, self.sharding = local, sharding
        self.order = jnp.asarray(order)
        self.inverse = jnp.asarray(np.argsort(order))
        self._place = jax.jit(lambda x: jnp.take(x, self.order, axis=1),
                              out_shardings=sharding)
        self._restore = jax.jit(lambda x: jnp.take(x, self.inverse, axis=1))

    def __call__(self, q, k, v):
        q, k, v = (jnp.take(x, self.order, axis=1) for x in (q, k, v))
        return jnp.take(self.local(q, k, v), self.inverse, axis=1)

    def timed(self, q, k, v):
        return self.local(q, k, v)

    def timed_inputs(self, inputs):
        return [self._place(x) for x in inputs]

    def restore(self, x):
        """A result of `timed` (an output, or a gradient w.r.t. a dispatched
        input) back in token order: the runtime's untimed calls (the
        full-size check, the finite test) run the timed program itself."""
        return self._restore(x)
