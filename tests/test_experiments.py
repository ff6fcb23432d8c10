"""python -m lcab.experiments end to end: flags, presets, frameworks, resume."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from lcab import results
from lcab.masks import make_mask
from lcab.experiments import presets
from lcab.experiments.sweep import format_seqlen, parse_heads, parse_seqlen
from tests.row_checks import measured_or_noisy

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLUGIN = "--backend_modules=tests.fake_backends"


def cli(*args, timeout=300, cwd=ROOT):
    # PYTHONPATH: the test plugin (tests.fake_backends) imports from any directory.
    return subprocess.run(
        [sys.executable, "-m", "lcab.experiments", "--noprogress", *args],
        capture_output=True, text=True, cwd=cwd, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def cpu_preset(flag):
    """A value of the CPU preset, as its flagfile writes it."""
    return presets.read(presets.CPU_FLAGFILE)[flag]


def test_size_and_heads_parsing():
    assert [parse_seqlen(s) for s in ("4096", "4k", "128k", "1m", "1M")] == [
        4096, 4096, 131072, 1048576, 1048576]
    assert parse_heads("64:8") == (64, 8) and parse_heads("16") == (16, 16)
    assert format_seqlen(131072) == "128k" and format_seqlen(1000) == "1000"
    for bad in ("4q", "-1", "0", "k"):
        with pytest.raises(ValueError, match="positive size"):
            parse_seqlen(bad)
    for bad in ("64:7", "a:b", "1:2:3", "0:0"):
        with pytest.raises(ValueError):
            parse_heads(bad)


def test_both_frameworks_in_their_own_processes_merge_into_one_table(tmp_path):
    run = cli(
        "--backends=jax.xla,torch.sdpa_math", "--masks=causal,share_question",
        "--seqlens=256", "--heads=4:2", "--head_dim=32", "--dtype=float32",
        "--warmup=1", "--iters=2", f"--out={tmp_path}", "--framework", "all",
    )
    assert run.returncode == 0, run.stderr
    frame = results.load(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.jsonl")) == [
        "kernel_jax.jsonl", "kernel_torch.jsonl"]
    assert set(frame["backend"]) == {"jax.xla", "torch.sdpa_math"}
    assert len(frame) == 2 * 2 * 2  # backends x masks x directions
    assert frame["run_id"].nunique() == 1
    assert (frame[frame["direction"] == "fwd"]["status"] == "OK").all()
    assert set(frame["device"]) == {"cpu"}
    assert "| share_question" in run.stdout and "torch.sdpa_math" in run.stdout
    assert "Legend:" in run.stdout


def test_flagfile_sets_the_sweep_and_presets_fill_the_rest(tmp_path):
    run = cli("--flagfile=experiments/cpu_smoke.flags", "--backends=numpy.reference", PLUGIN,
              "--seqlens=256", "--iters=1", f"--out={tmp_path}")
    assert run.returncode == 0, run.stderr
    frame = results.load(tmp_path)
    assert list(dict.fromkeys(frame["mask"])) == cpu_preset("masks").split(",")
    assert set(frame["seqlen"]) == {256} and set(frame["heads_q"]) == {4}
    # One timed repeat on a busy CI host can leave fwd+bwd below fwd, which
    # the bwd row then reports instead of a time.
    unmeasurable = (frame["status"] == "ERROR") & frame["reason"].str.contains("not measurable")
    assert ((frame["status"] == "OK") | unmeasurable).all()
    assert (frame["status"] == "OK").sum() >= len(frame) // 2
    assert (frame["iters"] == 1).all()


def test_no_flags_on_a_cpu_machine_means_the_cpu_preset(tmp_path):
    if presets.has_gpu():
        pytest.skip("this machine has a GPU: the default is the seed's sweep")
    # From another directory: the preset flagfile is found from the package.
    run = cli("--backends=numpy.reference", PLUGIN, f"--out={tmp_path / 'rows'}", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    frame = results.load(tmp_path / "rows")
    seqlens = [parse_seqlen(s) for s in cpu_preset("seqlens").split(",")]
    assert sorted(set(frame["seqlen"])) == seqlens
    assert set(frame["dtype"]) == {cpu_preset("dtype")} == {"float32"}
    assert set(frame["head_dim"]) == {int(cpu_preset("head_dim"))} == {64}


def test_presets_are_the_named_sweeps_flagfiles_includes_and_all():
    assert presets.CPU_FLAGFILE.name == "cpu_smoke.flags"
    assert presets.GPU_FLAGFILE.name == "seed_kernels.flags"
    gpu = presets.read(presets.GPU_FLAGFILE)
    # seed_kernels.flags sets the masks; its include, common.flags, the repeats.
    assert gpu["masks"].split(",")[:2] == ["full", "causal"] and gpu["seqlens"].endswith("128k")
    assert (gpu["heads"], gpu["dtype"], gpu["warmup"], gpu["iters"]) == ("64:8", "bfloat16", "3",
                                                                        "10")
    assert presets.current() == presets.read(presets.flagfile())


def test_a_preset_flagfile_reads_like_absl(tmp_path):
    (tmp_path / "base.flags").write_text("# shared\n--iters=10\n--heads=8:1\n")
    (tmp_path / "top.flags").write_text(
        f"--flagfile={tmp_path / 'base.flags'}\n--iters=3\n--noflush_l2\n// a comment\n")
    assert presets.read(tmp_path / "top.flags") == {"iters": "3", "heads": "8:1",
                                                    "flush_l2": "false"}
    with pytest.raises(FileNotFoundError, match="give the sweep's settings as flags"):
        presets.read(tmp_path / "missing.flags")


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--masks=causal,diagonal", "unknown mask 'diagonal'; choose from full, causal"),
        ("--backends=jax.flashy", "unknown backend 'jax.flashy'; choose from jax.xla"),
        ("--seqlens=4k,12q", "seqlen '12q' is not a positive size"),
        ("--heads=64:7", "heads '64:7'"),
        ("--dtype=int8", "dtype='int8' is not one of"),
        ("--directions=fwd,sideways", "direction 'sideways' is not one of fwd, bwd"),
        ("--framework=mxnet", "--framework 'mxnet' is not one of jax, torch or all"),
        ("--doc_distribution=wiki", "chatqa2_long_sft"),
        ("--backend_options=jax.pallas_flex:tile=64", "its options: backward_block_k"),
        ("--backend_options=jax.pallas_flex", "is not BACKEND:KEY=VALUE"),
        ("--backend_options=jax.cp_ring:dispatch=spiral", "is not one of contiguous, zigzag"),
        ("--backend_options=torch.cp_ulysses:inner=torch.magic", "choose one of torch.sdpa_math"),
        ("--backend_options=jax.cp_ring:dispatch_chunks=8",
         "for the mask-aware dispatches only (balanced, ring_balanced"),
        ("--dispatch=spiral", "dispatch 'spiral' is not one of contiguous, zigzag"),
        ("--dispatch=zigzag,balanced", "--dispatch takes one dispatch here"),
    ],
)
def test_bad_flags_fail_at_once_naming_the_choices(tmp_path, flag, message):
    run = cli(flag, f"--out={tmp_path}", timeout=60)
    assert run.returncode != 0
    assert message in run.stderr
    assert not list(tmp_path.glob("*.jsonl"))


def test_a_killed_run_resumes_where_it_stopped(tmp_path):
    args = [sys.executable, "-m", "lcab.experiments", "--noprogress", "--backends=numpy.slow",
            PLUGIN, "--masks=causal,full", "--seqlens=64,96,128", "--heads=2:1",
            "--head_dim=8", "--warmup=0", "--iters=2", "--directions=fwd", f"--out={tmp_path}"]
    path = tmp_path / "kernel_numpy.jsonl"
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and len(results.read_rows([path]) if path.exists() else []) < 2:
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    survived = results.read_rows([path])
    assert 2 <= len(survived) < 6, "the run should have been killed half-way"

    resumed = subprocess.run([*args, "--resume"], cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    rows = results.read_rows([path])
    assert rows[: len(survived)] == survived  # nothing measured was lost or redone
    assert len(rows) == 6 and len({results.row_key(r) for r in rows}) == 6
    assert all(r["status"] == "OK" for r in rows)


def test_isolate_keeps_the_sweep_alive_through_a_crash(tmp_path):
    run = cli("--backends=numpy.crash,numpy.reference", PLUGIN, "--masks=causal",
              "--seqlens=64", "--heads=2:1", "--head_dim=8", "--iters=1", "--isolate",
              f"--out={tmp_path}")
    assert run.returncode == 0, run.stderr
    frame = results.load(tmp_path)
    by_backend = frame.groupby("backend")["status"].agg(set).to_dict()
    assert by_backend == {"numpy.crash": {"ERROR"}, "numpy.reference": {"OK"}}
    assert "ERR" in run.stdout


def test_the_cp_suite_runs_on_host_devices_without_a_gpu(tmp_path):
    run = cli("--suite=cp", "--framework=jax", "--cp_size=2", "--dispatch=balanced",
              "--backends=jax.cp_ring,jax.cp_ulysses", "--masks=causal_document",
              "--seqlens=256", "--heads=2:2", "--head_dim=16", "--iters=3",
              f"--out={tmp_path}", timeout=300)
    assert run.returncode == 0, run.stderr
    rows = results.read_rows([tmp_path / "cp_jax.jsonl"])
    # A bwd time is fwd+bwd minus fwd: on a tiny CPU case noise can make it
    # unmeasurable, which the row says; anything else would be a failure.
    settled = {(r["strategy"], r["direction"], measured_or_noisy(r)) for r in rows}
    assert settled == {(s, d, True) for s in ("ring", "ulysses") for d in ("fwd", "bwd")}, [
        r["reason"] for r in rows]
    assert all(r["cp_size"] == 2 and "dispatch=balanced" in r["notes"] for r in rows)
    assert json.loads(rows[0]["flags"])["backend_options"][0] == ["jax.cp_ring", "cp_size", "2"]


def test_child_arguments_drop_the_parent_only_flags():
    from lcab.experiments.launch import without_flags

    argv = ["--framework", "all", "--masks=causal", "--run_id=7", "--nosummary", "--isolate",
            "--framework=jax", "--summary=false", "--seqlens", "4k"]
    kept = without_flags(argv, valued=("framework", "run_id"), boolean=("summary",))
    assert kept == ["--masks=causal", "--isolate", "--seqlens", "4k"]


def test_a_dead_framework_process_leaves_error_rows(tmp_path):
    from lcab.runner import Case, Settings, fill_missing
    from lcab.workloads import Workload

    workload = Workload(1, 64, 64, 2, 1, 8, "float32", make_mask("causal", 64))
    cases = [Case("jax.xla", workload), Case("jax.cudnn", workload)]
    writer = results.Writer(tmp_path / "kernel_jax.jsonl")
    written = fill_missing(cases, writer, Settings(), reason="the jax process exited with -11")
    rows = results.read_rows([writer.path])
    assert written == 4 == len(rows)
    assert {r["status"] for r in rows} == {"ERROR"}
    assert fill_missing(cases, writer, Settings(), reason="again") == 0  # nothing left to fill


def test_backend_options_repeat_and_comma_separate():
    from lcab.experiments.flags import option_texts

    assert option_texts(["a:x=1,a:y=2", " b:z=3 "]) == ["a:x=1", "a:y=2", "b:z=3"]


@pytest.mark.parametrize("flagfile", sorted(pathlib.Path("experiments").glob("*.flags")),
                         ids=lambda path: path.name)
def test_every_named_sweep_parses(flagfile):
    # Parsing runs every validator: names, sizes, backend options (whose
    # constructors check their values), so a stale flagfile fails here.
    # The CLI expands flagfiles itself (includes relative to their file).
    from absl import flags

    import lcab.experiments.flags  # noqa: F401 - defines the flags
    from lcab.experiments import flagfiles

    flags.FLAGS.unparse_flags()
    try:
        flags.FLAGS(["lcab.experiments", *flagfiles.expand([f"--flagfile={flagfile}"])])
        assert flags.FLAGS["suite"].value in ("kernel", "cp", "module", "comm")
    finally:
        flags.FLAGS.unparse_flags()


@pytest.mark.parametrize("script", sorted(pathlib.Path("experiments").glob("*.sh")),
                         ids=lambda path: path.name)
def test_slurm_scripts_are_valid_bash_naming_existing_flagfiles(script):
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    for flagfile in re.findall(r"--flagfile=(\S+)", script.read_text()):
        assert pathlib.Path(flagfile).exists(), flagfile


@pytest.mark.parametrize("flagfile", sorted(p for p in pathlib.Path("experiments").glob("*.flags")
                                            if p.name != "cpu_smoke.flags"),
                         ids=lambda path: path.name)
def test_canonical_sweeps_warm_up_three_times_and_take_ten_samples(flagfile):
    """Every GPU sweep in experiments/ (the CPU smoke run aside) times at
    least 10 samples after at least 3 warm-up calls, with the full-size
    check left on."""
    settings = presets.read(flagfile)
    assert int(settings.get("iters", 10)) >= 10 and int(settings.get("warmup", 3)) >= 3
    assert settings.get("full_check", "true") == "true"


@pytest.mark.parametrize("script", sorted(pathlib.Path("experiments").glob("*.sh")),
                         ids=lambda path: path.name)
def test_session_scripts_keep_ten_samples(script):
    for flag, value in re.findall(r"--(iters|warmup)=(\d+)", script.read_text()):
        assert int(value) >= (10 if flag == "iters" else 3), (flag, value)
    assert "--nofull_check" not in script.read_text()
