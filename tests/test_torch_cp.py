"""PyTorch context parallelism on CPU processes (torchrun, gloo), through
the CLI as a user runs it: every strategy that runs on gloo, every mask
family, cp 2 and 4, each dispatch, forward and backward, checked by the
runner against the float64 reference."""

import json
import subprocess
import sys

import pytest
import torch

from lcab import registry, results
from lcab.masks import MASK_NAMES
from tests.row_checks import measured_or_noisy

ON_GLOO = ("torch.cp_ulysses", "torch.cp_allgather", "torch.cp_ring_flex")
# A kernel with a CPU backward inside (FlexAttention has none on a CPU).
MATH_INNER = [f"--backend_options={name}:inner=torch.sdpa_math" for name in ON_GLOO]


def run_cp(tmp_path, *flags, cp=2, timeout=600):
    command = [sys.executable, "-m", "lcab.experiments", "--framework=torch", "--suite=cp",
               f"--cp_size={cp}", "--head_dim=32", "--dtype=float32",
               "--warmup=1", "--iters=5", f"--out={tmp_path}", "--noprogress", "--nosummary",
               "--git_commit=test", *flags]
    if not any(flag.startswith("--seqlens") for flag in flags):
        command.append("--seqlens=512")
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return results.read_rows([tmp_path / "cp_torch.jsonl"])


def assert_checked(rows, tolerance=1e-4):
    """Every row passed the reference check; a CPU time may still be too
    noisy to subtract (bwd = fwd+bwd - fwd), which its row says."""
    assert rows
    for row in rows:
        assert measured_or_noisy(row), (row["backend"], row["mask"], row["reason"])
        assert row["max_err"] < tolerance, (row["backend"], row["mask"], row["max_err"])


@pytest.mark.slow
def test_every_family_at_cp2_zigzag_forward_and_backward(tmp_path):
    rows = run_cp(tmp_path, f"--masks={','.join(MASK_NAMES)}", "--heads=4:2",
                  "--dispatch=zigzag", *MATH_INNER)
    assert_checked(rows)
    assert len(rows) == len(MASK_NAMES) * len(ON_GLOO) * 2
    for row in rows:
        assert row["cp_size"] == 2 and row["n_devices"] == 2
        assert row["strategy"] in ("ulysses", "allgather", "ring")
        assert "dispatch=zigzag; inner " in row["notes"]
        assert "imbalance=" in row["notes"]


@pytest.mark.slow
def test_every_family_at_cp4_balanced(tmp_path):
    rows = run_cp(tmp_path, f"--masks={','.join(MASK_NAMES)}", "--heads=4:4",
                  "--dispatch=balanced", *MATH_INNER, cp=4)
    assert_checked(rows)
    assert {row["cp_size"] for row in rows} == {4}
    # the balanced dispatch evens out the all-gather's per-rank areas
    causal = [r for r in rows if r["mask"] == "causal" and r["strategy"] == "allgather"]
    imbalance = float(causal[0]["notes"].split("imbalance=")[1].split(";")[0])
    assert imbalance < 1.1


def test_the_ring_balanced_dispatch_runs_the_ring_and_the_all_gather(tmp_path):
    """And the all-gather with dispatch_chunks=8 (eight chunks a rank, not
    ring_balanced's sixteen), checked the same way."""
    rows = run_cp(tmp_path, "--masks=causal_document", "--heads=4:2",
                  "--backends=torch.cp_ring_flex,torch.cp_allgather",
                  "--dispatch=ring_balanced", *MATH_INNER,
                  "--backend_options=torch.cp_allgather:dispatch_chunks=8")
    assert_checked(rows)
    assert len(rows) == 4
    assert all("dispatch=ring_balanced; inner " in row["notes"] for row in rows)
    assert {("dispatch_chunks=8;" in row["notes"], row["backend"]) for row in rows} == {
        (False, "torch.cp_ring_flex"), (True, "torch.cp_allgather")}


def test_contiguous_dispatch_and_what_cannot_run(tmp_path):
    rows = run_cp(tmp_path, "--masks=causal,causal_document", "--heads=4:1",
                  "--dispatch=contiguous", *MATH_INNER)
    by_strategy = {}
    for row in rows:
        by_strategy.setdefault(row["strategy"], []).append(row)
    assert_checked(by_strategy["allgather"] + by_strategy["ring"])
    causal = [r for r in by_strategy["allgather"] if r["mask"] == "causal"][0]
    # rank 1's 256 x 256 square and triangle over the mean of both ranks
    assert f"imbalance={(256 * 256 + 256 * 257 / 2) / (512 * 513 / 4):.3f}" in causal["notes"]
    # one K/V head does not split over two ranks: Ulysses says so, nothing runs
    for row in by_strategy["ulysses"]:
        assert row["status"] == "UNSUPPORTED"
        assert "1 kv heads do not divide by cp_size 2" in row["reason"]


