"""The canonical sweeps, each cut into parts that fit ten minutes of one GPU
machine: what `python -m lcab.experiments.canonical SWEEP` runs.

A part is one or more runs of the experiments CLI writing into one folder.
A run is plain (the CLI in one process; it supervises its framework
processes itself), ``jax_processes`` (one JAX process per GPU meeting through
jax.distributed, the path a multi-node cluster takes) or ``torchrun_nodes``
(torchrun with two rendezvous "nodes" of GPUs on one host). The parts'
settings are the named flagfiles' (experiments/*.flags); a part only picks
the framework, lengths, masks or CP size. Parts are sized by measurement
(about ten minutes each with the full-size check on an H100); a part that
overruns is resumed where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from lcab.canonical import RERUNS, ROOT, STATE_NAME, SWEEPS, done_parts
from lcab.experiments import presets

PLAIN, JAX_PROCESSES, TORCHRUN_NODES = "plain", "jax_processes", "torchrun_nodes"


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of the experiments CLI: its flags and how it is started."""

    flags: tuple[str, ...]
    launcher: str = PLAIN
    processes: int = 1  # jax_processes: processes; torchrun_nodes: nodes


# The packages a part needs besides its framework, as pyproject.toml's
# extras declare them (a test holds the two together): a part does not
# start where one cannot be imported, and a part whose rows say one could
# not be imported is not done (lcab.experiments.canonical). torch's CP
# strategies run yunchang's; its kernels do not.
STRATEGY_PACKAGES = {"jax": (), "torch": ("yunchang",)}
# The GPU-only kernels a kernel part compares with (pyproject's GPU extras),
# needed only where a GPU is: a sweep without --backends leaves out what
# cannot load here without writing a row (the CPU default run must), so on a
# GPU machine set up without them a part would quietly lose those columns.
# torch's flash-attn has no build for the GPU machine's torch: not required.
GPU_KERNEL_PACKAGES = {"jax": ("tokamax", "flash_attn3_jax"), "torch": ()}
# And every other backend a kernel part's sweep would run that cannot run
# on the machine (torch's flash-attn there) gets rows saying so.
RECORD_UNAVAILABLE = "--record_unavailable"


def _needs(framework: str, strategies: bool = False) -> tuple[str, ...]:
    return (framework, *(STRATEGY_PACKAGES[framework] if strategies else ()))


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    what: str
    runs: tuple[Run, ...]
    gpus: int = 1
    # Another part whose rows this one must reproduce within noise (the
    # multi-process runs against the single-process ones).
    same_as: str | None = None
    needs: tuple[str, ...] = ()  # packages it cannot run without (_needs)
    gpu_needs: tuple[str, ...] = ()  # and on a GPU machine (GPU_KERNEL_PACKAGES)

    def packages(self, on_gpu: bool) -> tuple[str, ...]:
        """What it cannot run without on this machine (needs, and gpu_needs on a GPU)."""
        return (*self.needs, *(self.gpu_needs if on_gpu else ()))

    @property
    def folder(self) -> str:
        """Its folder in the run: a rerun's rows are kept out of tables."""
        return f"{RERUNS}/{self.name}" if self.same_as else self.name


def _flagfile(name: str) -> str:
    return f"--flagfile={ROOT / 'experiments' / name}"


def _k(tokens: int) -> str:
    return f"{tokens}k"


_BLOG_MASKS = ("full", "causal", "full_document", "causal_document", "sliding_window_causal",
               "varlen_block_causal")
_PAPER_MASKS = ("full", "causal", "sliding_window", "sliding_window_causal",
                "longca_global_window", "full_document", "causal_document",
                "block_causal_document", "share_question", "causal_blockwise",
                "prefix_lm_document", "prefix_lm_causal")
_FRAMEWORKS = ("jax", "torch")
_CP_MASKS = ("full", "causal", "full_document", "causal_document")
_CP_SIZES = (2, 4)
_CP_TOKENS_PER_GPU = (8, 32)
# Strategies added after the cp sweep's flagfiles were first run: parts of
# their own (at 8k tokens per GPU all four masks in one), so that parts
# already done, whose flagfile lists the strategies they ran, stay done.
ADDED_STRATEGIES = {"jax": ("jax.cp_groupcast",), "torch": ()}


