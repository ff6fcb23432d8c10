"""The canonical sweeps: which parts they hold, where their rows go, and how
`python -m lcab.experiments.canonical` runs them in parts, stops at its time
budget, resumes, keeps a failed part failed, and writes RUN.md. The runner is
exercised on lcab's NumPy plugin backends (tests/fake_backends.py)."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from lcab import canonical, processes, results
from lcab.experiments import canonical as runner
from lcab.experiments import canonical_parts as defined
from lcab.experiments import machine, presets
from lcab.experiments.run_record import comparison

ROOT = pathlib.Path(__file__).resolve().parent.parent


def flag_values(run: defined.Run) -> dict[str, str]:
    """The settings a run ends with: its flagfile, then its own flags."""
    values = {}
    for flag in run.flags:
        name, _, text = flag[2:].partition("=")
        if name == "flagfile":
            values.update(presets.read(pathlib.Path(text)))
        else:
            values[name] = text
    return values


@pytest.mark.parametrize("sweep, flagfile", [("blog", "seed_blog.flags"),
                                             ("paper", "paper.flags")])
def test_kernel_sweeps_cover_their_flagfile_exactly_once_per_framework(sweep, flagfile):
    whole = presets.read(ROOT / "experiments" / flagfile)
    wanted = {(framework, mask, length) for framework in ("jax", "torch")
              for mask in whole["masks"].split(",") for length in whole["seqlens"].split(",")}
    covered = []
    for part in defined.parts(sweep):
        (run,) = part.runs
        values = flag_values(run)
        covered += [(values["framework"], mask, length) for mask in values["masks"].split(",")
                    for length in values["seqlens"].split(",")]
        assert values["suite"] == "kernel" and part.gpus == 1
    assert sorted(covered) == sorted(wanted)  # each case once


def test_the_cp_sweep_has_every_strategy_at_cp_2_and_4_with_one_gpu_beside_it():
    parts = defined.parts("cp")
    cases = set()
    singles = set()
    for part in parts:
        for run in part.runs:
            values = flag_values(run)
            if values["suite"] == "comm":
                assert values["comm_ranks"] == "2,4"
                continue
            lengths = values["seqlens"].split(",")
            if values["suite"] == "kernel":
                singles |= {(values["framework"], length) for length in lengths}
                continue
            cp = int(values["cp_size"])
            assert part.gpus == cp
            cases |= {(values["framework"], run.launcher, cp, length, mask, strategy)
                      for length in lengths for mask in values["masks"].split(",")
                      for strategy in values["backends"].split(",")}
    masks = ("full", "causal", "full_document", "causal_document")
    for framework in ("jax", "torch"):
        strategies = presets.read(ROOT / "experiments" / f"cp_{framework}.flags")["backends"]
        strategies = [*strategies.split(","), *defined.ADDED_STRATEGIES[framework]]
        for cp in (2, 4):
            for tokens in (8, 32):
                for mask in masks:
                    for strategy in strategies:  # every strategy, once
                        assert (framework, defined.PLAIN, cp, f"{tokens * cp}k", mask,
                                strategy) in cases
        # the single-GPU kernels at every global length the strategies run
        assert {length for f, length in singles if f == framework} == {"16k", "32k", "64k",
                                                                         "128k"}
    # the cluster-style runs repeat cp-4 cases at 8k per GPU
    cluster = {case for case in cases if case[1] != defined.PLAIN}
    assert {(f, launcher) for f, launcher, *_ in cluster} == {
        ("jax", defined.JAX_PROCESSES), ("torch", defined.TORCHRUN_NODES)}
    assert {(cp, length) for _, _, cp, length, *_ in cluster} == {(4, "32k")}
    names = {part.name for part in parts}
    assert all(part.same_as in names for part in parts if part.same_as)


def test_launches_of_cluster_style_runs_split_the_gpus_between_processes(tmp_path):
    jax_part, _, torch_part = (p for p in defined.parts("cp") if p.same_as)
    # the GPUs this process may use, as CUDA_VISIBLE_DEVICES names them
    gpus = ["4", "5", "6", "7"]
    (run,) = jax_part.runs
    launch = runner.launch_of(run, tmp_path, "abc", [], gpus)
    assert [env for _, env in launch.commands] == [{"CUDA_VISIBLE_DEVICES": g} for g in gpus]
    assert [argv[-1] for argv, _ in launch.commands] == [f"--jax_process_id={i}"
                                                         for i in range(4)]
    (run,) = torch_part.runs
    launch = runner.launch_of(run, tmp_path, "abc", [], gpus)
    assert [env for _, env in launch.commands] == [{"CUDA_VISIBLE_DEVICES": "4,5"},
                                                  {"CUDA_VISIBLE_DEVICES": "6,7"}]
    for node, (argv, _) in enumerate(launch.commands):
        assert "--nnodes=2" in argv and "--nproc_per_node=2" in argv
        assert f"--node_rank={node}" in argv and "--rdzv_backend=c10d" in argv


def test_results_folders_are_named_and_found_newest_first(tmp_path):
    assert canonical.folder_name("2026-11-27", "h100x4", "cp") == "2026-11-27-h100x4-cp"
    with pytest.raises(ValueError, match="canonical sweeps: blog"):
        canonical.folder_name("2026-11-27", "h100", "nope")
    for name in ("2026-11-26-h100-blog", "2026-11-27-h200-blog", "2026-11-27-h100x4-cp",
                 "2026-11-28-h100-notasweep", "gpu"):
        (tmp_path / name).mkdir()
    assert [p.name for p in canonical.folders("blog", tmp_path)] == [
        "2026-11-27-h200-blog", "2026-11-26-h100-blog"]
    assert canonical.newest("paper", tmp_path) is None
    assert {k: v.name for k, v in canonical.newest_all(tmp_path).items()} == {
        "blog": "2026-11-27-h200-blog", "cp": "2026-11-27-h100x4-cp"}
    # Two runs of one day: the one with more parts done is the newest.
    (tmp_path / "2026-11-27-h100-blog").mkdir()
    (tmp_path / "2026-11-27-h100-blog" / canonical.STATE_NAME).write_text(json.dumps(
        {"sweep": "blog", "parts": {"a": {"status": canonical.DONE},
                                    "b": {"status": canonical.DONE, "extra": ["--seqlens=1k"]},
                                    "c": {"status": "stopped"}}}))
    assert canonical.newest("blog", tmp_path).name == "2026-11-27-h100-blog"
    assert [canonical.parts_done(p) for p in canonical.folders("blog", tmp_path)] == [1, 0, 0]
    # The newest run of each card is current; the most complete first.
    assert [p.name for p in canonical.current("blog", tmp_path)] == [
        "2026-11-27-h100-blog", "2026-11-27-h200-blog"]
    assert canonical.card_of("h200x4") == canonical.card_of("h200") == "h200"
    (tmp_path / "2026-11-28-h200x2-cp").mkdir()  # a newer cp run on another card
    assert [p.name for p in canonical.current("cp", tmp_path)] == [
        "2026-11-28-h200x2-cp", "2026-11-27-h100x4-cp"]


@pytest.mark.parametrize("gpus, label", [
    ([], "cpu"),
    ([{"name": "NVIDIA H100 80GB HBM3"}], "h100"),
    ([{"name": "NVIDIA H200"}] * 4, "h200x4"),
])
def test_the_device_label_names_the_model_and_count(gpus, label):
    assert machine.device_label(gpus) == label


def write_rows(folder, medians, commit="c0ffee1"):
    writer = results.Writer(folder / "kernel_numpy.jsonl")
    for (backend, direction), ms in medians.items():
        writer.write(results.make_row(
            framework="numpy", backend=backend, suite="cp", mask="causal", seqlen=512,
            direction=direction, status="OK", median_ms=ms, device="cpu", workload_key="w",
            batch=1, heads_q=2, heads_kv=1, head_dim=8, dtype="float32", cp_size=4,
            tflops=1.0, git_commit=commit))


def test_the_comparison_tells_whether_a_cluster_run_reproduces_the_single_process(tmp_path):
    single, cluster = tmp_path / "a", tmp_path / "b"
    write_rows(single, {("x", "fwd"): 10.0, ("x", "bwd"): 20.0, ("y", "fwd"): 1.0})
    write_rows(cluster, {("x", "fwd"): 10.5, ("x", "bwd"): 19.0})
    lines, worst = comparison(single, cluster)
    assert worst == pytest.approx(0.05)
    assert "2 cases; largest deviation 5.0%, within 10%." in lines[-1]
    write_rows(cluster, {("x", "fwd"): 13.0})
    assert comparison(single, cluster)[1] == pytest.approx(0.3)


def test_the_comparison_sets_rows_of_one_commit_side_by_side(tmp_path):
    """A single-process part measured again after the cluster-style run:
    the cluster row is compared with the single row of its own commit; a
    cluster row of a commit the single part never ran takes the newest and
    says so."""
    single, cluster = tmp_path / "a", tmp_path / "b"
    write_rows(single, {("x", "fwd"): 10.0}, commit="old0000")
    write_rows(single, {("x", "fwd"): 8.0}, commit="new0000")  # newer, faster code
    write_rows(cluster, {("x", "fwd"): 10.2}, commit="old0000aaaa")  # a full hash
    lines, worst = comparison(single, cluster)
    assert worst == pytest.approx(0.02)
    assert "| 10.000 | 10.200 | 1.020 | both old0000 |" in lines[2]
    assert "set rows of two commits" not in lines[-1]
    write_rows(cluster, {("x", "fwd"): 8.4}, commit="other00")
    lines, worst = comparison(single, cluster)
    assert worst == pytest.approx(0.05)
    assert "| 8.000 | 8.400 | 1.050 | single new0000, this other00 |" in lines[2]
    assert "1 of them set rows of two commits side by side" in lines[-1]


# The runner itself, on NumPy plugin backends.
SMALL = ("--framework=numpy", "--backend_modules=tests.fake_backends", "--masks=causal",
         "--heads=2:1", "--head_dim=8", "--warmup=0", "--iters=2", "--directions=fwd",
         "--nofull_check")


@pytest.fixture
def plugin_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.chdir(ROOT)


def part(name, *flags, same_as=None):
    return defined.Part(name, f"test part {name}", (defined.Run((*SMALL, *flags)),),
                        same_as=same_as)


def run_states(folder):
    return json.loads((folder / runner.STATE_NAME).read_text())["parts"]


@pytest.mark.slow
def test_parts_run_once_and_record_what_ran(tmp_path, plugin_path, capsys):
    parts = [part("a", "--backends=numpy.reference", "--seqlens=64,128"),
             part("b", "--backends=numpy.tunable", "--seqlens=64", same_as="a")]
    assert runner.run_sweep("blog", tmp_path, parts, "c0ffee", [], None) == 0
    rows = results.read_rows([tmp_path / "a"])
    assert sorted((r["seqlen"], r["status"], r["git_commit"]) for r in rows) == [
        (64, "OK", "c0ffee"), (128, "OK", "c0ffee")]
    run_md = (tmp_path / "RUN.md").read_text()
    assert "| `a` | test part a | done | 2 OK |" in run_md
    assert "--out=OUT/a --resume --git_commit=c0ffee" in run_md
    assert str(ROOT) not in run_md  # commands as a reader reruns them
    assert "## `b` against `a`" in run_md
    assert "numpy.reference" in capsys.readouterr().out  # each part's short table
    # A second call finds both parts done and runs nothing.
    assert runner.run_sweep("blog", tmp_path, parts, "c0ffee", [], None) == 0
    assert [len(record["runs"]) for record in run_states(tmp_path).values()] == [1, 1]
    assert len(json.loads((tmp_path / runner.STATE_NAME).read_text())["calls"]) == 2


@pytest.mark.slow
def test_a_part_cut_by_the_budget_resumes_without_repeating_rows(tmp_path, plugin_path,
                                                                  monkeypatch):
    monkeypatch.setattr(runner, "STOP_GRACE_S", 2)  # the budget holds the grace too
    slow = part("slow", "--backends=numpy.slow", "--seqlens=64,96,128,160,192,224,256",
                "--iters=4")
    after = part("after", "--backends=numpy.reference", "--seqlens=64")
    assert runner.run_sweep("blog", tmp_path, [slow, after], "c", [], 14, min_run_s=1) == 3
    states = run_states(tmp_path)
    assert states["slow"]["status"] == runner.STOPPED and states["slow"]["runs"][0][
        "stopped_at_limit"]
    assert "after" not in states  # nothing starts after a stop
    first = results.read_rows([tmp_path / "slow"])
    assert 0 < len(first) < 7
    assert runner.run_sweep("blog", tmp_path, [slow, after], "c", [], None) == 0
    keys = [(r["seqlen"], r["direction"]) for r in results.read_rows([tmp_path / "slow"])
            if r["status"] == "OK"]
    assert sorted(keys) == sorted({(s, "fwd") for s in (64, 96, 128, 160, 192, 224, 256)})
    assert "resumed by the next call" in (tmp_path / "RUN.md").read_text()


@pytest.mark.slow
def test_a_failed_part_stays_failed_until_retried(tmp_path, plugin_path):
    broken = part("broken", "--backends=numpy.reference", "--seqlens=64", "--masks=nonsense")
    good = part("good", "--backends=numpy.reference", "--seqlens=64")
    assert runner.run_sweep("blog", tmp_path, [broken, good], "c", [], None) == 1
    states = run_states(tmp_path)
    assert states["broken"]["status"] == runner.FAILED and states["good"]["status"] == "done"
    assert runner.run_sweep("blog", tmp_path, [broken, good], "c", [], None) == 1
    assert len(run_states(tmp_path)["broken"]["runs"]) == 1  # not rerun
    runner.run_sweep("blog", tmp_path, [broken, good], "c", [], None, retry=True)
    assert len(run_states(tmp_path)["broken"]["runs"]) == 2


@pytest.mark.slow
def test_a_part_measured_again_keeps_its_earlier_rows_beside_the_new(tmp_path, plugin_path):
    """--measure_again: a done part runs from the start at the new commit;
    its earlier rows move to a file the tables still read, the newest row
    of each measurement stands; the same command again does not start over."""
    from lcab.report import sources

    one = part("one", "--backends=numpy.reference", "--seqlens=64")
    other = part("other", "--backends=numpy.reference", "--seqlens=96")
    assert runner.run_sweep("blog", tmp_path, [one, other], "old", [], None) == 0
    assert runner.run_sweep("blog", tmp_path, [one, other], "new", [], None,
                            again=["one"]) == 0
    files = sorted(p.name for p in (tmp_path / "one").glob("*.jsonl"))
    assert len(files) == 2 and any(".before-" in name for name in files)
    rows = results.read_rows([tmp_path / "one"])
    assert sorted(r["git_commit"] for r in rows) == ["new", "old"]
    assert [r["git_commit"] for r in results.read_rows([tmp_path / "other"])] == ["old"]
    shown = sources.load([tmp_path])
    newest = results.newest_rows(results.read_rows([tmp_path / "one"]))
    assert [r["git_commit"] for r in newest] == ["new"]
    assert set(shown["git_commit"]) == {"old", "new"}  # every file is read
    state = json.loads((tmp_path / runner.STATE_NAME).read_text())
    assert state["calls"][-1]["measured_again"] == ["one"]
    assert state["parts"]["one"]["measured_again_at"] == "new"
    assert "measured again from the start: `one`" in (tmp_path / "RUN.md").read_text()
    # The same command again: the part is done at this commit, nothing moves.
    assert runner.run_sweep("blog", tmp_path, [one, other], "new", [], None,
                            again=["one"]) == 0
    assert len(list((tmp_path / "one").glob("*.jsonl"))) == 2
    assert len(run_states(tmp_path)["one"]["runs"]) == 2


def test_measuring_one_backend_again_moves_only_its_rows_aside(tmp_path):
    """--measure_again_backends: the named backends' rows move to the
    .before file, line for line; the other rows (and a damaged tail) stay
    where --resume reads them, so only those backends run again. Once per
    commit and set of backends."""
    folder = tmp_path / "one"
    folder.mkdir()
    rows = [json.dumps({"backend": name, "seqlen": n}) + "\n"
            for name, n in (("jax.xla", 1), ("jax.pallas_flex", 1), ("jax.xla", 2))]
    (folder / "kernel_jax.jsonl").write_text("".join(rows) + '{"backend": "jax.pall')
    (folder / "kernel_torch.jsonl").write_text(json.dumps({"backend": "torch.flex"}) + "\n")
    state = runner.State(tmp_path, "blog")
    one = part("one")
    assert runner.measure_again(state, tmp_path, [one], "new", "20261129", ["jax.pallas_flex"])
    assert (folder / "kernel_jax.before-20261129.jsonl").read_text() == rows[1]
    assert (folder / "kernel_jax.jsonl").read_text() == (
        rows[0] + rows[2] + '{"backend": "jax.pall')
    assert not (folder / "kernel_torch.before-20261129.jsonl").exists()  # nothing of it moved
    record = state.part("one")
    assert (record["measured_again_at"], record["measured_again_backends"]) == (
        "new", ["jax.pallas_flex"])
    # The same again: left to resume; another backend at the same commit: set again.
    assert runner.measure_again(state, tmp_path, [one], "new", "2", ["jax.pallas_flex"]) == []
    assert runner.measure_again(state, tmp_path, [one], "new", "3", ["jax.xla"]) == ["one"]
    assert (folder / "kernel_jax.before-3.jsonl").read_text() == rows[0] + rows[2]


def test_a_part_measured_again_is_set_beside_the_rows_it_replaced(tmp_path):
    """RUN.md's reproduction table: per backend, the new time over the old
    of each case OK both times, a backend with a registered change between
    the two rows apart from the rest."""
    from lcab.experiments.run_record import remeasured
    from tests.test_report_rows import row, write

    def at(day, **more):
        return {"timestamp": f"2026-11-{day}T10:00:00+00:00", **more}

    folder = tmp_path / "part"
    # jax.pallas_flex's backward changed on 11-28 (lcab.registry); jax.xla never did.
    write(folder, [row("jax.xla", median_ms=10.0, **at(27)),
                   row("jax.xla", seqlen=4096, median_ms=4.0, **at(27)),
                   row("jax.pallas_flex", direction="bwd", median_ms=10.0, **at(27)),
                   row("jax.pallas_flex", median_ms=5.0, **at(27)),
                   row("jax.cudnn", status="OOM", **at(27))],
          name="kernel_jax.before-20261129001318.jsonl")
    assert remeasured(folder) == ["no case is OK both times yet"]
    write(folder, [row("jax.xla", median_ms=10.5, **at(29)),
                   row("jax.xla", seqlen=4096, median_ms=3.9, **at(29)),
                   row("jax.pallas_flex", direction="bwd", median_ms=8.0, **at(29)),
                   row("jax.pallas_flex", median_ms=5.1, **at(29)),
                   row("jax.cudnn", median_ms=1.0, **at(29))], name="kernel_jax.jsonl")
    lines = remeasured(folder)
    assert "| jax.xla | 2 | 1.012 | 0.975-1.050 | no |" in lines
    assert "| jax.pallas_flex | 1 | 1.020 | 1.020-1.020 | no |" in lines  # its forward
    assert "| jax.pallas_flex | 1 | 0.800 | 0.800-0.800 | yes |" in lines
    assert not any(line.startswith("| jax.cudnn") for line in lines)  # not OK both times
    assert lines[-1].endswith("3 cases differ by at most 5.0% (one case's time, new over old).")
    assert remeasured(tmp_path / "never") == []


def test_parts_to_measure_again_are_named_from_the_sweep(tmp_path):
    def listed(*flags):
        return subprocess.run(
            [sys.executable, "-m", "lcab.experiments.canonical", "cp", "--list",
             f"--out={tmp_path}", *flags], capture_output=True, text=True, cwd=ROOT,
            timeout=120, check=False)

    done = listed("--parts=comm", "--measure_again=jax-cp2-8k-full,comm")
    assert done.returncode == 0, done.stderr
    names = re.findall(r"^(\S+)  \(", done.stdout, re.MULTILINE)
    assert names == ["comm", "jax-cp2-8k-full"]  # --parts' order, then the others
    refused = listed("--measure_again=nonsense")
    assert refused.returncode != 0 and "cp has no part nonsense" in refused.stderr
    assert "Traceback" not in refused.stderr
    alone = listed("--measure_again_backends=jax.pallas_flex")
    assert alone.returncode != 0 and "needs --measure_again" in alone.stderr
    unknown = listed("--measure_again=comm", "--measure_again_backends=jax.nope")
    assert unknown.returncode != 0 and "unknown backend 'jax.nope'" in unknown.stderr
    assert "Traceback" not in alone.stderr + unknown.stderr


def test_a_folder_of_another_sweep_is_refused(tmp_path):
    (tmp_path / runner.STATE_NAME).write_text(json.dumps({"sweep": "cp", "calls": [],
                                                          "parts": {}}))
    with pytest.raises(Exception, match="holds the 'cp' sweep"):
        runner.State(tmp_path, "blog")


def test_a_folder_of_rows_from_another_card_is_refused(tmp_path, plugin_path):
    """An --out that holds H100 rows refuses a call on an H200 before any
    part resumes there; another count of the same card (a cp sweep's cp 2
    parts on a two-GPU host) goes on."""
    h100, h200 = {"name": "NVIDIA H100 80GB HBM3"}, {"name": "NVIDIA H200"}
    runs = [part("a", "--backends=numpy.reference", "--seqlens=64")]
    assert runner.run_sweep("blog", tmp_path, runs, "c", [], None, gpus=[h100]) == 0
    with pytest.raises(Exception, match=r"measured on h100; this machine has h200"):
        runner.run_sweep("blog", tmp_path, runs, "c", [], None, gpus=[h200, h200])
    state = json.loads((tmp_path / runner.STATE_NAME).read_text())
    assert len(state["calls"]) == 1  # the refused call left no record
    assert runner.run_sweep("blog", tmp_path, runs, "c", [], None, gpus=[h100] * 2) == 0


def test_cpu_folders_are_rehearsals_and_never_the_newest(tmp_path):
    for name in ("2026-11-27-h100-blog", "2026-11-28-cpu-blog"):
        (tmp_path / name).mkdir()
    assert [p.name for p in canonical.folders("blog", tmp_path)] == ["2026-11-27-h100-blog"]


def test_a_call_without_out_goes_on_with_the_unfinished_run(tmp_path, monkeypatch):
    monkeypatch.setattr(canonical, "RESULTS", tmp_path)
    gpus = [{"name": "NVIDIA H100 80GB HBM3"}]
    older = tmp_path / "2026-11-26-h100-sparsity"
    older.mkdir()
    (older / runner.STATE_NAME).write_text(json.dumps(
        {"sweep": "sparsity", "calls": [], "parts": {"jax-block_sparse-16k": {"status": "done"}}}))
    assert runner.default_out("sparsity", gpus) == older  # parts left: go on with it
    (older / runner.STATE_NAME).write_text(json.dumps(
        {"sweep": "sparsity", "calls": [], "parts": {
            part.name: {"status": "done"} for part in defined.parts("sparsity")}}))
    fresh = runner.default_out("sparsity", gpus)
    assert fresh != older and fresh.name.endswith("-h100-sparsity")
    # Measuring again (--measure_again, --parts=changed) goes to the finished run.
    assert runner.default_out("sparsity", gpus, again=True) == older
    # Its parts each take one GPU: four GPUs run them side by side, still h100.
    assert runner.default_out("sparsity", gpus * 4).name.endswith("-h100-sparsity")
    assert runner.default_out("cp", gpus * 4).name.endswith("-h100x4-cp")
    assert runner.default_out("cp", gpus * 2).name.endswith("-h100x2-cp")
    # The card's unfinished run goes on whatever the machine's GPU count (one
    # current run a card: a new folder would hide it, lcab.canonical.current).
    cp4 = tmp_path / "2026-11-26-h100x4-cp"
    cp4.mkdir()
    (cp4 / runner.STATE_NAME).write_text(json.dumps({"sweep": "cp", "calls": [], "parts": {}}))
    assert runner.default_out("cp", gpus * 2) == cp4
    # Another root (a copy of results/ on a borrowed machine): the card picks its run there.
    elsewhere = tmp_path / "copy"
    (elsewhere / "2026-11-26-h200-sparsity").mkdir(parents=True)
    (elsewhere / "2026-11-26-h200-sparsity" / runner.STATE_NAME).write_text(json.dumps(
        {"sweep": "sparsity", "calls": [], "parts": {}}))
    h200 = [{"name": "NVIDIA H200"}]
    assert runner.default_out("sparsity", h200, elsewhere) == \
        elsewhere / "2026-11-26-h200-sparsity"
    assert runner.default_out("sparsity", gpus, elsewhere).parent == elsewhere
    assert runner.default_out("sparsity", gpus, elsewhere).name.endswith("-h100-sparsity")


def test_tables_leave_out_the_reruns_folder(tmp_path):
    from lcab.report import sources

    write_rows(tmp_path / "part", {("x", "fwd"): 10.0})
    write_rows(tmp_path / canonical.RERUNS / "part-processes", {("x", "fwd"): 11.0})
    assert [f.parent.name for f in sources.result_files([tmp_path])] == ["part"]
    assert sources.result_files([tmp_path / canonical.RERUNS])  # named alone, it is read


def test_descendants_finds_processes_in_sessions_of_their_own():
    # A parent whose child starts a grandchild in a new session (as torchrun does).
    script = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(60)'], start_new_session=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 20
        while len(processes.descendants(parent.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        (grandchild,) = processes.descendants(parent.pid)
    finally:
        runner._kill_trees([parent])
    time.sleep(0.2)
    assert not pathlib.Path(f"/proc/{grandchild}").exists() or "Z" in pathlib.Path(
        f"/proc/{grandchild}/stat").read_text().rpartition(")")[2].split()[0]


def test_when_one_process_fails_the_others_are_stopped(monkeypatch):
    monkeypatch.setattr(runner, "STOP_GRACE_S", 2)
    launch = runner.Launch([([sys.executable, "-c", "import sys; sys.exit(3)"], {}),
                            ([sys.executable, "-c", "import time; time.sleep(120)"], {})])
    started = time.monotonic()
    running = runner.Processes(launch, None)
    while (result := running.poll()) is None:
        time.sleep(0.2)
    code, at_limit = result
    assert code == 3 and not at_limit
    assert time.monotonic() - started < 30  # not the sleeper's two minutes


def test_a_run_with_extra_flags_or_without_a_gpu_needs_its_own_out(tmp_path):
    done = subprocess.run([sys.executable, "-m", "lcab.experiments.canonical", "sparsity",
                           "--extra=--seqlens=512"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and "give --out" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("folder, refused", [
    ("2026-12-07-h100-blog", True),  # a canonical GPU run's folder, wherever it lies
    ("2026-12-07-cpu-blog", False),  # a rehearsal
    ("rehearsal", False),
])
def test_a_canonical_run_refuses_a_tree_that_differs_from_its_commit(tmp_path, folder, refused):
    done = subprocess.run([sys.executable, "-m", "lcab.experiments.canonical", "sparsity",
                           f"--out={tmp_path / folder}", "--git_commit=abc1234+dirty",
                           "--parts=jax-block_sparse-16k", "--budget_s=1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    said = "the tree differs from abc1234 (git status): commit first"
    assert (said in done.stderr) == refused, done.stderr
    assert "Traceback" not in done.stderr
    if refused:
        assert done.returncode != 0 and not (tmp_path / folder).exists()


@pytest.mark.slow
def test_parallel_parts_run_side_by_side_one_per_gpu(tmp_path, plugin_path):
    """--parallel: one-GPU parts on their own GPU and cores, at the same
    time; RUN.md says which ran beside which."""
    parts = [part("a", "--backends=numpy.slow", "--seqlens=64,96,128"),
             part("b", "--backends=numpy.slow", "--seqlens=64,96,128")]
    two = [{"name": "NVIDIA H100 80GB HBM3", "serial": "1"},
           {"name": "NVIDIA H100 80GB HBM3", "serial": "2"}]
    assert runner.run_sweep("blog", tmp_path, parts, "c", [], None, gpus=two,
                            parallel=True) == 0
    first, second = (record["runs"][0] for record in run_states(tmp_path).values())
    assert "CUDA_VISIBLE_DEVICES=0" in first["command"]
    assert "CUDA_VISIBLE_DEVICES=1" in second["command"]
    assert second["beside"] == ["a"]  # started while a ran
    if len(os.sched_getaffinity(0)) >= 2:
        assert first["cores"] != second["cores"]
    run_md = (tmp_path / "RUN.md").read_text()
    assert "beside `a`" in run_md and "side by side (--parallel)" in run_md
    assert len(results.read_rows([tmp_path / "a"])) == len(results.read_rows([tmp_path / "b"]))


def test_lanes_give_one_gpu_parts_a_gpu_each_and_wider_parts_the_machine():
    one = defined.Part("one", "", ())
    wide = defined.Part("wide", "", (), gpus=2)

    class Busy:
        def __init__(self, part):
            self.part = part

    lanes = runner._Lanes(["0", "1"], parallel=True)
    assert lanes.take(one, []) == ["0"]
    assert lanes.take(wide, [Busy(one)]) is None  # waits until the machine is free
    assert lanes.take(one, [Busy(one)]) == ["1"]
    assert lanes.take(one, [Busy(one), Busy(one)]) is None
    lanes.give_back(["0"])
    lanes.give_back(["1"])
    assert lanes.take(wide, []) == ["0", "1"]
    assert lanes.take(one, [Busy(wide)]) is None
    sequential = runner._Lanes(["0", "1"], parallel=False)
    assert sequential.take(one, []) == ["0"] and sequential.take(one, [Busy(one)]) is None
    assert sequential.cores(["0"]) == []  # no pinning when alone


def test_an_unfinished_run_says_how_far_it_got(tmp_path):
    """Pages and the headline name an unfinished run's progress: a table of
    a few parts is not the sweep."""
    from lcab.report import sources

    folder = tmp_path / "2026-11-27-h100-sparsity"
    names = [p.name for p in defined.parts("sparsity")]
    state = {"sweep": "sparsity", "calls": [], "parts": {
        names[0]: {"status": "done"}, names[1]: {"status": "done", "extra": ["--seqlens=1k"]},
        names[2]: {"status": "stopped"}}}
    folder.mkdir()
    (folder / runner.STATE_NAME).write_text(json.dumps(state))
    assert defined.progress(folder) == (1, len(names))  # done with --extra is not done
    assert sources.progress_text(folder) == f"1 of {len(names)} parts done"
    state["parts"] = {name: {"status": "done"} for name in names}
    (folder / runner.STATE_NAME).write_text(json.dumps(state))
    assert sources.progress_text(folder) == "" and defined.progress(tmp_path) is None


def test_spans_text_writes_runs_of_integers_short():
    from lcab.spans import spans_text

    assert spans_text([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert spans_text((3,)) == "3" and spans_text([]) == ""
    assert spans_text([1, 2, 4], ", ") == "1-2, 4"


def test_the_packages_parts_need_are_the_ones_pyproject_declares():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for framework, packages in defined.STRATEGY_PACKAGES.items():
        declared = {re.split(r"[<>=!~; \[]", spec, maxsplit=1)[0] for spec in extras[framework]}
        assert set(packages) <= declared, framework
    gpu_extras = {re.split(r"[<>=!~; \[]", spec, maxsplit=1)[0].replace("-", "_")
                  for name in ("tokamax", "fa3jax") for spec in extras[name]}
    for packages in defined.GPU_KERNEL_PACKAGES.values():
        assert set(packages) <= gpu_extras
    cp = {part.name: part.needs for part in defined.parts("cp")}
    assert cp["torch-cp2-8k"] == ("torch", "yunchang") and cp["jax-cp2-8k-full"] == ("jax",)
    assert cp["torch-single-16k+32k"] == ("torch",)  # its kernels need no yunchang
    assert {part.needs for part in defined.parts("blog")} == {("jax",), ("torch",)}


def _needing(name, *needs):
    return dataclasses.replace(part(name, "--backends=numpy.reference", "--seqlens=64"),
                               needs=needs)


def test_a_part_whose_packages_cannot_be_imported_does_not_start(tmp_path, capsys):
    lacking = _needing("lacking", "numpy", "lcab_no_such_package")
    assert runner.run_sweep("blog", tmp_path, [lacking], "c", [], None, gpus=[]) == 3
    assert "lacking: needs lcab_no_such_package" in capsys.readouterr().out
    assert "lacking" not in run_states(tmp_path)  # nothing ran, nothing recorded


def test_a_gpu_kernel_package_is_needed_only_where_a_gpu_is(tmp_path, plugin_path, capsys):
    """A kernel part on a GPU machine without the GPU kernels it compares
    with (tokamax that cannot import xprof) waits rather than quietly
    losing their columns; on a CPU it runs without them."""
    lacking = dataclasses.replace(part("kernels", "--backends=numpy.reference", "--seqlens=64"),
                                  gpu_needs=("lcab_no_such_package",))
    h200 = {"name": "NVIDIA H200"}
    assert runner.run_sweep("blog", tmp_path / "gpu", [lacking], "c", [], None,
                            gpus=[h200]) == 3
    assert "kernels: needs lcab_no_such_package" in capsys.readouterr().out
    assert runner.run_sweep("blog", tmp_path / "cpu", [lacking], "c", [], None, gpus=[]) == 0
    blog = {p.name: p.gpu_needs for p in defined.parts("blog")}
    assert blog["jax-1k-8k-full"] == ("tokamax", "flash_attn3_jax")
    assert blog["torch-32k-full+causal"] == ()
    assert all(not p.gpu_needs for p in defined.parts("cp"))  # strategies: pallas_flex only
    # The rest of what a kernel part cannot run there gets rows saying why.
    assert all(defined.RECORD_UNAVAILABLE in p.runs[0].flags
               for sweep in ("blog", "paper", "sparsity") for p in defined.parts(sweep))


def _done_with_rows(folder, reason):
    from tests.test_report_rows import row, write

    write(folder / "done", [row("numpy.a"), row("numpy.b", status="UNAVAILABLE", reason=reason)])
    (folder / runner.STATE_NAME).write_text(json.dumps(
        {"sweep": "blog", "calls": [], "parts": {"done": {"status": "done", "runs": []}}}))


def test_a_done_part_whose_rows_missed_a_needed_package_is_not_done(tmp_path):
    from tests.test_report_rows import row, write

    missed = "cannot import yunchang: ModuleNotFoundError: No module named 'yunchang'"
    _done_with_rows(tmp_path, missed)
    done = _needing("done", "numpy", "yunchang")
    assert runner.packages_its_rows_missed(tmp_path, done) == ["yunchang"]
    # Rerun with the package (a newer row of the same measurement): done.
    write(tmp_path / "done", [row("numpy.b", timestamp="2026-12-01T10:00:00+00:00")])
    assert runner.packages_its_rows_missed(tmp_path, done) == []
    other = "cannot import flash_attn: ModuleNotFoundError"  # not a needed package
    _done_with_rows(tmp_path / "other", other)
    assert runner.packages_its_rows_missed(tmp_path / "other", done) == []
    # A GPU kernel a part compares with counts only on a GPU machine.
    _done_with_rows(tmp_path / "gpu", "cannot import tokamax: No module named 'xprof'")
    kernels = dataclasses.replace(done, gpu_needs=("tokamax",))
    assert runner.packages_its_rows_missed(tmp_path / "gpu", kernels) == []
    assert runner.packages_its_rows_missed(tmp_path / "gpu", kernels, on_gpu=True) == ["tokamax"]


def test_a_done_part_that_missed_a_package_still_missing_here_is_left_alone(tmp_path, capsys):
    _done_with_rows(tmp_path, "cannot import lcab_no_such_package: ModuleNotFoundError")
    done = _needing("done", "numpy", "lcab_no_such_package")
    assert runner.run_sweep("blog", tmp_path, [done], "c", [], None, gpus=[]) == 0
    assert "nor here: left as it is" in capsys.readouterr().out
    assert run_states(tmp_path)["done"]["status"] == "done"


def test_changed_names_the_parts_whose_standing_rows_predate_a_change(tmp_path):
    """'changed' (--parts, --measure_again): the parts whose standing rows
    (the newest of each measurement, not the .before- files) were measured
    before a later change to their kernel, each with those rows' backends;
    a part a call set to be measured again, until done, with the backends
    chosen then."""
    from lcab.experiments import changed_parts
    from tests.test_report_rows import row, write

    before, after = "2026-11-27T10:00:00+00:00", "2099-01-01T00:00:00+00:00"
    # jax.pallas_flex's backward changed after 11-27 (lcab.registry); jax.xla never did.
    write(tmp_path / "old", [row("jax.pallas_flex", direction="bwd", timestamp=before),
                             row("jax.xla", direction="bwd", timestamp=before)])
    write(tmp_path / "cp", [row("jax.cp_ring", inner="jax.pallas_flex", direction="bwd",
                                suite="cp", cp_size=2, timestamp=before),
                            row("jax.cp_ring", inner="jax.xla", direction="bwd", suite="cp",
                                cp_size=2, mask="full", timestamp=before)])
    # Measured again since: the old figure is set aside, the new one stands.
    write(tmp_path / "new", [row("jax.pallas_flex", direction="bwd", timestamp=before)],
          name="kernel_jax.before-20991231.jsonl")
    write(tmp_path / "new", [row("jax.pallas_flex", direction="bwd", timestamp=after)])
    # Two measurements of one case in the standing files: the newest decides.
    write(tmp_path / "twice", [row("jax.pallas_flex", direction="bwd", timestamp=before),
                               row("jax.pallas_flex", direction="bwd", timestamp=after)])
    parts = [part(name) for name in ("old", "cp", "new", "twice", "empty", "going")]
    state = {"parts": {"going": {"status": "stopped", "measured_again_at": "c1",
                                 "measured_again_backends": ["jax.xla"]},
                       "new": {"status": "done", "measured_again_at": "c1"}}}
    assert changed_parts.changed(tmp_path, parts, state) == {
        "old": ["jax.pallas_flex"], "cp": ["jax.cp_ring"], "going": ["jax.xla"]}
    # Left going at any commit, it resumes: its rows since are of newer code.
    state["parts"]["going"]["measured_again_at"] = "c0"
    assert changed_parts.changed(tmp_path, parts, state)["going"] == ["jax.xla"]
    assert changed_parts.predating(tmp_path / "cp") == {"jax.cp_ring": 1}
    assert changed_parts.describe(tmp_path / "old") == (
        "rows measured before a later change: jax.pallas_flex 1")
    assert changed_parts.describe(tmp_path / "new") is None


def test_each_changed_part_moves_only_its_own_backends_rows_aside(tmp_path):
    """measure_again with a part name -> backends: each part moves its own;
    a part not in the map moves every row, as a part named outright does."""
    rows = {name: json.dumps({"backend": name}) + "\n" for name in ("jax.xla", "jax.cp_ring")}
    for name in ("one", "two", "three"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "kernel_jax.jsonl").write_text("".join(rows.values()))
    state = runner.State(tmp_path, "cp")
    parts = [part("one"), part("two"), part("three")]
    chosen = {"one": ["jax.xla"], "two": ["jax.cp_ring"]}
    assert runner.measure_again(state, tmp_path, parts, "c", "9", chosen) == [
        "one", "two", "three"]
    assert (tmp_path / "one" / "kernel_jax.before-9.jsonl").read_text() == rows["jax.xla"]
    assert (tmp_path / "two" / "kernel_jax.jsonl").read_text() == rows["jax.xla"]
    assert not (tmp_path / "three" / "kernel_jax.jsonl").exists()
    assert [state.part(name)["measured_again_backends"] for name in ("one", "two", "three")
            ] == [["jax.xla"], ["jax.cp_ring"], []]
    assert runner.measure_again(state, tmp_path, parts, "c", "10", chosen) == []


def test_changed_moves_aside_only_the_rows_that_predate_a_change(tmp_path):
    """--measure_again=changed (only_predating): in a mapped part only its
    backends' rows measured before a later change move, so --resume runs
    just those cases and directions; a part named outright still moves
    every row."""
    from tests.test_report_rows import row, write

    before, after = "2026-11-27T10:00:00+00:00", "2099-01-01T00:00:00+00:00"
    stale = row("jax.pallas_flex", direction="bwd", timestamp=before)
    fresh = row("jax.pallas_flex", direction="bwd", seqlen=4096, timestamp=after)
    other = row("jax.xla", direction="bwd", timestamp=before)  # never changed
    for name in ("mapped", "named"):
        write(tmp_path / name, [stale, fresh, other])
    state = runner.State(tmp_path, "blog")
    assert runner.measure_again(state, tmp_path, [part("mapped"), part("named")], "c", "9",
                                {"mapped": ["jax.pallas_flex"]}, only_predating=True) == [
        "mapped", "named"]

    def rows_in(name):
        lines = (tmp_path / "mapped" / name).read_text().splitlines()
        return [(r["backend"], r["seqlen"], r["timestamp"]) for r in map(json.loads, lines)]

    assert rows_in("kernel_test.before-9.jsonl") == [("jax.pallas_flex", 8192, before)]
    assert rows_in("kernel_test.jsonl") == [("jax.pallas_flex", 4096, after),
                                            ("jax.xla", 8192, before)]
    assert not (tmp_path / "named" / "kernel_test.jsonl").exists()  # all moved


def test_a_part_to_measure_again_is_set_aside_only_when_it_starts(tmp_path):
    """A part the budget never reaches keeps its rows and its record as they
    stood (the tables lose nothing, its done stays done), and the call says
    some remain; a part set at an earlier commit and not finished resumes
    at this one instead of starting over."""
    rows = "".join(json.dumps({"backend": name}) + "\n" for name in ("numpy.a", "numpy.b"))
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "kernel_numpy.jsonl").write_text(rows)
    done = {"status": "done", "runs": [], "finished_runs": [0], "extra": []}
    (tmp_path / runner.STATE_NAME).write_text(json.dumps(
        {"sweep": "blog", "calls": [], "parts": {"one": dict(done), "two": dict(done)}}))
    parts = [_needing("one", "numpy"), _needing("two", "numpy")]
    assert runner.run_sweep("blog", tmp_path, parts, "c", [], 0, gpus=[], again=["one", "two"],
                            again_backends=["numpy.b"]) == 3
    for name in ("one", "two"):
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["kernel_numpy.jsonl"]
        assert (tmp_path / name / "kernel_numpy.jsonl").read_text() == rows
    state = json.loads((tmp_path / runner.STATE_NAME).read_text())
    assert state["parts"] == {"one": done, "two": done}
    assert "measured_again" not in state["calls"][-1]
    # Set at an earlier commit and stopped: resumes; done at an earlier one: set again.
    going = {"status": "stopped", "measured_again_at": "old",
             "measured_again_backends": ["numpy.b"]}
    assert runner.already_set_again(going, "new", ["numpy.b"])
    assert not runner.already_set_again(going, "new", ["numpy.a"])
    assert not runner.already_set_again({**going, "status": "done"}, "new", ["numpy.b"])
    assert runner.already_set_again({**going, "status": "done"}, "old", ["numpy.b"])


def test_a_part_left_going_starts_over_when_its_new_rows_predate_a_change(tmp_path):
    """A part set to be measured again at an older commit and stopped
    resumes, unless rows it measured since were made before a later change
    to their kernel: then they are set aside too and it starts over (it
    resumed with stale rows once, measuring only the cases left)."""
    from tests.test_report_rows import row, write

    before, after = "2026-11-27T10:00:00+00:00", "2099-01-01T00:00:00+00:00"
    write(tmp_path / "stale", [row("jax.pallas_flex", direction="bwd", timestamp=before)])
    write(tmp_path / "fresh", [row("jax.pallas_flex", direction="bwd", timestamp=after)])
    going = {"status": "stopped", "measured_again_at": "old",
             "measured_again_backends": ["jax.pallas_flex"], "runs": [], "finished_runs": []}
    (tmp_path / runner.STATE_NAME).write_text(json.dumps(
        {"sweep": "cp", "calls": [], "parts": {"stale": dict(going), "fresh": dict(going)}}))
    state = runner.State(tmp_path, "cp")
    assert runner.measure_again(state, tmp_path, [part("stale"), part("fresh")], "new", "7",
                                ["jax.pallas_flex"]) == ["stale"]
    assert (tmp_path / "stale" / "kernel_test.before-7.jsonl").exists()
    assert not (tmp_path / "fresh" / "kernel_test.before-7.jsonl").exists()
    assert state.part("stale")["measured_again_at"] == "new"
    assert state.part("fresh")["measured_again_at"] == "old"
    assert not runner.already_set_again(going, "new", ["jax.pallas_flex"], stale=True)
    assert runner.already_set_again(going, "old", ["jax.pallas_flex"], stale=True)


class _NeedsAbsentPackage:
    requires = ("lcab_no_such_package",)


def test_a_stopped_part_measured_again_for_one_backend_needs_every_package(tmp_path, capsys):
    """A part not done resumes every backend's missing cases, not only
    those measured again: without a package another backend needs, it
    waits rather than writing UNAVAILABLE rows where UNSUPPORTED or a
    figure belongs; a done part measured again for jax.xla does not."""
    kernels = dataclasses.replace(part("k", "--backends=numpy.reference", "--seqlens=64"),
                                  gpu_needs=("lcab_no_such_package",))
    h200 = {"name": "NVIDIA H200"}
    for status, code in (("stopped", 3), ("done", 0)):
        folder = tmp_path / status
        folder.mkdir()
        (folder / runner.STATE_NAME).write_text(json.dumps(
            {"sweep": "blog", "calls": [], "parts": {"k": {"status": status, "runs": []}}}))
        assert runner.run_sweep("blog", folder, [kernels], "c", [], None, gpus=[h200],
                                again=["k"], again_backends={"k": ["jax.xla"]},
                                again_only_predating=True) == code, status
        said = capsys.readouterr().out
        assert ("k: needs lcab_no_such_package" in said) == (status == "stopped"), said


def test_measuring_some_backends_again_needs_only_their_packages(monkeypatch):
    """A part measured again for some backends, its other rows standing,
    needs only the GPU-only packages those backends require (what the
    device must carry); a backend that cannot load here asks for all."""
    from lcab import registry

    monkeypatch.setitem(registry._plugins, "numpy.needs_absent",
                        registry.Entry(f"{__name__}:_NeedsAbsentPackage"))
    kernels = dataclasses.replace(_needing("k", "numpy"),
                                  gpu_needs=("lcab_no_such_package", "lcab_nor_this_one"))
    both = ["lcab_no_such_package", "lcab_nor_this_one"]
    assert runner.missing_packages(kernels, on_gpu=True) == both
    assert runner.missing_packages(kernels, on_gpu=False, backends=["numpy.needs_absent"]) == []
    assert runner.missing_packages(kernels, True, ["numpy.needs_absent"]) == [
        "lcab_no_such_package"]
    assert runner.missing_packages(kernels, True, ["jax.xla"]) == []  # requires nothing more
    assert runner.missing_packages(kernels, True, ["numpy.not_registered"]) == both


def test_changed_parts_are_listed_from_a_run_with_their_rows_counted(tmp_path):
    from tests.test_report_rows import row, write

    write(tmp_path / "jax-cp2-8k-full", [row("jax.cp_ring", inner="jax.pallas_flex",
                                             direction="bwd", suite="cp", cp_size=2,
                                             timestamp="2026-11-27T10:00:00+00:00")])

    def listed(*flags):
        return subprocess.run(
            [sys.executable, "-m", "lcab.experiments.canonical", "cp", "--list", *flags],
            capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)

    shown = listed(f"--out={tmp_path}", "--parts=changed", "--measure_again=changed")
    assert shown.returncode == 0, shown.stderr
    assert re.findall(r"^(\S+)  \(", shown.stdout, re.MULTILINE) == ["jax-cp2-8k-full"]
    assert "  rows measured before a later change: jax.cp_ring 1\n" in shown.stdout
    every = listed(f"--out={tmp_path}")
    assert every.stdout.count("rows measured before a later change") == 1
    # --parts chooses the parts; 'changed' then picks among them, adding none.
    write(tmp_path / "jax-cp2-8k-causal", [row("jax.cp_ring", inner="jax.pallas_flex",
                                               direction="bwd", suite="cp", cp_size=2,
                                               mask="causal",
                                               timestamp="2026-11-27T10:00:00+00:00")])
    among = listed(f"--out={tmp_path}", "--parts=jax-cp2-8k-causal,jax-cp2-8k-full_document",
                   "--measure_again=changed")
    assert re.findall(r"^(\S+)  \(", among.stdout, re.MULTILINE) == [
        "jax-cp2-8k-causal", "jax-cp2-8k-full_document"], among.stdout + among.stderr
    nowhere = listed("--parts=changed")
    assert nowhere.returncode != 0 and "give --out" in nowhere.stderr
    both = listed(f"--out={tmp_path}", "--measure_again=changed",
                  "--measure_again_backends=jax.cp_ring")
    assert both.returncode != 0 and "leave out --measure_again_backends" in both.stderr
    assert "Traceback" not in nowhere.stderr + both.stderr


def test_run_md_names_the_backends_each_changed_part_measured_again(tmp_path):
    from lcab.experiments.run_record import write_run_md

    call = {"start": "2026-11-29 15:00:00 UTC", "commit": "c", "gpus": [],
            "measured_again": ["jax-cp2-8k-full", "comm"],
            "measured_again_backends": {"jax-cp2-8k-full": ["jax.cp_ring", "jax.cp_usp"]}}
    text = write_run_md(tmp_path, {"sweep": "cp", "calls": [call], "parts": {}}).read_text()
    assert ("measured again from the start: `jax-cp2-8k-full`, `comm`; in `jax-cp2-8k-full` "
            "only `jax.cp_ring`, `jax.cp_usp`") in text
    call["measured_again_rows"] = "changed"  # --measure_again=changed: only the † rows
    text = write_run_md(tmp_path, {"sweep": "cp", "calls": [call], "parts": {}}).read_text()
    assert ("in `jax-cp2-8k-full` only `jax.cp_ring`, `jax.cp_usp` rows measured before a "
            "later change") in text


def test_measure_again_changed_hands_each_part_its_backends_to_the_run(tmp_path, monkeypatch):
    """The CLI's path, the run itself stubbed: 'changed' picks the parts and
    their backends from the run's rows; a part also named outright moves
    all its rows."""
    from tests.test_report_rows import row, write

    for name in ("jax-cp2-8k-full", "jax-cp2-8k-causal"):
        write(tmp_path / name, [row("jax.cp_ring", inner="jax.pallas_flex", direction="bwd",
                                    suite="cp", cp_size=2, timestamp="2026-11-27T10:00:00Z")])
    seen = {}
    monkeypatch.setattr(runner, "run_sweep", lambda sweep, folder, parts, commit, *args,
                        **kwargs: seen.update(parts=[p.name for p in parts], **kwargs) or 0)
    monkeypatch.setattr(machine, "gpus", list)
    try:
        runner.FLAGS(["lcab-sweep", f"--out={tmp_path}", "--git_commit=abc1234",
                      "--parts=changed", "--measure_again=changed,jax-cp2-8k-causal"])
        assert runner.main(["lcab-sweep", "cp"]) == 0
    finally:
        runner.FLAGS.unparse_flags()
    assert seen["parts"] == ["jax-cp2-8k-full", "jax-cp2-8k-causal"]
    assert seen["again"] == ["jax-cp2-8k-full", "jax-cp2-8k-causal"]
    assert seen["again_backends"] == {"jax-cp2-8k-full": ["jax.cp_ring"]}
    assert seen["again_only_predating"] is True