def test_inner_kernel_limits_and_rank_count_are_honoured(tmp_path):
    # FlexAttention has no CPU backward; torch.sdpa_flash no CPU at all;
    # the math kernel's dense mask stops at 16k x 16k cells, so a rank's
    # 16k queries against 32k keys is beyond it.
    rows = run_cp(tmp_path, "--masks=causal_document", "--heads=4:2",
                  "--backend_options=torch.cp_allgather:inner=torch.sdpa_flash",
                  "--backend_options=torch.cp_ulysses:inner=torch.flex")
    status = {(r["backend"], r["direction"]): r for r in rows}
    assert status[("torch.cp_ulysses", "fwd")]["status"] == "OK"
    # A pass the inner lacks on this machine only: UNAVAILABLE, saying why.
    no_backward = "inner kernel torch.flex: torch runs FlexAttention's backward on a GPU only"
    assert status[("torch.cp_ulysses", "bwd")]["status"] == "UNAVAILABLE"
    assert no_backward in status[("torch.cp_ulysses", "bwd")]["reason"]
    # the ring's FlexAttention steps (return_lse) merge exactly; no CPU backward
    assert status[("torch.cp_ring_flex", "fwd")]["status"] == "OK"
    assert status[("torch.cp_ring_flex", "fwd")]["max_err"] < 1e-4
    assert status[("torch.cp_ring_flex", "bwd")]["status"] == "UNAVAILABLE"
    assert no_backward in status[("torch.cp_ring_flex", "bwd")]["reason"]
    if not torch.cuda.is_available():
        flash = status[("torch.cp_allgather", "fwd")]
        assert flash["status"] == "UNAVAILABLE"
        assert "inner kernel torch.sdpa_flash is unavailable: needs a CUDA GPU" in flash["reason"]

    large = run_cp(tmp_path / "32k", "--masks=causal_document", "--heads=4:2", "--seqlens=32k",
                   "--backends=torch.cp_allgather", MATH_INNER[1])
    assert {r["status"] for r in large} == {"UNSUPPORTED"}
    assert ("inner kernel torch.sdpa_math cannot run rank 0's queries: a dense mask of "
            "16384 x 32768 exceeds") in large[0]["reason"]

    mismatched = run_cp(tmp_path / "four", "--masks=full", "--heads=4:2",
                        "--backend_options=torch.cp_allgather:cp_size=4", MATH_INNER[1],
                        "--backends=torch.cp_allgather")
    assert {r["status"] for r in mismatched} == {"UNSUPPORTED"}
    assert "cp_size 4 needs 4 processes; torchrun started 2" in mismatched[0]["reason"]
    assert ["torch.cp_allgather", "cp_size", "4"] in json.loads(
        mismatched[0]["flags"])["backend_options"]


def test_outside_torchrun_the_strategies_say_how_to_start_them():
    for name in ON_GLOO:
        with pytest.raises(registry.Unavailable, match="python -m lcab.experiments "
                                                      "--framework=torch --suite=cp"):
            registry.load_backend(name)


@pytest.mark.parametrize("name", ON_GLOO)
def test_inner_takes_registry_names_only(name):
    cls = registry.all_backends()[name].load()
    for old in ("flex", "math"):
        with pytest.raises(ValueError, match=f"inner='{old}' is not a torch kernel backend; "
                                             "choose one of torch.sdpa_math, "):
            cls(inner=old)
    assert cls().inner() == ("torch.flex", {})
    assert cls(inner="torch.sdpa_math").inner() == ("torch.sdpa_math", {})


def test_every_strategy_names_its_inner_kernel():
    inner = {name: registry.all_backends()[name].load()().inner()[0]
             for name in ("torch.cp_ring", "torch.cp_usp", "torch.cp_ring_flash_attn")}
    assert set(inner.values()) == {"torch.flash_attn"}
    native = registry.all_backends()["torch.cp_native"].load()
    assert native(sdpa="efficient").inner() == ("torch.sdpa_efficient", {})


