"""The JAX kernel backends: what is special to each, and availability.

What every kernel owes (its claimed families against supports() and the
float64 reference, its declared dtypes and head dims) is the conformance
suite's (tests/conformance.py). Here: how each API states a mask, the
declared limits with their reasons, the UNAVAILABLE rows of GPU-only and
not-installed backends, the Pallas Triton kernel's float32 path, tokamax's
autotuning ahead of the timed calls (GPU), and the JAX runtime's timing.
"""

import importlib
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from jax_backends.kernels import fa3, pallas_triton, tokamax
from lcab import expressions, registry, results
from lcab.masks import make_mask, small_mask
from lcab.runner import Case, Settings, run_cases
from lcab.validation import TOLERANCE
from lcab.workloads import Workload
from tests.row_checks import measured_or_noisy

MODULES = ("kernels.cudnn", "kernels.pallas_triton", "kernels.pallas_mgpu", "kernels.tokamax",
           "kernels.fa3", "pallas_flex.backend")
KERNELS = [name for name in registry.backend_names("jax", "kernel") if name in registry.BACKENDS]
OPTIONAL_PACKAGES = {
    "jax.tokamax_mosaic": "tokamax",
    "jax.tokamax_triton": "tokamax",
    "jax.tokamax_cudnn": "tokamax",
    "jax.tokamax_mosaic_heuristic": "tokamax",
    "jax.tokamax_triton_heuristic": "tokamax",
    "jax.fa3": "flash_attn3_jax",
}
ON_CPU = jax.default_backend() == "cpu"
ROOT = pathlib.Path(__file__).resolve().parent.parent


def backend_class(name):
    """The class itself, whether or not it can run here (no GPU needed)."""
    return registry.all_backends()[name].load()


def workload(mask_name, seqlen=1024, dtype="bfloat16", heads=(8, 2), head_dim=128, batch=1):
    return Workload(batch, seqlen, seqlen, *heads, head_dim, dtype, small_mask(mask_name, seqlen))


def installed(module):
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def run(tmp_path, cases):
    path = tmp_path / "rows.jsonl"
    run_cases(cases, results.Writer(path), Settings(warmup=0, iters=2))
    return results.read_rows([path])


# ----- each API's own limits and mask statements, no GPU needed ---------------
def test_declared_limits():
    classes = {name: backend_class(name) for name in KERNELS}
    assert classes["jax.pallas_mgpu"].dtypes == ("float16",)  # bf16 fails to lower
    assert classes["jax.pallas_mgpu"].head_dims == (64, 128, 256)
    assert classes["jax.fa3"].head_dims == (128,)
    assert 256 not in classes["jax.pallas_triton"].head_dims
    for name in ("jax.cudnn", "jax.fa3", "jax.tokamax_mosaic", "jax.tokamax_cudnn"):
        assert "float32" not in classes[name].dtypes
    assert all(cls.gqa for cls in classes.values())


def test_cudnn_states_only_a_left_window():
    backend = backend_class("jax.cudnn")()
    causal_window = backend.supports(workload("sliding_window_causal"))
    assert causal_window.how == "is_causal; local_window_size=(w, 0)"
    two_sided = backend.supports(workload("sliding_window"))
    assert "only a left window" in two_sided.reason and "(96, 96)" in two_sided.reason
    documents = backend.supports(workload("causal_document"))
    assert "padding only" in documents.reason


@pytest.mark.skipif(not ON_CPU, reason="a GPU may be Hopper")
@pytest.mark.parametrize("name", ["jax.cudnn", "jax.tokamax_cudnn"])
def test_cudnn_head_dims_above_128_need_hopper(name):
    support = backend_class(name)().supports(workload("causal", head_dim=256))
    assert not support.ok and "sm90" in support.reason


def test_pallas_triton_says_how_it_runs():
    backend = pallas_triton.PallasTritonBackend()
    mode = "interpret mode" if ON_CPU else "compiled"
    gqa = backend.supports(workload("causal_document", heads=(8, 2)))
    assert gqa.how == f"segment_ids; causal=True; K/V heads repeated; {mode}"
    mha = backend.supports(workload("full_document", heads=(4, 4)))
    assert mha.how == f"segment_ids; {mode}"
    ragged = backend.supports(Workload(1, 200, 200, 4, 2, 64, "float32", make_mask("causal", 200)))
    assert not ragged.ok and "not a multiple of 128" in ragged.reason
    wide = backend.supports(workload("causal", dtype="float32", head_dim=128))
    assert not wide.ok and "shared memory" in wide.reason


