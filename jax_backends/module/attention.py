"""A Flax (nnx) attention layer over any LCAB JAX backend.

Input projections, the attention function an LCAB backend builds (a kernel
such as jax.xla, jax.pallas_flex or jax.cudnn, or a CP strategy such as
jax.cp_ring), and the output projection: the unit a module-level benchmark
times, so that the projections' GEMMs sit next to the attention as they do
in a model. `module_flops` counts the two shares apart, and the two named
settings (the seed's and the paper's) are data for such a benchmark.

    layer = LcabAttention(1024, 8, 1, 128, backend="jax.cp_ring",
                          backend_options={"cp_size": "2"}, mask=mask,
                          dtype="bfloat16", rngs=nnx.Rngs(0))
    step = train_step_fn(layer)
    y, dx, dparams = step(x, dy)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from lcab import flops as flops_lib
from lcab import registry
from lcab.masks import AttnMask
from lcab.workloads import Workload, canonical_dtype

_JNP_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


class _AttentionFunctions:
    """The backend and the attention function it built for each (batch, seq).

    Kept out of nnx's state on purpose: a static attribute of the module,
    hashed by identity, so a module rebuilt by nnx.merge shares the cache
    and nothing here is traced as a parameter.
    """

    def __init__(self, backend, heads_q: int, heads_kv: int, head_dim: int, dtype: str,
                 mask: AttnMask):
        self.backend = backend
        self.shape = (heads_q, heads_kv, head_dim, dtype)
        self.mask = mask
        self._built: dict[tuple[int, int], Callable] = {}

    def workload(self, batch: int, seqlen: int) -> Workload:
        if seqlen != self.mask.seqlen_q:
            raise ValueError(
                f"the input has {seqlen=} but the mask {self.mask.name} is "
                f"{self.mask.seqlen_q} x {self.mask.seqlen_k}"
            )
        heads_q, heads_kv, head_dim, dtype = self.shape
        return Workload(batch, seqlen, seqlen, heads_q, heads_kv, head_dim, dtype, self.mask)

    def support(self, workload: Workload):
        """The backend's Support; ValueError with its reason when it says no."""
        support = self.backend.supports(workload)
        if not support.ok:
            raise ValueError(f"{self.backend.name} cannot run {workload.key()}: {support.reason}")
        return support

    def directions(self, batch: int, seqlen: int) -> tuple[str, ...]:
        support = self.support(self.workload(batch, seqlen))
        return support.directions or self.backend.directions

    def built(self, batch: int, seqlen: int):
        """The backend's own function for this shape, built once."""
        key = (batch, seqlen)
        if key not in self._built:
            workload = self.workload(batch, seqlen)
            self.support(workload)
            # The first call may come inside a trace (jit, vjp): host constants
            # that build() puts on the device (jax.xla's dense mask) must be
            # concrete arrays, not tracers that a later trace would leak.
            with jax.ensure_compile_time_eval():
                self._built[key] = self.backend.build(workload)
        return self._built[key]

    def get(self, batch: int, seqlen: int, dispatched: bool = False) -> Callable:
        """f(q, k, v) -> out in (batch, seq, heads, dim). dispatched: a CP
        strategy's inputs come in its dispatch order, split over its mesh
        (see `place`), and its output leaves the same way."""
        attend = self.built(batch, seqlen)
        if dispatched:
            attend = getattr(attend, "timed", attend)
        return _in_bshd(attend, self.backend.layout)

    def place(self, arrays: list) -> list:
        """(batch, seq, ...) arrays in a CP strategy's dispatch order, split
        over its mesh, as its `timed` function takes them; unchanged for a
        single-device kernel."""
        batch, seqlen = arrays[0].shape[:2]
        attend = self.built(batch, seqlen)
        return attend.timed_inputs(arrays) if hasattr(attend, "timed_inputs") else arrays

    def place_params(self, params):
        """params replicated over the mesh the built strategy shards on, if any."""
        built = next(iter(self._built.values()), None)
        sharding = getattr(built, "sharding", None)
        if sharding is None:
            return params
        return jax.device_put(params, NamedSharding(sharding.mesh, PartitionSpec()))


