"""The backend and runtime registry: one immutable table drives dispatch.

Entries name a class by "module:attribute" and are imported only when used,
so listing backends (CLI choices, docs) never imports a framework. Adding a
backend is one module plus one line in BACKENDS.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import types
from collections.abc import Mapping

from lcab.backend import Backend
from lcab.results import inner_kernel, parsed_time
from lcab.runtime import Runtime


@dataclasses.dataclass(frozen=True)
class Change:
    """A change to a backend's code that can move its measured numbers: a
    row measured before it describes older code, and the reports mark it
    (a change that fixes a wrong result is a MISMATCH the gate finds, not
    one of these)."""
    when: str  # the commit's time, ISO 8601 with its UTC offset
    commit: str
    directions: tuple[str, ...]  # the directions whose figures it can move
    what: str  # one line for the reader: what changed, and what it moves
    # "module:function" of the rows it can move (row -> bool), imported only
    # when asked; "": every row of its directions. A scope says True when
    # unsure: an unmarked row must be one the change cannot move.
    scope: str = ""

    def can_move(self, row: Mapping) -> bool:
        if not self.scope:
            return True
        try:
            return bool(_scope_function(self.scope)(row))
        except Exception:  # noqa: BLE001 - a scope that cannot judge marks the row
            return True


@dataclasses.dataclass(frozen=True)
class Entry:
    target: str  # "package.module:ClassName"
    suite: str = "kernel"  # "kernel", "cp" or "module"
    # Newest last. A CP strategy's rows also take its inner kernel's changes.
    changes: tuple[Change, ...] = ()

    def load(self):
        return _imported(self.target)


SUITES = ("kernel", "cp", "module")

_BUILTIN_BACKENDS = {
    "jax.xla": Entry("jax_backends.kernels.xla:XlaBackend"),
    "jax.cudnn": Entry("jax_backends.kernels.cudnn:CudnnBackend"),
    "jax.pallas_triton": Entry("jax_backends.kernels.pallas_triton:PallasTritonBackend"),
    "jax.pallas_mgpu": Entry("jax_backends.kernels.pallas_mgpu:PallasMosaicGpuBackend"),
    "jax.tokamax_mosaic": Entry("jax_backends.kernels.tokamax:TokamaxMosaicBackend"),
    "jax.tokamax_triton": Entry("jax_backends.kernels.tokamax:TokamaxTritonBackend"),
    "jax.tokamax_cudnn": Entry("jax_backends.kernels.tokamax:TokamaxCudnnBackend"),
    "jax.tokamax_mosaic_heuristic": Entry(
        "jax_backends.kernels.tokamax:TokamaxMosaicHeuristicBackend"
    ),
    "jax.tokamax_triton_heuristic": Entry(
        "jax_backends.kernels.tokamax:TokamaxTritonHeuristicBackend"
    ),
    "jax.fa3": Entry("jax_backends.kernels.fa3:Fa3Backend"),
    "jax.pallas_flex": Entry("jax_backends.pallas_flex.backend:PallasFlexBackend", changes=(
        Change("2026-11-28T11:27:33+00:00", "ac1d548", ("bwd",),
               "its Mosaic (Hopper) dK/dV kernels launch their programs in the order asked "
               "(they ran the other order before), so a backward figure may move; outputs "
               "and the forward are unchanged (docs/pallas_flex.md)"),
        Change("2026-11-29T10:59:10+00:00", "be18a1e", ("fwd",),
               "its Mosaic (Hopper) forward's two compute warpgroups take turns by handing "
               "over at named barriers and its partial tiles test each element by one "
               "unsigned compare (+0.3 to +5.7 % forward on one H200), so a forward figure "
               "may move; outputs and the backward are unchanged (docs/pallas_flex.md)"),
        Change("2026-11-29T14:25:31+00:00", "d562af5", ("bwd",),
               "its Mosaic (Hopper) dK/dV kernel tests partial tiles against row bounds less "
               "the tile's first column (+1.3 to +2.1 % backward on sliding_window_causal on "
               "one H200, fewer spills), so a backward figure may move; outputs and the "
               "forward are unchanged (docs/pallas_flex.md)"),
        Change("2026-12-02T16:05:46+00:00", "af7fa1e", ("bwd",),
               "its Mosaic (Hopper) backward splits each K/V head's dK/dV programs over its "
               "query heads where a pass has too few programs or one far heavier than the "
               "rest (+6 to +76 % backward at 1k-2k on one H200), so the one-GPU backward "
               "figures of such workloads may move; others, CP and the forward are "
               "unchanged (docs/pallas_flex.md)",
               scope="jax_backends.pallas_flex.changed_rows:split_by_default"),
        Change("2026-12-03T18:16:29+00:00", "3688c0e", ("fwd",),
               "its Mosaic (Hopper) forward runs one program per SM walking its work items "
               "where a program would walk at most 16k keys (+2 to +28 % forward on one H200: "
               "short sequences, windows, documents), so the one-GPU forward figures of such "
               "workloads may move; full and causal at 32k and longer, CP and the backward are "
               "unchanged (docs/pallas_flex.md)",
               scope="jax_backends.pallas_flex.changed_rows:persistent_by_default"),
        Change("2026-12-04T14:24:58+00:00", "57e7fad", ("fwd",),
               "its Mosaic (Hopper) forward starts its rows head after head where a program "
               "walks 16k keys or more (+0.6 to +4.8 % forward on full at 16k-64k and causal "
               "at 32k-64k on one H200), so those one-GPU forward figures may move; shorter "
               "rows, CP and the backward are unchanged (docs/pallas_flex.md)",
               scope="jax_backends.pallas_flex.changed_rows:head_major_by_default"),
        Change("2026-12-05T05:21:54+00:00", "581e23b", ("fwd",),
               "its Mosaic (Hopper) forward steps 192 keys where a program walks more than "
               "16k keys at head_dim 128 (+3.5 to +5.1 % forward on full at 24k-64k and +1.3 "
               "to +2.7 % on causal at 32k-64k on one H200), so those one-GPU forward figures "
               "may move; shorter rows, CP and the backward are unchanged (docs/pallas_flex.md)",
               scope="jax_backends.pallas_flex.changed_rows:wide_keys_by_default"),
        Change("2026-12-05T08:07:28+00:00", "736a342", ("fwd",),
               "its Mosaic (Hopper) forward steps 128 keys again where the mask cuts more "
               "than 1 % of the tiles (longca_global_window at 32k-40k lost 1.2 to 5.4 % "
               "at 192 on an H200 and an H100), so one-GPU forward figures measured at "
               "192-key steps on such masks may move; full, causal and prefix_lm_causal are "
               "unchanged (docs/pallas_flex.md)",
               scope="jax_backends.pallas_flex.changed_rows:narrow_keys_by_default"),
        Change("2026-12-06T07:16:32+00:00", "8c1c11c", ("bwd",),
               "its Mosaic (Hopper) dK/dV kernel reads each strip's softmax statistics before "
               "the matmuls they follow are issued (+2.5 to +7.1 % backward at 16k-32k on one "
               "H100), so every backward figure of its Mosaic kernels may move, one GPU or CP; "
               "outputs, the forward and the Triton backward are unchanged "
               "(docs/pallas_flex.md)",
               scope="jax_backends.pallas_flex.changed_rows:mosaic_backward"),)),
    "jax.cp_allgather": Entry("jax_backends.cp.allgather:AllGatherBackend", "cp"),
    "jax.cp_ring": Entry("jax_backends.cp.ring:RingBackend", "cp"),
    "jax.cp_ulysses": Entry("jax_backends.cp.ulysses:UlyssesBackend", "cp"),
    "jax.cp_usp": Entry("jax_backends.cp.usp:UspBackend", "cp"),
    "jax.cp_double_ring": Entry("jax_backends.cp.ring:DoubleRingBackend", "cp"),
    "jax.cp_groupcast": Entry("jax_backends.cp.groupcast:GroupCastBackend", "cp", changes=(
        Change("2026-11-28T20:07:30+00:00", "bf4c1cc", ("bwd",),
               "its padded bucket slots no longer copy the sender's first chunk, so the "
               "backward no longer scatter-adds them onto it (5 % faster at cp 4 on "
               "causal_document); outputs and the forward are unchanged "
               "(docs/context_parallel.md)"),)),
    "jax.module": Entry("jax_backends.module.backend:ModuleBackend", "module"),
    "torch.sdpa_math": Entry("torch_backends.kernels.sdpa:SdpaMathBackend"),
    "torch.sdpa_cudnn": Entry("torch_backends.kernels.sdpa:SdpaCudnnBackend"),
    "torch.sdpa_flash": Entry("torch_backends.kernels.sdpa:SdpaFlashBackend"),
    "torch.sdpa_efficient": Entry("torch_backends.kernels.sdpa:SdpaEfficientBackend"),
    "torch.varlen": Entry("torch_backends.kernels.varlen:VarlenBackend"),
    "torch.flex": Entry("torch_backends.kernels.flex:FlexBackend"),
    "torch.flash_attn": Entry("torch_backends.kernels.flash_attn:FlashAttn2Backend"),
    "torch.fa3": Entry("torch_backends.kernels.flash_attn:FlashAttn3Backend"),
    "torch.fa4": Entry("torch_backends.kernels.flash_attn:FlashAttn4Backend"),
    "torch.cp_ulysses": Entry("torch_backends.cp.ulysses:UlyssesBackend", "cp"),
    "torch.cp_allgather": Entry("torch_backends.cp.allgather:AllGatherBackend", "cp"),
    "torch.cp_ring_flex": Entry("torch_backends.cp.ring:RingBackend", "cp", changes=(
        Change("2026-11-27T21:17:28+00:00", "fc2a9e5", ("fwd", "bwd"),
               "its ring steps' FlexAttention could pass torch.compile's recompile limit and "
               "run the dense eager path (causal at cp 4 read 7 / 15 TFLOP/s); the limit now "
               "covers a ring case and hitting it is an error, so a figure may move "
               "(docs/context_parallel.md)"),)),
    "torch.cp_ring": Entry("torch_backends.cp.libraries:YunchangRingBackend", "cp"),
    "torch.cp_usp": Entry("torch_backends.cp.libraries:YunchangUspBackend", "cp"),
    "torch.cp_ring_flash_attn": Entry("torch_backends.cp.libraries:RingFlashAttnBackend", "cp"),
    "torch.cp_native": Entry("torch_backends.cp.libraries:NativeCpBackend", "cp"),
}

_BUILTIN_RUNTIMES = {
    "jax": "jax_backends.runtime:JaxRuntime",
    "torch": "torch_backends.runtime:TorchRuntime",
    "numpy": "lcab.numpy_runtime:NumpyRuntime",  # host-only; plugins and tests
}

_plugins: dict[str, Entry] = {}
BACKENDS = types.MappingProxyType(_BUILTIN_BACKENDS)


class Unavailable(Exception):
    """A backend or runtime cannot be used here; the message says why."""


def framework_of(name: str) -> str:
    return name.split(".", 1)[0]


def suite_of(name: str) -> str:
    return all_backends()[check_backend_name(name)].suite


def all_backends() -> dict[str, Entry]:
    return {**_BUILTIN_BACKENDS, **_plugins}


def backend_names(framework: str | None = None, suite: str | None = None) -> list[str]:
    return [
        name
        for name, entry in all_backends().items()
        if (framework in (None, "all") or framework_of(name) == framework)
        and (suite is None or entry.suite == suite)
    ]


def check_backend_name(name: str) -> str:
    if name not in all_backends():
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(all_backends())}")
    return name


def changes_since(row: Mapping) -> list[Change]:
    """The changes to a row's backend, and to the inner kernel of a CP row
    (its `inner` column, or for older rows the name its notes give),
    made after the row was measured that can move its direction's figure;
    [] for a row without a timestamp or of a backend not registered here."""
    measured = parsed_time(row.get("timestamp"))
    if measured is None:
        return []
    entries = all_backends()
    names = [row.get("backend"), inner_kernel(row)]
    return [change for name in dict.fromkeys(names) if name in entries
            for change in entries[name].changes
            if row.get("direction") in change.directions
            and parsed_time(change.when) > measured and change.can_move(row)]


def _imported(target: str):
    """The attribute a "module:attribute" target names, its module imported."""
    module_name, attribute = target.split(":")
    return getattr(importlib.import_module(module_name), attribute)


_scope_function = functools.cache(_imported)  # reports ask it for every row


def register_backend(name: str, target: str, suite: str = "kernel") -> None:
    """Add a backend from outside LCAB (a --backend_modules plugin or a test)."""
    if "." not in name or framework_of(name) not in _BUILTIN_RUNTIMES:
        raise ValueError(
            f"backend name {name!r} must be <framework>.<name> with framework in "
            f"{', '.join(_BUILTIN_RUNTIMES)}"
        )
    if suite not in SUITES:
        raise ValueError(f"suite={suite!r} is not one of {SUITES}")
    _plugins[name] = Entry(target, suite)


def plugins() -> dict[str, Entry]:
    """Backends registered at run time (handed to --isolate child processes)."""
    return dict(_plugins)


def load_backend(name: str, options: dict[str, str] | None = None) -> Backend:
    """An instance of the named backend, built with its --backend_options;
    Unavailable says why it cannot run."""
    entry = all_backends()[check_backend_name(name)]
    try:
        cls = entry.load()
    except Exception as exc:  # noqa: BLE001 - a broken optional import is a status
        raise Unavailable(f"cannot import {entry.target}: {type(exc).__name__}: {exc}") from exc
    try:
        reason = cls.unavailable_reason()
        if reason:
            raise Unavailable(reason)
        backend = cls(**cls.parse_options(options or {}))
        backend.load_dependencies()
        return backend
    except Unavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - a backend that cannot start is unavailable
        raise Unavailable(f"{name} failed to start: {type(exc).__name__}: {exc}") from exc


_runtimes: dict[str, Runtime] = {}


def load_runtime(framework: str) -> Runtime:
    """The (cached) runtime of a framework; Unavailable if it cannot import."""
    if framework not in _runtimes:
        if framework not in _BUILTIN_RUNTIMES:
            raise ValueError(f"unknown framework {framework!r}")
        try:
            cls = Entry(_BUILTIN_RUNTIMES[framework]).load()
            _runtimes[framework] = cls()
        except Exception as exc:  # noqa: BLE001 - missing framework -> UNAVAILABLE rows
            raise Unavailable(f"{framework} runtime: {type(exc).__name__}: {exc}") from exc
    return _runtimes[framework]