def test_pallas_mgpu_claims_causal_forward_only():
    backend = backend_class("jax.pallas_mgpu")()
    causal = backend.supports(workload("causal", dtype="float16"))
    assert causal.ok and causal.directions == ("fwd",) and causal.how.startswith("causal=True")
    ragged = backend.supports(Workload(1, 192, 192, 4, 2, 64, "float16", make_mask("full", 192)))
    assert not ragged.ok and "not a multiple of 128" in ragged.reason
    full = backend.supports(workload("full", dtype="float16"))
    assert "q scaled by 1/sqrt(head_dim)" in full.how


def test_tokamax_heuristic_variants_skip_autotuning_and_say_so():
    for name in ("jax.tokamax_mosaic_heuristic", "jax.tokamax_triton_heuristic"):
        cls = backend_class(name)
        assert cls.autotunes is False
        assert cls().supports(workload("causal")).how == "is_causal; heuristic config"
    assert backend_class("jax.tokamax_mosaic").autotunes is True
    assert not backend_class("jax.tokamax_mosaic")().in_default_sweep  # named runs only
    assert backend_class("jax.tokamax_mosaic_heuristic")().in_default_sweep


def test_a_sweep_without_tokamax_records_only_the_variants_it_would_run(monkeypatch):
    """Where tokamax cannot load, --record_unavailable writes UNAVAILABLE
    rows for the variants a sweep runs when it can (heuristic configs,
    cuDNN), not for the autotuning ones it leaves out there: the classes
    say which, without tokamax."""
    from lcab.experiments import launch

    def unavailable(name, options=None):
        raise registry.Unavailable(f"{name}: cannot import tokamax")

    monkeypatch.setattr(registry, "load_backend", unavailable)
    assert backend_class("jax.tokamax_triton").in_default_sweep is False
    for name, runs in (("jax.tokamax_mosaic", False), ("jax.tokamax_triton", False),
                       ("jax.tokamax_mosaic_heuristic", True), ("jax.tokamax_cudnn", True)):
        reason = launch.left_out(name, record_unavailable=True)
        assert (reason is None) == runs, name


def test_tokamax_windows_only_where_they_stay_linear():
    mosaic = tokamax.TokamaxMosaicBackend()
    assert mosaic.supports(workload("sliding_window")).how == "local_window_size=(w, w)"
    assert mosaic.supports(workload("sliding_window_causal")).how == "local_window_size=(w, 0)"
    for cls in (tokamax.TokamaxTritonBackend, tokamax.TokamaxCudnnBackend):
        support = cls().supports(workload("sliding_window_causal"))
        assert "dense 1024 x 1024 boolean mask" in support.reason
    documents = mosaic.supports(workload("causal_document"))
    assert "no packed-document input" in documents.reason


def test_fa3_packs_batch_rows_into_one_varlen_sequence():
    backend = fa3.Fa3Backend()
    one = backend.supports(workload("causal_document"))
    assert one.how == "flash_mha_varlen(cu_seqlens, is_causal=True)"
    two = backend.supports(workload("full_document", batch=2))
    assert two.how == "flash_mha_varlen(cu_seqlens); batch rows packed into one sequence"
    documents = make_mask("causal_document", 5, doc_lens=[3, 2]).cu_seqlens()
    assert fa3.packed_cu_seqlens(documents, 3, 5).tolist() == [0, 3, 5, 8, 10, 13, 15]
    assert backend.supports(workload("sliding_window")).how == "flash_mha(window_size=(w, w))"


def test_a_mask_takes_the_first_vocabulary_the_api_speaks():
    # Eight one-token documents are also a (0, 0) window, which comes first.
    mask = make_mask("full_document", 8, doc_lens=[1] * 8)
    assert list(expressions.statements(mask)) == ["window", "documents"]
    case = Workload(1, 8, 8, 4, 2, 128, "bfloat16", mask)
    assert backend_class("jax.cudnn")().supports(case).how == "is_causal; local_window_size=(w, 0)"
    assert backend_class("jax.fa3")().supports(case).how == "flash_mha(window_size=(w, 0))"


def test_window_sizes_stay_out_of_how_so_probes_take_the_same_path():
    # The probe runs a smaller window; Support.how must not change with it.
    backend = fa3.Fa3Backend()
    for family in ("sliding_window", "sliding_window_causal"):
        long = backend.supports(workload(family, seqlen=32768, dtype="bfloat16"))
        short = backend.supports(workload(family, seqlen=256, dtype="bfloat16"))
        assert long.how == short.how