def _groups(items: tuple[str, ...], size: int) -> list[tuple[str, ...]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _kernel_parts(flagfile: str, masks: tuple[str, ...],
                  length_groups: list[tuple[str, tuple[str, ...], dict[str, int]]]) -> list[Part]:
    """framework x lengths x masks, `per_part[framework]` masks to a part:
    a case costs JAX more than torch (it compiles each kernel, and the
    pallas and tokamax ones take seconds), and long ones more (the check and
    timing grow with S^2)."""
    parts = []
    for framework in _FRAMEWORKS:
        for label, lengths, per_part in length_groups:
            for group in _groups(masks, per_part[framework]):
                name = f"{framework}-{label}" + (f"-{'+'.join(group)}" if group != masks else "")
                flags = (_flagfile(flagfile), f"--framework={framework}",
                         f"--seqlens={','.join(lengths)}", f"--masks={','.join(group)}",
                         RECORD_UNAVAILABLE)
                parts.append(Part(name, f"{framework} kernels, {', '.join(group)} at "
                                  f"{', '.join(lengths)}", (Run(flags),),
                                  needs=_needs(framework),
                                  gpu_needs=GPU_KERNEL_PACKAGES[framework]))
    return parts


# Measured on an H100 with the full-size check (2026-11-27): a JAX case of
# the nine JAX backends takes 100-125 s at 1k-8k (compiles dominate), so a
# part holds one mask's four lengths; torch's are cheaper.
def _blog() -> list[Part]:
    return _kernel_parts("seed_blog.flags", _BLOG_MASKS, [
        ("1k-8k", ("1k", "2k", "4k", "8k"), {"jax": 1, "torch": 2}),
        ("16k-24k", ("16k", "24k"), {"jax": 1, "torch": 3}),
        ("32k", ("32k",), {"jax": 2, "torch": 2}),
        ("64k", ("64k",), {"jax": 1, "torch": 1}),
    ])


def _paper() -> list[Part]:
    return _kernel_parts("paper.flags", _PAPER_MASKS, [
        ("1k-8k", ("1k", "2k", "4k", "8k"), {"jax": 1, "torch": 3}),
        ("16k-24k", ("16k", "24k"), {"jax": 1, "torch": 3}),
        ("32k-40k", ("32k", "40k"), {"jax": 1, "torch": 2}),
        ("48k", ("48k",), {"jax": 2, "torch": 3}),
    ])


def _sparsity() -> list[Part]:
    parts = []
    for flagfile, mask in (("paper_block_sparse.flags", "block_sparse"),
                           ("paper_var_block_sparse.flags", "var_block_sparse")):
        for framework in _FRAMEWORKS:
            for length in ("16k", "48k"):
                parts.append(Part(f"{framework}-{mask}-{length}",
                                  f"{framework} kernels, {mask} sweep at {length}",
                                  (Run((_flagfile(flagfile), f"--framework={framework}",
                                        f"--seqlens={length}", RECORD_UNAVAILABLE)),),
                                  needs=_needs(framework),
                                  gpu_needs=GPU_KERNEL_PACKAGES[framework]))
    return parts


def _single_gpu_kernels(framework: str, lengths: str) -> tuple[Run, ...]:
    """The kernels the CP strategies run inside, alone on one GPU at the CP
    runs' global lengths: the reference line of the CP tables."""
    if framework == "jax":
        return (Run((_flagfile("cp_jax.flags"), "--suite=kernel", "--backends=jax.pallas_flex",
                     f"--seqlens={lengths}")),)
    return (Run((_flagfile("cp_torch.flags"), "--suite=kernel", "--backends=torch.flex",
                 f"--seqlens={lengths}")),
            Run((_flagfile("cp_torch.flags"), "--suite=kernel", "--backends=torch.sdpa_cudnn",
                 "--masks=full,causal", f"--seqlens={lengths}")))


def _cp() -> list[Part]:
    parts = []
    for framework in _FRAMEWORKS:
        for tokens in _CP_TOKENS_PER_GPU:
            lengths = ",".join(_k(tokens * cp) for cp in _CP_SIZES)
            parts.append(Part(f"{framework}-single-{lengths.replace(',', '+')}",
                              f"{framework}: the kernel inside its CP strategies on one GPU at "
                              f"{lengths}", _single_gpu_kernels(framework, lengths),
                              needs=_needs(framework)))
        for cp in _CP_SIZES:
            for tokens in _CP_TOKENS_PER_GPU:
                parts += _strategy_parts(framework, cp, tokens)
    parts += _multi_process_parts()
    parts.append(Part("comm", "the strategies' collectives alone over 2 and 4 GPUs (the "
                      "model's link fits)",
                      tuple(Run(("--suite=comm", f"--framework={framework}",
                                 "--comm_ranks=2,4")) for framework in _FRAMEWORKS), gpus=4,
                      needs=_FRAMEWORKS))
    return parts


def _strategy_parts(framework: str, cp: int, tokens: int) -> list[Part]:
    """Every strategy of a framework at one cp size and tokens per GPU, cut
    as measured on 4 x H200 with the full-size check: a JAX CP case takes
    45-155 s (mostly compiling the strategy at the probe's and the timed
    sizes, and the check), so one mask of JAX's five strategies is one part
    at 8k tokens per GPU, and one (mask, strategy) at 32k; a torch mask of
    every strategy takes about 100 s at 8k (all four masks in one part), one
    mask a part at 32k."""
    flagfile = _flagfile(f"cp_{framework}.flags")
    strategies = presets.read(ROOT / "experiments" / f"cp_{framework}.flags")["backends"]
    if framework == "torch":
        groups = [(_CP_MASKS, None)] if tokens <= 8 else [((m,), None) for m in _CP_MASKS]
    elif tokens <= 8:
        groups = [((mask,), None) for mask in _CP_MASKS]
    else:
        groups = [((mask,), name) for mask in _CP_MASKS for name in strategies.split(",")]
    for strategy in ADDED_STRATEGIES[framework]:
        groups += ([(_CP_MASKS, strategy)] if tokens <= 8
                   else [((mask,), strategy) for mask in _CP_MASKS])
    parts = []
    for masks, strategy in groups:
        suffix = "" if masks == _CP_MASKS else "-" + "+".join(masks)
        suffix += f"-{strategy.split('.', 1)[1]}" if strategy else ""
        flags = (flagfile, f"--cp_size={cp}", f"--seqlens={_k(tokens * cp)}",
                 f"--masks={','.join(masks)}", *((f"--backends={strategy}",) if strategy else ()))
        parts.append(Part(f"{framework}-cp{cp}-{_k(tokens)}{suffix}",
                          f"{strategy or f'every {framework} strategy'} at cp {cp}, "
                          f"{_k(tokens)} tokens per GPU, {', '.join(masks)}",
                          (Run(flags),), gpus=cp, needs=_needs(framework, strategies=True)))
    return parts


def _multi_process_parts() -> list[Part]:
    """The cp-4 runs at 8k tokens per GPU once more as a cluster starts
    them: JAX with one process per GPU (jax.distributed) on two masks,
    torch under torchrun with two rendezvous nodes of two GPUs."""
    torch_flags = (_flagfile("cp_torch.flags"), "--cp_size=4", "--seqlens=32k",
                   f"--masks={','.join(_CP_MASKS)}")
    return [
        *(Part(f"jax-cp4-8k-{mask}-processes", f"the jax cp-4 part at 8k tokens per GPU on "
               f"{mask}, one JAX process per GPU (jax.distributed)",
               (Run((_flagfile("cp_jax.flags"), "--cp_size=4", "--seqlens=32k",
                     f"--masks={mask}"), JAX_PROCESSES, 4),), gpus=4,
               same_as=f"jax-cp4-8k-{mask}", needs=_needs("jax", strategies=True))
          for mask in ("full", "causal_document")),
        Part("torch-cp4-8k-nodes", "the torch cp-4 part at 8k tokens per GPU under torchrun "
             "with two rendezvous nodes of two GPUs", (Run(torch_flags, TORCHRUN_NODES, 2),),
             gpus=4, same_as="torch-cp4-8k", needs=_needs("torch", strategies=True)),
    ]


_BUILDERS = {"blog": _blog, "paper": _paper, "sparsity": _sparsity, "cp": _cp}
assert set(_BUILDERS) == set(SWEEPS)


def parts(sweep: str) -> list[Part]:
    """The parts of a canonical sweep, in the order they run."""
    if sweep not in _BUILDERS:
        raise ValueError(f"unknown sweep {sweep!r}; canonical sweeps: {', '.join(SWEEPS)}")
    found = _BUILDERS[sweep]()
    assert len({part.name for part in found}) == len(found), "part names must be unique"
    return found


def progress(folder: pathlib.Path) -> tuple[int, int] | None:
    """(parts done, parts its sweep has) of a canonical run's folder, from
    its parts.json; None where it has none. A part done with --extra flags
    (a subset) is not done."""
    try:
        record = json.loads((pathlib.Path(folder) / STATE_NAME).read_text())
        names = {part.name for part in parts(record["sweep"])}
    except (OSError, ValueError, KeyError):
        return None
    return len(names & done_parts(record)), len(names)
