"""The flags of `python -m lcab.experiments`, and their validators: a bad
value fails at parse time, naming the valid choices, before anything runs.

The workload flags (--masks, --heads, --head_dim, --dtype, --directions,
--doc_distribution, --doc_sampler, --doc_cap, --mask_seed, --dispatch) are defined in
lcab.experiments.workload_flags, shared with `python -m lcab.model`. Flags
are read only in main (lcab/experiments/__main__.py).
"""

from __future__ import annotations

from absl import flags

from lcab import comm, processes, registry
from lcab.experiments import workload_flags
from lcab.experiments.sweep import parse_seqlen
from lcab.experiments.workload_flags import (  # noqa: F401 - the shared workload flags
    DIRECTIONS, DISPATCH, DOC_CAP, DOC_DISTRIBUTION, DOC_SAMPLER, DTYPE, HEAD_DIM, HEADS,
    MASK_SEED, MASKS)
from lcab.results import COMM_SUITE
from lcab.runner import import_plugins

FRAMEWORKS = ("jax", "torch")
MAX_SEED = 2**63 - 1  # what numpy, JAX and torch all take

FRAMEWORK = flags.DEFINE_string(
    "framework", "all",
    f"Which framework's backends to run: {', '.join(FRAMEWORKS)}, a plugin's (e.g. numpy), or "
    "'all'; each framework runs in a process of its own.")
SUITE = flags.DEFINE_enum(
    "suite", "kernel", [*registry.SUITES, COMM_SUITE],
    "Kernel or CP suite of attention backends, or comm: the CP strategies' collectives.")
BACKENDS = flags.DEFINE_list(
    "backends", None, "Full backend names (e.g. jax.xla,torch.sdpa_math); default: all of "
    "the suite and framework.")
SEQLENS = flags.DEFINE_list("seqlens", None, "Sequence lengths, e.g. 4k,8k,128k,1m.")
BATCH = flags.DEFINE_integer("batch", 1, "Batch size.", lower_bound=1)
WARMUP = flags.DEFINE_integer("warmup", None, "Untimed calls before timing.", lower_bound=0)
ITERS = flags.DEFINE_integer("iters", None, "Timed repeats.", lower_bound=1)
OUT = flags.DEFINE_string("out", "out", "Directory for the run's JSONL rows.")
RESUME = flags.DEFINE_bool(
    "resume", False,
    "Skip rows already in the output files (ERROR and UNAVAILABLE rows are measured again).")
RECORD_UNAVAILABLE = flags.DEFINE_bool(
    "record_unavailable", False,
    "Without --backends, give each backend of the default sweep that cannot run here "
    "(a missing package or device) UNAVAILABLE rows saying why, instead of leaving it out "
    "(the canonical sweeps do: a published table shows what it lacks).")
ISOLATE = flags.DEFINE_bool(
    "isolate", False, "Run each case in a child process (a crash loses one case).")
ISOLATE_TIMEOUT = flags.DEFINE_float(
    "isolate_timeout", 1800.0, "With --isolate, kill a case running longer (seconds).",
    lower_bound=1.0)
WINDOW = flags.DEFINE_integer("window", None, "Window for sliding-window masks.", lower_bound=0)
KEEP = flags.DEFINE_list(
    "keep", None, "Block-sparse masks: kept fractions of kv blocks per q block, each in (0, 1] "
    "(a list runs each; the paper's sparsity sweep is 0.1,0.2,0.5,0.8,1.0).")
SPARSE_BLOCK = flags.DEFINE_list(
    "sparse_block", None, "Block-sparse masks: block sizes (var_block_sparse: the average), "
    "e.g. 64,128; a list runs each.")
SEED = flags.DEFINE_integer("seed", 0, "Seed of the random inputs, in [0, 2**63).",
                            lower_bound=0, upper_bound=MAX_SEED)
FLUSH_L2 = flags.DEFINE_bool("flush_l2", True, "Rewrite 256 MiB between repeats on GPU.")
BACKEND_MODULES = flags.DEFINE_list(
    "backend_modules", [], "Extra modules to import that register backends (plugins).")
GIT_COMMIT = flags.DEFINE_string(
    "git_commit", None, "Commit to record when the tree is not a git checkout.")
BACKEND_OPTIONS = flags.DEFINE_multi_string(
    "backend_options", [],
    "Constructor options of a backend, BACKEND:KEY=VALUE (repeat or comma-separate), e.g. "
    "jax.pallas_flex:block_k=128. Each backend lists its options in the error of a bad one.")