def test_why_cudnn_and_fa3_cannot_sit_in_a_ring():
    for name, why in (("jax.cudnn", "dot_product_attention returns the output only"),
                      ("jax.fa3", "flash_mha and flash_mha_varlen return the output only")):
        cls = backend_class(name)
        assert cls().ring_kernel() is None and why in cls.no_ring_kernel


# ----- availability -----------------------------------------------------------
BLOCK_OPTIONAL = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tokamax", "flash_attn3_jax"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
from lcab import registry
for module in %r:
    __import__("jax_backends." + module)
for name in %r:
    print(name, registry.all_backends()[name].load().unavailable_reason())
"""


def test_modules_import_without_their_optional_packages():
    command = [sys.executable, "-c", BLOCK_OPTIONAL % (MODULES, tuple(OPTIONAL_PACKAGES))]
    result = subprocess.run(command, check=False, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    reasons = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines())
    for name, package in OPTIONAL_PACKAGES.items():
        assert reasons[name].startswith(f"cannot import {package}: ImportError"), reasons[name]


@pytest.mark.parametrize("name", sorted(OPTIONAL_PACKAGES))
def test_rows_are_unavailable_without_the_package(tmp_path, name):
    package = OPTIONAL_PACKAGES[name]
    if installed(package):
        pytest.skip(f"{package} is installed here")
    rows = run(tmp_path, [Case(name, workload("causal"))])
    assert [r["status"] for r in rows] == ["UNAVAILABLE", "UNAVAILABLE"]
    assert f"No module named '{package}'" in rows[0]["reason"]


@pytest.mark.skipif(not ON_CPU, reason="jax sees a GPU")
@pytest.mark.parametrize("name", ["jax.cudnn", "jax.pallas_mgpu"])
def test_gpu_only_rows_are_unavailable_on_a_cpu(tmp_path, name):
    rows = run(tmp_path, [Case(name, workload("full", dtype="float16"))])
    assert [r["status"] for r in rows] == ["UNAVAILABLE", "UNAVAILABLE"]
    assert rows[0]["reason"] == "needs a CUDA GPU (jax sees only cpu)"


# ----- the Pallas Triton kernel's float32 path -----------------------------------
def test_pallas_triton_matches_the_reference_in_float32_at_its_widest_head_dim(tmp_path):
    # The conformance suite runs its first dtype; float32 has its own head_dim limit.
    rows = run(tmp_path, [Case("jax.pallas_triton",
                               workload("causal_document", 256, "float32", (4, 2), 64))])
    bad = [(r["status"], r["reason"]) for r in rows
           if not measured_or_noisy(r)]
    assert not bad and all(r["max_err"] < TOLERANCE["float32"] / 2 for r in rows)
    mode = "interpret mode" if ON_CPU else "compiled"
    assert all(r["notes"] == f"segment_ids; causal=True; K/V heads repeated; {mode}" for r in rows)


# ----- tokamax's autotuning on a GPU --------------------------------------------
@pytest.mark.gpu
def test_tokamax_autotunes_in_build_so_timed_calls_never_miss(caplog):
    try:
        backend = registry.load_backend("jax.tokamax_mosaic")
    except registry.Unavailable as exc:
        pytest.skip(str(exc))
    case = workload("causal", 1024, "bfloat16", (8, 2), 128)
    attend = backend.build(case)  # autotunes here
    shapes = [(1, 1024, 8, 128), (1, 1024, 2, 128), (1, 1024, 2, 128)]
    q, k, v = (jax.numpy.ones(shape, jax.numpy.bfloat16) for shape in shapes)
    caplog.clear()
    out, pullback = jax.vjp(attend, q, k, v)  # eagerly, then as the runtime does
    jax.block_until_ready((attend(q, k, v), pullback(out)))
    runtime = registry.load_runtime("jax")
    jax.block_until_ready((runtime.forward(attend, q, k, v),
                           runtime.forward_backward(attend, q, k, v, q)))
    assert not [r for r in caplog.records if "cache miss" in r.getMessage()]


# ----- the JAX runtime's timing -------------------------------------------------
def test_short_calls_are_batched_so_host_dispatch_is_not_timed():
    from jax_backends.runtime import MAX_CALLS_PER_SAMPLE, calls_per_sample

    assert calls_per_sample(30.0) == 1  # long calls: one per sample
    assert calls_per_sample(1.0) == 25  # fills the 25 ms batch
    assert calls_per_sample(0.01) == calls_per_sample(0.0) == MAX_CALLS_PER_SAMPLE


def test_a_batched_sample_is_the_mean_per_call():
    runtime = registry.load_runtime("jax")
    x = jax.numpy.ones((256, 256), jax.numpy.float32)
    compiled = jax.jit(lambda a: a @ a).lower(x).compile()
    one = np.median([runtime._batch_ms(compiled, (x,), 1, False) for _ in range(5)])
    per_call = np.median([runtime._batch_ms(compiled, (x,), 20, False) for _ in range(5)])
    assert 0 < per_call < 3 * one  # a mean over 20 calls, not their sum


def test_kernels_that_do_not_fit_the_device_are_oom_rows():
    runtime = registry.load_runtime("jax")
    # Words of the errors met on an H100 (2026-11-26): XLA, and a Mosaic GPU
    # kernel whose shared memory did not fit.
    assert runtime.is_oom(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1 bytes"))
    assert runtime.is_oom(ValueError("Mosaic GPU kernel exceeds available shared memory: "
                                     "smem_bytes=232568 > max_smem_bytes=232448"))
    assert not runtime.is_oom(ValueError("Mixed input dtypes for matrix multiplication"))


def test_forward_and_backward_are_timed_together_in_turn():
    """measure_pair: both compiled and warmed, then samples in turn; each
    Timing has its own compile time and every sample."""
    runtime = registry.load_runtime("jax")
    workload = Workload(1, 256, 256, 4, 2, 32, "float32", make_mask("causal", 256))
    backend = registry.load_backend("jax.xla")
    inputs = runtime.random_inputs([(1, 256, 4, 32), (1, 256, 2, 32), (1, 256, 2, 32),
                                    (1, 256, 4, 32)], "float32", 0)
    forward, both = runtime.measure_pair(backend.build(workload), inputs, warmup=1, iters=4,
                                         flush_l2=False)
    assert len(forward.samples_ms) == len(both.samples_ms) == 4
    assert forward.compile_s > 0 and both.compile_s > 0 and both.median_ms > 0


def test_a_case_compiles_each_function_once():
    """The full-size check, the non-finite test and the timing of one case
    share executables: fn is traced once forward and once with gradients;
    after cleanup() (the case's end) it is compiled afresh."""
    runtime = registry.load_runtime("jax")
    workload = Workload(1, 256, 256, 4, 2, 32, "float32", make_mask("causal", 256))
    attend = registry.load_backend("jax.xla").build(workload)
    traces = []

    def counted(q, k, v):
        traces.append(q.shape)
        return attend(q, k, v)

    inputs = runtime.random_inputs([(1, 256, 4, 32), (1, 256, 2, 32), (1, 256, 2, 32),
                                    (1, 256, 4, 32)], "float32", 0)
    first = runtime.forward_backward(counted, *inputs)
    runtime.forward(counted, *inputs[:3])
    forward, both = runtime.measure_pair(counted, inputs, warmup=1, iters=2, flush_l2=False)
    again = runtime.forward_backward(counted, *inputs)
    assert len(traces) == 2  # one forward, one forward+backward
    np.testing.assert_array_equal(np.asarray(first[1]), np.asarray(again[1]))
    assert forward.compile_s > 0 and both.compile_s > 0  # the first compile's seconds
    other = [x[:, :128] for x in inputs]  # another shape is another executable
    runtime.forward(counted, *other[:3])
    assert len(traces) == 3
    runtime.cleanup()
    runtime.forward(counted, *inputs[:3])
    assert len(traces) == 4


def test_the_harness_helpers_compile_once_per_shape_for_the_process():
    """jax_backends.kept: the check's helpers survive the cache clear at
    every case's end, so each backend of a workload reuses them."""
    from jax_backends import kept

    traces = []

    def double(x, times):
        traces.append(x.shape)
        return x * times

    x = jax.numpy.ones((4, 3))
    assert float(kept.call(double, x, times=2).sum()) == 24.0
    runtime = registry.load_runtime("jax")
    runtime.cleanup()  # jax.clear_caches()
    assert float(kept.call(double, x, times=2).sum()) == 24.0
    assert len(traces) == 1
    kept.call(double, x, times=3)  # another static value, another executable
    kept.call(double, jax.numpy.ones((2, 3)), times=2)  # another shape
    assert len(traces) == 3
