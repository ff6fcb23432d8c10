"""experiments/lab/backward_kernels.py (each Mosaic backward kernel timed
alone on a Hopper GPU): its flags, its workloads and its kernels, checked
on a CPU by lowering them for a GPU."""

import gzip
import hashlib
import json

import jax
import jax.numpy as jnp
import pytest

from jax_backends import _shared
from jax_backends.pallas_flex.backend import PallasFlexBackend
from jax_backends.runtime import _with_gradients
from lcab.canonical import ROOT
from tests import experiment_scripts


def script():
    return experiment_scripts.load("lab/backward_kernels")


@pytest.mark.parametrize("argv, message", [
    (["--masks=causal,nope"], ("'nope' is none of the seed blog's masks: full, causal, "
                               "full_document, causal_document, sliding_window_causal, "
                               "varlen_block_causal")),
    (["--kernels=dq,dx"], "'dx' is none of dq, dkv, backward"),
    (["--seqlens=lots"], "seqlen 'lots' is not a positive size"),
    (["--iters=0"], "flag --iters=0: 0 is not a positive integer"),
    # A valid command on this CPU: refused before any timing, saying why.
    (["--masks=causal", "--seqlens=1k"], "Mosaic kernels on a Hopper GPU only"),
])
def test_bad_flags_exit_with_a_message_naming_the_choices(argv, message):
    with pytest.raises(SystemExit) as exit_:
        script().main(["backward_kernels.py", *argv])
    assert isinstance(exit_.value.code, str) and message in exit_.value.code
    assert "Traceback" not in exit_.value.code


def test_the_workloads_are_the_seed_blogs():
    """The masks are those the blog's sweep timed (the canonical rows'
    fingerprints), at its heads, head_dim, dtype and batch."""
    rows = ROOT / "results/2026-11-27-h200-blog/jax-16k-24k-causal_document/kernel_jax.jsonl"
    swept = [row for row in map(json.loads, rows.open()) if row["seqlen"] == 16384]
    workload = script().blog_workload("causal_document", 16384)
    assert workload.mask.fingerprint() in {row["mask_fingerprint"] for row in swept}
    assert (workload.batch, workload.heads_q, workload.heads_kv, workload.head_dim,
            workload.dtype) == (1, 64, 8, 128, "bfloat16")
    assert script().blog_workload("sliding_window_causal", 4096).mask.params["window"] == 1024


def mosaic_kernels(monkeypatch) -> list:
    """Every Mosaic GPU kernel lowered from here on, as (its CUDA grid, a
    hash of its module without source locations, which name each caller's
    stack); Mosaic lowers on a CPU meanwhile."""
    from jax._src.pallas.mosaic_gpu import lowering as mosaic_lowering

    lowered = []
    lower = mosaic_lowering.lower_pipelined_jaxpr_to_module

    def spy(*args, **kwargs):
        result = lower(*args, **kwargs)
        text = result.module.operation.get_asm(enable_debug_info=False)
        lowered.append((tuple(result.grid), hashlib.sha256(text.encode()).hexdigest()))
        return result

    monkeypatch.setattr(mosaic_lowering, "lower_pipelined_jaxpr_to_module", spy)
    monkeypatch.setattr(_shared, "gpu_problem", lambda **_: None)
    monkeypatch.setattr(_shared, "interpret_mode", lambda: False)
    return lowered


@pytest.mark.slow  # about 3.5 s on a 2-core CPU
def test_the_timed_kernels_are_the_default_backwards(monkeypatch):
    """Lowered for a GPU on this CPU (Mosaic faked present): dQ and dK/dV
    as timed alone are the very kernels (same module, same grid) of the
    whole backward the script times and of the harness's timed program
    (the backend's default forward and its gradients), here with the dK/dV
    split and launch order that causal at 1k takes by default."""
    lowered = mosaic_kernels(monkeypatch)
    workload = script().blog_workload("causal", 1024)
    backward = script().kernels(workload)
    assert (backward.dkv_launch, backward.dkv_split, backward.dq_heads_together) == (
        "heads_together", 4, True)
    assert [(t.name, t.matmuls) for t in backward.timed] == [
        ("dq", 3), ("dkv", 4), ("backward", 5)]
    found = {}
    for timed in backward.timed:
        text = jax.jit(timed.fn).trace(*timed.arguments).lower(
            lowering_platforms=("cuda",)).as_text()
        found[timed.name] = list(lowered)
        lowered.clear()
        if timed.name != "backward":
            assert f"lcab_flex_{timed.name}_mosaic" in text
    (dq,), (dkv,) = found["dq"], found["dkv"]
    assert dq != dkv and found["backward"] == [dq, dkv]
    # dQ every head of a q block together; dK/dV 8 K/V heads x 4 shares together.
    assert dq[0] == (64, 8, 1) and dkv[0] == (32, 8, 1)

    q = jax.ShapeDtypeStruct((1, 1024, 64, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 1024, 8, 128), jnp.bfloat16)
    jax.jit(_with_gradients(PallasFlexBackend().build(workload))).trace(
        q, kv, kv, q).lower(lowering_platforms=("cuda",))
    assert lowered[1:] == [dq, dkv]  # after the forward


RAW_CSV = '''"ID","Kernel Name","gpu__time_duration.sum","launch__registers_per_thread",\
"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",\
"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",\
"sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
"","","ms","register/thread","ratio","ratio","%"
"0","lcab_flex_dq_mosaic_mosaic_gpu_kernel","5.10","168","1.2","3.4","80.1"
"1","lcab_flex_dkv_mosaic_mosaic_gpu_kernel","7.90","240","2.2","0.4","66.0"
'''