def test_the_ring_asks_its_inner_for_a_ring_kernel():
    from lcab.cp import cached_dispatch
    from lcab.masks import small_mask
    from lcab.workloads import Workload
    from torch_backends.cp.ring import RingBackend
    from torch_backends.kernels.sdpa import SdpaEfficientBackend, SdpaMathBackend

    mask = small_mask("causal_document", 256)
    workload = Workload(1, 256, 256, 4, 2, 32, "float32", mask)
    dispatch = cached_dispatch("zigzag", mask, 2)
    ring = RingBackend(inner="torch.sdpa_efficient")
    ring.inner_backend = SdpaEfficientBackend()  # what load_dependencies would load on a GPU
    refused = ring.strategy_support(workload, dispatch)
    assert not refused.ok and refused.reason == (
        "inner kernel torch.sdpa_efficient cannot run inside a ring: "
        f"{SdpaEfficientBackend.no_ring_kernel}")
    ring = RingBackend(inner="torch.sdpa_math")
    ring.inner_backend = SdpaMathBackend()
    runs = ring.strategy_support(workload, dispatch)
    assert runs.ok and runs.how.startswith(
        "ring; dispatch=zigzag; inner torch.sdpa_math (dense math with lse); the next shard")


def test_library_strategies_without_their_packages_or_gpu_say_why(tmp_path):
    rows = run_cp(tmp_path, "--masks=causal", "--heads=4:2", "--backends=torch.cp_ring,"
                  "torch.cp_usp,torch.cp_ring_flash_attn,torch.cp_native")
    for row in rows:
        assert row["status"] == "UNAVAILABLE" and row["cp_size"] == 2
        assert "flash_attn" in row["reason"] or "needs a CUDA GPU" in row["reason"]


def test_yunchang_layouts_as_dispatches():
    from torch_backends.cp.libraries import usp_dispatch

    # ring 2 x ulysses 2 over 16 tokens: ring rank 0 holds chunks 0 and 3
    # (4 tokens each), split between its two Ulysses ranks; ring rank 1
    # holds chunks 1 and 2.
    zigzag = usp_dispatch("zigzag", 16, ring=2, ulysses=2)
    assert zigzag.ranges == (((0, 4),), ((12, 16),), ((4, 8),), ((8, 12),))
    assert usp_dispatch("zigzag", 16, ring=2, ulysses=1).ranges == (
        ((0, 4), (12, 16)), ((4, 12),))
    assert usp_dispatch("basic", 16, ring=2, ulysses=2).ranges == (
        ((0, 4),), ((4, 8),), ((8, 12),), ((12, 16),))


@pytest.mark.parametrize("mask_name, dispatch, expected", [
    ("causal", "zigzag", "zigzag_ring_flash_attn_func"),
    ("full", "contiguous", "ring_flash_attn_func"),
    ("causal_document", "contiguous", "llama3_flash_attn_varlen_func"),
    ("causal_document", "zigzag", "needs the contiguous dispatch"),
    ("sliding_window", "contiguous", "computes full, causal and packed-document masks only"),
    ("share_question", "contiguous", "computes full, causal and packed-document masks only"),
])
def test_ring_flash_attn_states_what_it_computes(mask_name, dispatch, expected):
    from lcab.masks import small_mask
    from lcab.workloads import Workload
    from torch_backends.cp.libraries import RingFlashAttnBackend

    workload = Workload(1, 256, 256, 4, 2, 64, "bfloat16", small_mask(mask_name, 256))
    plan = RingFlashAttnBackend(dispatch=dispatch).ring_plan(workload)
    assert expected in (plan if isinstance(plan, str) else plan.function)


@pytest.mark.parametrize("name", ["torch.cp_ring", "torch.cp_usp", "torch.cp_native"])
def test_causal_flag_libraries_refuse_every_other_mask(name):
    from lcab.masks import small_mask
    from lcab.workloads import Workload

    cls = registry.all_backends()[name].load()
    for mask_name, runs in (("causal", True), ("full", True), ("sliding_window", False),
                            ("causal_document", False)):
        workload = Workload(1, 256, 256, 4, 2, 64, "bfloat16", small_mask(mask_name, 256))
        support = cls(dispatch="zigzag").strategy_support(workload, None)
        assert support.ok == runs, (mask_name, support.reason)
        if not runs:
            assert "full and causal masks only" in support.reason


def test_bfloat16_and_several_sequences_per_batch(tmp_path):
    rows = run_cp(tmp_path, "--masks=causal_document,share_question", "--heads=4:2",
                  "--batch=2", "--dtype=bf16", "--dispatch=balanced", *MATH_INNER,
                  f"--backends={','.join(ON_GLOO)}")
    assert len(rows) == 2 * len(ON_GLOO) * 2 and {r["batch"] for r in rows} == {2}
    assert_checked(rows, tolerance=1e-2)  # the gate's bf16 tolerance is 4e-2


@pytest.mark.parametrize("cp, probe", [(2, 256), (4, 512), (8, 1024)])
def test_the_probe_gives_every_rank_128_tokens(cp, probe):
    # 64 tokens per rank failed FlexAttention's GPU lowering at cp 4 (H100).
    for name in ON_GLOO:
        backend = registry.all_backends()[name].load()(cp_size=cp)
        assert backend.probe_seqlen == probe
