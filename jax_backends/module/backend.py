"""jax.module: the module-level benchmark -- a whole Flax attention layer
(q/k/v projections, an LCAB backend, output projection;
jax_backends/module/attention.py) timed forward and forward+backward.

`inner=` names the attention inside: any JAX kernel, or a CP strategy with
its `cp_size` and `dispatch`. The layer's input arrives as a CP model holds
it -- in the strategy's dispatch order, split over its mesh -- so each rank
projects only its own tokens. The correctness gate checks the attention
inside (the inner backend's function on the probe, exactly as its own rows
are checked); the projections are XLA matmuls. The row's FLOPs are the
layer's (lcab's attention count plus 2*M*N*K per projection GEMM, twice that
backward); its per-GPU TFLOP/s divides by the inner strategy's cp size.

The seed's CP setting is one tensor-parallel rank's layer (8:1 heads,
d_model 1024: experiments/module_seed.flags); the paper's, 64:8 heads and
8k tokens per GPU (experiments/module_paper.flags).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jax_backends.module.attention import LcabAttention, module_flops
from lcab import registry
from lcab.backend import Backend, Support
from lcab.workloads import Workload

_JNP = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


class ModuleBackend(Backend):
    name = "jax.module"
    framework = "jax"
    suite = "module"
    description = ("a Flax attention layer: q/k/v projections, the inner backend (kernel or CP "
                   "strategy), output projection; d_model = heads_q x head_dim unless given")
    options = {"inner": str, "d_model": int, "cp_size": int, "dispatch": str}

    def __init__(self, inner: str = "jax.pallas_flex", d_model: int = 0,
                 cp_size: int | None = None, dispatch: str | None = None):
        if registry.framework_of(inner) != "jax" or registry.suite_of(inner) == "module":
            raise ValueError(f"inner={inner!r} must be a JAX kernel or CP backend")
        if d_model < 0:
            raise ValueError(f"d_model={d_model} must be >= 0 (0: heads_q x head_dim)")
        forwarded = {k: str(v) for k, v in (("cp_size", cp_size), ("dispatch", dispatch))
                     if v is not None}
        if forwarded and registry.suite_of(inner) != "cp":
            raise ValueError(f"{', '.join(forwarded)} apply to a CP strategy; inner={inner} "
                             "is a kernel")
        self.inner_name, self.inner_options, self.d_model = inner, forwarded, d_model
        self._inner = None

    def load_dependencies(self) -> None:
        # Not in __init__, which the CLI calls to check options: loading a CP
        # strategy starts JAX, which must first learn its host devices.
        self._inner = registry.load_backend(self.inner_name, self.inner_options)

    @property
    def inner_backend(self) -> Backend:
        if self._inner is None:
            self.load_dependencies()
        return self._inner

    def inner(self) -> tuple[str, dict[str, str]]:
        return self.inner_name, dict(self.inner_options)

    # The probe, the timer and the row see the inner backend's shapes and limits.
    layout = property(lambda self: self.inner_backend.layout)
    directions = property(lambda self: self.inner_backend.directions)
    dtypes = property(lambda self: self.inner_backend.dtypes)
    head_dims = property(lambda self: self.inner_backend.head_dims)
    gqa = property(lambda self: self.inner_backend.gqa)
    probe_seqlen = property(lambda self: self.inner_backend.probe_seqlen)
    cp_size = property(lambda self: self.inner_backend.cp_size)

    @property
    def strategy(self) -> str:
        """The row's strategy column: a CP inner's strategy, else the inner
        kernel's name, so layers around different kernels stay apart."""
        return self.inner_backend.strategy or self.inner_name

    def width(self, workload: Workload) -> int:
        return self.d_model or workload.heads_q * workload.head_dim

    def mask_support(self, workload: Workload) -> Support:
        inner = self.inner_backend.supports(workload)
        if not inner.ok:
            return inner
        return Support.yes(f"module d_model {self.width(workload)}: projections around "
                           f"inner {self.inner_name} ({inner.how})", inner.directions)

    def case_notes(self, workload: Workload) -> str:
        return self.inner_backend.case_notes(workload)

    def probe_heads_kv(self, workload: Workload) -> int:
        return self.inner_backend.probe_heads_kv(workload)

    def flops(self, workload: Workload, direction: str) -> int:
        return module_flops(workload.batch, workload.seqlen_q, self.width(workload),
                            workload.heads_q, workload.heads_kv, workload.head_dim,
                            workload.mask, direction).total

    def build(self, workload: Workload):
        return ModuleFunction(self, workload, self.inner_backend.build(workload))


class ModuleFunction:
    """Called, the inner attention (what the correctness gate checks);
    timed (jax_backends.runtime), the whole layer on x (and dy)."""

    def __init__(self, backend: ModuleBackend, workload: Workload, attention):
        self.backend, self.workload, self.attention = backend, workload, attention
        self._layer = None

    def __call__(self, q, k, v):
        return self.attention(q, k, v)

    def layer(self) -> LcabAttention:
        """Built on first timing only: the paper's d_model 8192 makes large
        weights, which the small correctness probe never needs."""
        if self._layer is None:
            w = self.workload
            self._layer = LcabAttention(
                self.backend.width(w), w.heads_q, w.heads_kv, w.head_dim,
                backend=self.backend.inner_name, backend_options=self.backend.inner_options,
                mask=w.mask, dtype=w.dtype, rngs=nnx.Rngs(0), dispatched=True)
            self._graph, self._params = nnx.split(self._layer, nnx.Param)
        return self._layer

    def timed_inputs(self, inputs):
        """x (and dy, when timing the backward) in the layer's dispatch
        order and placement, and the layer's parameters."""
        layer, w = self.layer(), self.workload
        keys = jax.random.split(jax.random.key(1), 2)
        shape = (w.batch, w.seqlen_q, self.backend.width(w))
        arrays = [jax.random.normal(key, shape, _JNP[w.dtype]) for key in keys]
        x, dy = layer.place_inputs(arrays)
        return [x, layer.place_params(self._params)] + ([dy] if len(inputs) == 4 else [])

    def timed(self, x, params):
        return nnx.merge(self._graph, params)(x)

    def timed_fwd_bwd(self, x, params, dy):
        """(y, dx, dparams): one training step of the layer."""
        y, pullback = jax.vjp(self.timed, x, params)
        dx, dparams = pullback(dy.astype(y.dtype))
        return y, dx, dparams