def test_ncu_table_shows_each_kernels_counters_and_largest_stalls(tmp_path, monkeypatch, capsys):
    """experiments/lab/ncu_table.py on a raw CSV as `ncu --page raw --csv`
    writes it: one column per kernel, counters by label with their units,
    stall reasons ordered by their sum over the kernels, --stalls of them."""
    raw = tmp_path / "raw.csv"
    raw.write_text(RAW_CSV)
    monkeypatch.setattr("sys.argv", ["ncu_table.py", str(raw), "--stalls=1"])
    experiment_scripts.load("lab/ncu_table").main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| counter | lcab_flex_dq #0 | lcab_flex_dkv #1 |"
    assert "| time (ms) | 5.10 | 7.90 |" in lines
    assert "| registers / thread (register/thread) | 168 | 240 |" in lines
    assert "| tensor pipe active % (any) (%) | 80.1 | 66.0 |" in lines
    assert lines[-1] == "| stall: barrier (cycles per issue) | 3.4 | 0.4 |"  # 3.8 > 3.4
    assert not any("stall: wait" in line for line in lines)


SASS_CSV = '''"Kernel Name","lcab_flex_dkv_mosaic_mosaic_gpu_kernel",
"Address","Source","# Samples","Instructions Executed"
"0x00","      LDC R1, c[0x0][0x28]","2","8"
"0x10","      USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0","1","8"
"0x20","      SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R5","3","8"
"0x30","@!P1  BRA 0x200","4","8"
"0x40","      HGMMA.64x64x16.F32.BF16 R88, gdesc[UR56], R88, gsb0","5","8"
"0x50","      WARPGROUP.DEPBAR.LE gsb0, 0x0","25","8"
"0x60","      MUFU.EX2 R3, R3","10","8"
"0x70","@P1   EXIT","0","8"
"0x80","      USETMAXREG.DEALLOC.CTAPOOL 0x18","0","4"
"0x90","      SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8], R2","1","4"
"0xa0","@!P1  BRA 0x210","39","4"
"0xb0","@UP1  UTMALDG.5D [UR8], [UR24]","5","4"
"0xc0","@!P1  EXIT","0","4"
"0x200","      SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R3+URZ], R2","0","0"
"0x210","@!P1  NANOSLEEP.SYNCS 0x989680","5","0"
'''


def test_ncu_roles_splits_samples_by_warpgroup_and_wait(tmp_path, capsys, monkeypatch):
    """experiments/lab/ncu_roles.py on a per-SASS export (gzipped, as
    backward_profile.sh keeps it): each instruction falls in the prologue,
    the compute warpgroups' code (TRY_ALLOC to its EXIT), the memory
    warpgroup's (DEALLOC to its last EXIT) or the retry loops after it; an
    mbarrier poll and the branch after it count as its wait."""
    sass = tmp_path / "sass.csv.gz"
    with gzip.open(sass, "wt") as handle:
        handle.write(SASS_CSV)
    roles = experiment_scripts.load("lab/ncu_roles")
    with gzip.open(sass, "rt") as handle:
        found = roles.kernels(handle.read())
    split = roles.shares(found["lcab_flex_dkv_mosaic_mosaic_gpu_kernel"])
    assert split["prologue", "other"] == pytest.approx(2.0)
    assert split["compute warpgroups", "mbarrier wait"] == pytest.approx(7.0)
    assert split["compute warpgroups", "wgmma wait"] == pytest.approx(25.0)
    assert split["compute warpgroups", "other"] == pytest.approx(16.0)
    assert split["memory warpgroup", "mbarrier wait"] == pytest.approx(40.0)
    assert split["memory warpgroup", "other"] == pytest.approx(5.0)
    assert split["retry loops", "other"] == pytest.approx(5.0)
    assert sum(split.values()) == pytest.approx(100.0)
    monkeypatch.setattr("sys.argv", ["ncu_roles.py", str(sass)])
    roles.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| % of stall samples | lcab_flex_dkv |"
    assert "| memory warpgroup | 45.0 |" in lines
    assert "| - wgmma wait | 25.0 |" in lines


@pytest.mark.slow  # about 4 s on a 2-core CPU
def test_options_reach_the_kernels_timed_alone(monkeypatch):
    """--options: dK/dV timed alone under dkv_split=2 is the kernel the
    harness's gradient program runs under that option, not the default's;
    dQ, which the option does not touch, stays the default's."""
    lowered = mosaic_kernels(monkeypatch)
    workload = script().blog_workload("causal", 1024)
    found = {}
    for options in ({}, {"dkv_split": "2"}):
        for timed in script().kernels(workload, options).timed[:2]:
            jax.jit(timed.fn).trace(*timed.arguments).lower(lowering_platforms=("cuda",))
        found[bool(options)] = list(lowered)
        lowered.clear()
    assert found[True][0] == found[False][0] and found[True][1] != found[False][1]
    q = jax.ShapeDtypeStruct((1, 1024, 64, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 1024, 8, 128), jnp.bfloat16)
    jax.jit(_with_gradients(PallasFlexBackend(dkv_split="2").build(workload))).trace(
        q, kv, kv, q).lower(lowering_platforms=("cuda",))
    assert lowered[1:] == found[True]
    with pytest.raises(ValueError, match="not key=value"):
        script().backend_options(["dkv_split"])