def _in_bshd(attend: Callable, layout: str) -> Callable:
    """The backend's function taking and giving (batch, seq, heads, dim)."""
    if layout == "bshd":
        return attend
    if layout != "bhsd":
        raise ValueError(f"unknown backend layout {layout!r}")

    def attend_bhsd(q, k, v):
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
        return jnp.swapaxes(attend(q, k, v), 1, 2)

    return attend_bhsd


class LcabAttention(nnx.Module):
    """x (batch, seq, d_model) -> projections -> LCAB attention -> out projection.

    Parameters are float32 (nnx.Linear, no bias); every projection and the
    attention compute in `dtype` (nnx.Linear casts its input and kernel to
    it), and the output comes back in `dtype`: what mixed-precision training
    does, and what the attention backends are measured at. The attention
    runs on `mask` exactly: a backend whose supports() says no raises
    ValueError with its reason, here at construction and again for every
    new batch size; nothing falls back to another mask or kernel.
    Query head h reads K/V head h // (heads_q // heads_kv), LCAB's GQA rule.
    A backend that cannot run here at all (jax.cudnn without a GPU) raises
    lcab.registry.Unavailable with the registry's reason.
    """

    def __init__(self, d_model: int, heads_q: int, heads_kv: int, head_dim: int, *,
                 backend: str, mask: AttnMask, rngs: nnx.Rngs,
                 backend_options: Mapping[str, str] | None = None,
                 dtype: str = "bfloat16", dispatched: bool = False):
        dtype = canonical_dtype(dtype)
        self.heads_q, self.heads_kv, self.head_dim = heads_q, heads_kv, head_dim
        self.dtype = dtype
        # As in a CP model: x arrives in the strategy's dispatch order, split
        # over its mesh (place_inputs), so the projections run on each rank's
        # own tokens and no layer permutes; y leaves in that order.
        self.dispatched = dispatched

        def linear(inputs, outputs):
            return nnx.Linear(inputs, outputs, use_bias=False, dtype=_JNP_DTYPES[dtype],
                              param_dtype=jnp.float32, rngs=rngs)

        self.q_proj = linear(d_model, heads_q * head_dim)
        self.k_proj = linear(d_model, heads_kv * head_dim)
        self.v_proj = linear(d_model, heads_kv * head_dim)
        self.out_proj = linear(heads_q * head_dim, d_model)
        loaded = registry.load_backend(backend, dict(backend_options or {}))
        self.attention = nnx.static(
            _AttentionFunctions(loaded, heads_q, heads_kv, head_dim, dtype, mask))
        # Fail at construction, not at the first (traced) call.
        self.attention.support(self.attention.workload(1, mask.seqlen_q))

    def __call__(self, x):
        batch, seqlen, _ = x.shape
        attend = self.attention.get(batch, seqlen, self.dispatched)
        q = self._heads(self.q_proj(x), self.heads_q)
        k = self._heads(self.k_proj(x), self.heads_kv)
        v = self._heads(self.v_proj(x), self.heads_kv)
        out = attend(q, k, v)
        return self.out_proj(out.reshape(batch, seqlen, self.heads_q * self.head_dim))

    def _heads(self, projected, heads: int):
        batch, seqlen, _ = projected.shape
        return projected.reshape(batch, seqlen, heads, self.head_dim)

    def place_inputs(self, arrays: list) -> list:
        """Natural-order (batch, seq, ...) arrays as a dispatched layer takes
        them (and gives y and dx back): in the CP strategy's dispatch order,
        split over its mesh. Unchanged for a single-device kernel."""
        return self.attention.place(arrays)

    def place_params(self, params):
        """Parameters beside dispatched inputs: whole on every device of the
        CP strategy's mesh (a single-device kernel's stay where they are)."""
        return self.attention.place_params(params)

    def directions(self, batch: int) -> tuple[str, ...]:
        """The directions ("fwd", "bwd") the backend runs this mask in."""
        return self.attention.directions(batch, self.attention.mask.seqlen_q)