CP_SIZE = flags.DEFINE_integer(
    "cp_size", None, "Context-parallel size of every --suite=cp backend, and of jax.module's CP "
    "inner strategy (default 2).", lower_bound=1)
GOLDEN_DIR = flags.DEFINE_string(
    "golden_dir", None,
    "Keep golden data here: the first run of a workload saves its inputs, outputs and "
    "gradients (orbax); later runs, of either framework, run on those inputs and are compared "
    "with them (golden_err column).")
PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", None,
    "After timing each case, run it once more under the framework's profiler and write the "
    "trace here (one folder per case); python -m lcab.trace_overlap reads how much "
    "communication the compute hid.")
FULL_CHECK = flags.DEFINE_bool(
    "full_check", True,
    "Before timing each case, check its output and gradients at the timed size against a "
    "float32 reference (lcab.fullcheck; columns check_*). --nofull_check is quicker; tables "
    "mark its figures unchecked.")
REFERENCE_CACHE = flags.DEFINE_string(
    "reference_cache", None,
    "Keep the full-size check's float32 references in this folder, so that another process "
    "checking the same workload (the canonical sweeps' parts) reads them instead of computing "
    "them again (lcab.reference_cache); rows are the same with or without it.")
JAX_COORDINATOR = flags.DEFINE_string(
    "jax_coordinator", None, "Multi-process JAX: the coordinator's host:port (process 0's).")
JAX_NUM_PROCESSES = flags.DEFINE_integer(
    "jax_num_processes", None, "Multi-process JAX: how many processes.", lower_bound=1)
JAX_PROCESS_ID = flags.DEFINE_integer(
    "jax_process_id", None, "Multi-process JAX: this process's index.", lower_bound=0)
JAX_DISTRIBUTED_AUTO = flags.DEFINE_bool(
    "jax_distributed_auto", False,
    "Multi-process JAX with jax.distributed's own detection (SLURM, Open MPI).")
DRY_RUN = flags.DEFINE_bool(
    "dry_run", False,
    "Print the cases the sweep would run, and those it would skip and why (unavailable "
    "backends, masks a backend cannot express, rows already done under --resume), then exit "
    "without running anything or writing rows.")
LIST_BACKENDS = flags.DEFINE_bool(
    "list_backends", False,
    "Print every registered backend (of --framework; of --suite when given): its framework "
    "and suite, whether it can run here (why not, if not) and what it claims (masks, "
    "directions, dtypes, head dims, options), then exit.")
PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")
SUMMARY = flags.DEFINE_bool("summary", True, "Print the comparison table at the end.")
RUN_ID = flags.DEFINE_string("run_id", None, "Identifier written into every row.")
COMM_OPS = flags.DEFINE_list(
    "comm_ops", list(comm.COMM_OPS),
    f"--suite=comm: collectives to time ({', '.join(comm.COMM_OPS)}).")
COMM_SIZES = flags.DEFINE_list(
    "comm_sizes", ["4k", "64k", "1m", "4m", "16m", "64m", "256m"],
    "--suite=comm: bytes per rank (nccl-tests' sizes: all_gather's is its output).")
COMM_RANKS = flags.DEFINE_list(
    "comm_ranks", ["2"], "--suite=comm: device counts to time each collective over.")


def parse_keep(text: str) -> float:
    try:
        keep = float(text)
    except ValueError:
        keep = float("nan")
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"--keep {text!r} is not a kept fraction in (0, 1]")
    return keep


def parse_block(text: str) -> int:
    if not str(text).strip().isdigit() or int(text) <= 0:
        raise ValueError(f"--sparse_block {text!r} is not a positive block size in tokens")
    return int(text)


def parse_ranks(text: str) -> int:
    if not text.isdigit() or int(text) < 2:
        raise ValueError(f"--comm_ranks {text!r} is not a device count of 2 or more")
    return int(text)


def option_texts(values) -> list[str]:
    """Every BACKEND:KEY=VALUE of repeated and comma-separated flags."""
    return [t.strip() for value in values or [] for t in value.split(",") if t.strip()]


def parse_backend_option(text: str) -> tuple[str, str, str]:
    """"BACKEND:KEY=VALUE" -> (backend, key, value)."""
    name, _, assignment = text.partition(":")
    key, equals, value = assignment.partition("=")
    if not (name and key and equals):
        raise ValueError(f"--backend_options {text!r} is not BACKEND:KEY=VALUE")
    registry.check_backend_name(name)
    return name, key, value


