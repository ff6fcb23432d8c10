"""The backend protocol: what every kernel or CP strategy declares and does.

A backend is a named implementation, `<framework>.<name>`. It says exactly
what it can express (masks, dtypes, head dims, GQA, directions) through
`supports(workload)`, and `build(workload)` returns a framework function
f(q, k, v) -> out that the framework's runtime compiles, differentiates and
times. Backends never time themselves and the runner never branches on a
backend's name.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from lcab.workloads import DTYPES, Workload

LAYOUTS = ("bshd", "bhsd")  # (batch, seq, heads, dim) or (batch, heads, seq, dim)


@dataclasses.dataclass(frozen=True)
class Support:
    """Whether a backend runs a workload exactly, and how or why not.

    `how` names the way the mask (and shape) is expressed, e.g. "is_causal",
    "dense boolean mask", "cu_seqlens; K/V heads repeated"; it goes into the
    result row's `notes` column.
    """

    ok: bool
    reason: str = ""
    how: str = ""
    # The directions this mask runs in, where fewer than the backend's own
    # (e.g. a kernel with a causal forward but no causal backward).
    directions: tuple[str, ...] | None = None

    @classmethod
    def yes(cls, how: str, directions: tuple[str, ...] | None = None) -> "Support":
        return cls(True, how=how, directions=directions)

    @classmethod
    def no(cls, reason: str) -> "Support":
        return cls(False, reason=reason)


@dataclasses.dataclass(frozen=True)
class ProbeNeeds:
    """What a backend's correctness probe must reach so that it runs the
    code the timed case runs (lcab.validation sizes the probe by it).

    `tilings` are the (block_q, block_k) grids of the backend's passes
    (forward and dQ walk K/V tiles per query block, dK/dV query tiles per
    K/V block). On each, the busiest program must visit at least
    `min_tiles` tiles (a pipeline of two slots wraps twice) and one program
    must see `min_full_runs` separate runs of unmasked tiles, each as far as
    the timed case itself does; with `unaligned`, the length is a multiple
    of no block, so the padding path runs.
    """

    tilings: tuple[tuple[int, int], ...]
    min_tiles: int = 4
    min_full_runs: int = 2
    unaligned: bool = True


class Backend(abc.ABC):
    """Subclass per implementation; register it in lcab.registry."""

    name: ClassVar[str]
    framework: ClassVar[str]
    description: ClassVar[str] = ""
    suite: ClassVar[str] = "kernel"
    layout: ClassVar[str] = "bshd"
    directions: ClassVar[tuple[str, ...]] = ("fwd", "bwd")
    # Why this machine gives an instance fewer `directions` than the backend
    # has elsewhere (a pass that needs a GPU); None: what it lacks, it lacks
    # everywhere. Its missing directions' rows say UNAVAILABLE with this
    # reason instead of UNSUPPORTED.
    directions_problem: ClassVar[str | None] = None
    dtypes: ClassVar[tuple[str, ...]] = DTYPES
    head_dims: ClassVar[tuple[int, ...] | None] = None  # None: any head_dim
    gqa: ClassVar[bool] = True  # False: heads_q must equal heads_kv
    requires: ClassVar[tuple[str, ...]] = ()  # modules that must import
    probe_seqlen: ClassVar[int] = 256  # size of the correctness probe
    # False for backends too slow to set up for every sweep (e.g. autotuning
    # minutes per shape): they run only when named in --backends.
    in_default_sweep: ClassVar[bool] = True
    cp_size: ClassVar[int] = 1
    strategy: ClassVar[str | None] = None
    # Constructor options a run may set (--backend_options NAME:KEY=VALUE),
    # name -> type (int, float, bool or str). Rows say which were set.
    options: ClassVar[dict[str, type]] = {}
    # Options this backend takes as a context-parallel strategy's inner
    # kernel unless the strategy's inner options set them: a default
    # measured on one GPU's whole passes that CP has not been measured with.
    cp_inner_defaults: ClassVar[dict[str, str]] = {}
    # The mask families this backend runs exactly (its supports() accepts a
    # small square workload of each, in its first dtype and head_dim 128 or
    # its first). The conformance suite (tests/conformance.py) holds every
    # registered backend to it: each claim agrees with the float64
    # reference where the backend can run, every other family is refused.
    # None: not a kernel the suite checks (CP strategies, jax.module).
    claimed_masks: ClassVar[frozenset[str] | None] = None
    # Why this backend cannot sit inside a ring (ring_kernel() is None);
    # a ring strategy shows it when asked to run this inner.
    no_ring_kernel: ClassVar[str] = "it offers no (out, log-sum-exp) form"

    @classmethod
    def parse_options(cls, raw: Mapping[str, str]) -> dict[str, Any]:
        """Option texts -> constructor keyword arguments; ValueError names the valid ones."""
        parsed = {}
        for key, text in raw.items():
            if key not in cls.options:
                valid = ", ".join(sorted(cls.options)) or "none"
                raise ValueError(f"{cls.name} has no option {key!r}; its options: {valid}")
            kind = cls.options[key]
            try:
                parsed[key] = _parse_bool(text) if kind is bool else kind(text)
            except ValueError:
                raise ValueError(
                    f"{cls.name} option {key}={text!r} is not a {kind.__name__}") from None
        return parsed

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when usable here; otherwise why not (missing package, no GPU)."""
        for module in cls.requires:
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - any import failure means unavailable
                return f"cannot import {module}: {type(exc).__name__}: {exc}"
        return cls.environment_problem()

    @classmethod
    def environment_problem(cls) -> str | None:
        """Override to require a device or version; None when fine."""
        return None

    def load_dependencies(self) -> None:
        """Load what this instance runs on (jax.module: its inner backend);
        raise lcab.registry.Unavailable with the reason if it cannot. The
        registry calls it after construction; constructing alone, as the
        CLI does to check options, must not start a framework."""

    def supports(self, workload: Workload) -> Support:
        """Shape checks shared by every backend, then the backend's mask check."""
        if workload.dtype not in self.dtypes:
            return Support.no(f"dtype {workload.dtype} not in {self.dtypes}")
        if self.head_dims is not None and workload.head_dim not in self.head_dims:
            return Support.no(f"head_dim {workload.head_dim} not in {self.head_dims}")
        if not self.gqa and workload.heads_q != workload.heads_kv:
            return Support.no("needs heads_q == heads_kv (no GQA)")
        return self.mask_support(workload)

    def mask_support(self, workload: Workload) -> Support:
        """Whether (and how) this backend expresses workload.mask exactly.

        Override this, or `plan` when the same decision also yields the
        keyword arguments that state the mask to the kernel.
        """
        return self.plan(workload)[0]

    def plan(self, workload: Workload) -> tuple[Support, dict[str, Any]]:
        """(Support, the kernel's keyword arguments that state the mask)."""
        raise NotImplementedError(f"{type(self).__name__} overrides neither mask_support nor plan")

    def case_notes(self, workload: Workload) -> str:
        """Facts of this case for the row's notes that are not a code path
        (Support.how is, and the correctness probe must share it)."""
        return ""

    def flops(self, workload: Workload, direction: str) -> int:
        """The FLOPs a row's TFLOP/s counts: the attention's (exact mask
        area); a backend timing more than attention (jax.module) adds its own."""
        return workload.flops(direction)

    def ring_kernel(self) -> Any | None:
        """What a context-parallel ring runs inside, where this kernel has
        one: a framework object that attends a K/V block giving (out, lse)
        and takes a block's gradients from the rows' final out and lse (the
        framework's CP package states its shape). None: no such form (see
        `no_ring_kernel`)."""
        return None

    def inner(self) -> tuple[str, dict[str, str]] | None:
        """(registry name, options) of the kernel a strategy runs inside;
        None for a kernel. Rows carry it in their `inner` and
        `inner_options` columns."""
        return None

    def probe_heads_kv(self, workload: Workload) -> int:
        """K/V heads of the correctness probe (few, to keep it small)."""
        return min(workload.heads_kv, 2)

    def probe_needs(self, workload: Workload) -> ProbeNeeds | None:
        """What the probe of `workload` must reach (None: `probe_seqlen`
        tokens suffice, the kernel has no pipeline a short probe misses)."""
        return None

    def pinned_to(self, workload: Workload) -> tuple["Backend", str]:
        """(a backend that takes on any workload the decisions this one
        takes on `workload`, a note naming them): the probe runs it, so a
        choice made from the workload's size (a launch order) is the timed
        case's. Default: (self, "")."""
        return self, ""

    def planned_kwargs(self, workload: Workload) -> dict[str, Any]:
        """plan()'s keyword arguments; ValueError if the mask is not supported."""
        support, kwargs = self.plan(workload)
        if not support.ok:
            raise ValueError(f"{self.name} cannot run this workload: {support.reason}")
        return kwargs

    @abc.abstractmethod
    def build(self, workload: Workload) -> Callable[[Any, Any, Any], Any]:
        """A framework function f(q, k, v) -> out in this backend's layout.

        Host-side mask processing (cu_seqlens, dense masks, schedules)
        happens here, once, outside anything that is timed.
        """


def _parse_bool(text: str) -> bool:
    lowered = str(text).lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no"):
        return False
    raise ValueError(text)