@dataclasses.dataclass(frozen=True)
class TrainStep:
    """Forward + backward of a whole LcabAttention.

    `fn(params, x, dy) -> (y, dx, dparams)` is jitted and pure, so a timer
    can lower and compile it ahead (jax.jit(fn).lower(params, x, dy)) with
    the parameters as arguments rather than constants folded into the
    program; calling the TrainStep itself passes the module's parameters.
    """

    fn: Callable
    params: nnx.State

    def __call__(self, x, dy):
        return self.fn(self.params, x, dy)


def train_step_fn(module: LcabAttention) -> TrainStep:
    """The module's forward + backward, gradients wrt x and every parameter."""
    graphdef, params = nnx.split(module, nnx.Param)

    def forward(params, x):
        return nnx.merge(graphdef, params)(x)

    def step(params, x, dy):
        if "bwd" not in module.directions(x.shape[0]):  # at trace time: shapes only
            raise ValueError(f"{module.attention.backend.name} has no backward for "
                             f"{module.attention.mask.name}")
        y, pullback = jax.vjp(forward, params, x)
        dparams, dx = pullback(dy.astype(y.dtype))
        return y, dx, dparams

    return TrainStep(jax.jit(step), params)


# ----- FLOPs ----------------------------------------------------------------------

# Multiples of the forward GEMM count: the backward of y = x @ W is two GEMMs
# of the same size (dx = dy @ W^T, dW = x^T @ dy).
_GEMM_TIMES_FORWARD = {"fwd": 1, "bwd": 2, "fwd_bwd": 3}


@dataclasses.dataclass(frozen=True)
class ModuleFlops:
    """FLOPs of one LcabAttention call, the attention and the projections apart."""

    attention: int
    projections: int

    @property
    def total(self) -> int:
        return self.attention + self.projections


def module_flops(batch: int, seqlen: int, d_model: int, heads_q: int, heads_kv: int,
                 head_dim: int, mask: AttnMask, direction: str = "fwd") -> ModuleFlops:
    """Exact FLOPs: attention by LCAB's convention (lcab.flops, the mask's
    area), projections as 2 * M * N * K per GEMM, backward twice forward."""
    if direction not in _GEMM_TIMES_FORWARD:
        raise ValueError(f"direction={direction!r} is not one of {flops_lib.DIRECTIONS}")
    if (mask.seqlen_q, mask.seqlen_k) != (seqlen, seqlen):
        raise ValueError(f"{seqlen=} but the mask is {mask.seqlen_q} x {mask.seqlen_k}")
    tokens = batch * seqlen
    projected = (heads_q + 2 * heads_kv) * head_dim  # Q, K and V outputs
    forward_gemms = 2 * tokens * d_model * projected + 2 * tokens * heads_q * head_dim * d_model
    attention = flops_lib.attention_flops(mask.area(), batch=batch, heads_q=heads_q,
                                          head_dim=head_dim, direction=direction)
    return ModuleFlops(attention, forward_gemms * _GEMM_TIMES_FORWARD[direction])


# ----- named settings ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModuleSetting:
    """The shape of one module-level CP benchmark: per-rank heads, global length."""

    name: str
    cp_size: int
    seqlen: int  # global: the sequence the CP strategy shards over cp_size ranks
    heads_q: int
    heads_kv: int
    head_dim: int
    d_model: int
    batch: int = 1
    dtype: str = "bfloat16"

    @property
    def tokens_per_rank(self) -> int:
        return self.seqlen // self.cp_size


def seed_setting(cp_size: int, tokens_per_rank: int = 8192) -> ModuleSetting:
    """The seed's 64:8 heads split 8 ways by tensor parallelism: each rank's
    module has 8 query heads and 1 K/V head, d_model = 8 * 128. The seed
    fixes no CP length; 8k tokens per rank (the paper's) unless given."""
    return ModuleSetting("seed", cp_size, tokens_per_rank * cp_size, heads_q=8, heads_kv=1,
                         head_dim=128, d_model=8 * 128)


def paper_setting(cp_size: int) -> ModuleSetting:
    """The paper's CP setting: 64:8 heads, head_dim 128, 8k tokens per GPU."""
    return ModuleSetting("paper", cp_size, 8192 * cp_size, heads_q=64, heads_kv=8,
                         head_dim=128, d_model=64 * 128)