def check_backend_options(triples, dispatch: str | None = None) -> None:
    """Each backend's options together against its declaration, where its
    class imports here (a strategy's inner options depend on its inner);
    `dispatch` (--dispatch) stands where a CP backend's options name none,
    as the run gives it (dispatch_chunks depends on it)."""
    by_backend: dict[str, dict[str, str]] = {}
    for name, key, value in triples:
        by_backend.setdefault(name, {})[key] = value
    for name, raw in by_backend.items():
        try:
            cls = registry.all_backends()[name].load()
        except Exception:  # noqa: BLE001 - its rows will say UNAVAILABLE; nothing to check here
            continue
        if dispatch is not None and "dispatch" in cls.options:
            raw = {"dispatch": dispatch, **raw}
        # Constructing checks the values too (a dispatch or inner kernel that
        # does not exist), so a bad option fails here, not as UNAVAILABLE rows.
        options = cls.parse_options(raw)
        try:
            cls(**options)
        except ValueError:
            raise
        except Exception:  # noqa: BLE001 - cannot start here; its rows will say why
            pass


workload_flags.validate_each(SEQLENS, parse_seqlen)
for _listed in (SEQLENS, KEEP, SPARSE_BLOCK, BACKENDS, COMM_OPS, COMM_SIZES, COMM_RANKS):
    workload_flags.refuse_empty(_listed)
workload_flags.validate_each(KEEP, parse_keep)
workload_flags.validate_each(SPARSE_BLOCK, parse_block)
workload_flags.validate_each(COMM_OPS, comm.check_op)
workload_flags.validate_each(COMM_SIZES, comm.parse_bytes)
workload_flags.validate_each(COMM_RANKS, parse_ranks)
flags.register_validator(
    DISPATCH.name, lambda value: value is None or len(value) == 1,
    "--dispatch takes one dispatch here (the model, python -m lcab.model, takes several)")


@flags.multi_flags_validator([BACKENDS.name, BACKEND_MODULES.name])
def _check_backends(values):
    try:
        import_plugins(values["backend_modules"] or [])
    except ImportError as exc:
        raise flags.ValidationError(f"--backend_modules: {exc}") from exc
    for name in values["backends"] or []:
        try:
            registry.check_backend_name(name)
        except ValueError as exc:
            raise flags.ValidationError(str(exc)) from exc
    return True


@flags.multi_flags_validator([BACKENDS.name, SUITE.name, FRAMEWORK.name, BACKEND_MODULES.name])
def _check_suite_and_framework(values):
    """Named backends belong to --suite (a kernel backend in a CP sweep
    would be timed as if it were one); --framework names one that exists."""
    try:
        import_plugins(values["backend_modules"] or [])
    except ImportError:
        return True  # _check_backends reports it
    suite = values["suite"]
    known_names = registry.all_backends()  # an unknown name is _check_backends' to report
    wrong = [name for name in values["backends"] or []
             if name in known_names and registry.suite_of(name) != suite]
    if wrong and suite != COMM_SUITE:
        belong = ", ".join(f"{name} ({registry.suite_of(name)})" for name in wrong)
        raise flags.ValidationError(
            f"--backends {belong} not of --suite={suite}; its backends are "
            f"{', '.join(registry.backend_names(suite=suite)) or 'none'}")
    if wrong:
        raise flags.ValidationError("--suite=comm times collectives; it takes no --backends")
    known = sorted({*FRAMEWORKS, *(registry.framework_of(n) for n in registry.backend_names())})
    if values["framework"] not in ("all", *known):
        raise flags.ValidationError(
            f"--framework {values['framework']!r} is not one of {', '.join(known)} or all")
    return True


@flags.multi_flags_validator([BACKEND_OPTIONS.name, BACKEND_MODULES.name, DISPATCH.name])
def _check_backend_options(values):
    try:
        import_plugins(values["backend_modules"] or [])
        check_backend_options((parse_backend_option(text)
                               for text in option_texts(values["backend_options"])),
                              (values["dispatch"] or [None])[0])
    except (ImportError, ValueError) as exc:
        raise flags.ValidationError(str(exc)) from exc
    return True


@flags.multi_flags_validator([JAX_COORDINATOR.name, JAX_NUM_PROCESSES.name, JAX_PROCESS_ID.name,
                              JAX_DISTRIBUTED_AUTO.name])
def _check_jax_processes(values):
    try:
        processes.jax_setting(values["jax_coordinator"], values["jax_num_processes"],
                              values["jax_process_id"], values["jax_distributed_auto"])
    except ValueError as exc:
        raise flags.ValidationError(str(exc)) from exc
    return True
