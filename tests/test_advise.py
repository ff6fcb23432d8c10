"""lcab.advise on the committed canonical rows: a measured point is
answered from its row, an unmeasured one from the model, labelled so; a
modelled figure the model cannot vouch for is listed, not ranked; the
guide page is what the command writes from the rows."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pandas as pd
import pytest

from lcab import canonical
from lcab.advise import MAX_MODEL_ERROR_PCT, Question, guide, recommend
from lcab.advise import evidence as evidence_lib
from lcab.advise.recommend import MEASURED, MEMORY_NOT_MODELLED, MODELLED
from lcab.model import predict
from lcab.model.coverage import CallLog
from lcab.model.strategies import layout

ROOT = pathlib.Path(__file__).resolve().parents[1]
H100_CP = ROOT / "results" / "2026-11-28-h100x4-cp"
H100_BLOG = ROOT / "results" / "2026-11-27-h100-blog"
H100_PAPER = ROOT / "results" / "2026-12-07-h100-paper"


def _row(folder: pathlib.Path, **want) -> dict:
    """The one row of `folder` with these fields."""
    found = []
    for path in folder.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if all(row.get(k) == v for k, v in want.items()):
                found.append(row)
    assert len(found) == 1, (want, len(found))
    return found[0]


def _line(frame, backend):
    mine = frame[frame["backend"] == backend]
    assert len(mine) == 1, (backend, list(frame["backend"]))
    return mine.iloc[0]


def test_a_measured_cp_point_is_answered_from_its_rows():
    frame = recommend(Question("causal_document", 32 * 1024, gpus=4, framework="jax"))
    for backend in ("jax.cp_allgather", "jax.cp_groupcast", "jax.cp_ring", "jax.cp_ulysses"):
        line = _line(frame, backend)
        assert line["source"] == MEASURED and line["ranked"]
        for direction in ("fwd", "bwd"):
            row = _row(H100_CP, backend=backend, mask="causal_document", seqlen=32768,
                       direction=direction, cp_size=4)
            assert line[f"{direction}_tflops"] == pytest.approx(row["tflops"])
            assert line[f"{direction}_ms"] == pytest.approx(row["median_ms"])
        assert "results/2026-11-28-h100x4-cp" in line["evidence"]
        assert line["model_error"] == ""
    ranked = frame[frame["ranked"]]
    assert list(ranked["rank"]) == list(range(1, len(ranked) + 1))
    assert ranked["step_ms"].is_monotonic_increasing
    # All-gather's measured step is the shortest of the measured JAX strategies here.
    assert ranked.iloc[0]["backend"] == "jax.cp_allgather"


def test_rows_that_did_not_run_are_listed_with_their_reason():
    frame = recommend(Question("causal_document", 32 * 1024, gpus=4, framework="torch"))
    native = _line(frame, "torch.cp_native")
    assert not native["ranked"] and native["note"].startswith("UNSUPPORTED:")
    assert "causal_document" in native["note"]
    ring = _line(frame, "torch.cp_ring")
    assert not ring["ranked"] and ring["note"].startswith("UNAVAILABLE:")


def test_an_unmeasured_point_is_modelled_and_labelled():
    question = Question("causal_document", 512 * 1024, gpus=64, framework="jax")
    frame = recommend(question)
    assert set(frame["source"]) == {MODELLED}
    evidence = evidence_lib.load("H100")
    line = _line(frame, "jax.cp_groupcast")
    assert line["ranked"] and line["evidence"].startswith("lcab.model on jax.pallas_flex")
    assert "at causal_document 32k, cp 4" in line["model_error"]
    assert "spans 8 nodes" in line["note"]
    # The figure is the model's, on the card's curve and links, at the dispatch it names.
    curve = evidence.curve("jax.pallas_flex", 128, "bfloat16")
    network = evidence.network("jax", 8, question.inter())
    expected = predict("groupcast", question.build_mask(), 64, question.shape(), CallLog(curve),
                       network, dispatch=line["dispatch"], direction="bwd",
                       memory_bytes_per_s=evidence.memory_bytes_per_s)
    assert line["bwd_tflops"] == pytest.approx(expected.tflops_per_gpu)
    usp = _line(frame, "jax.cp_usp")
    assert usp["layout"] == "Ulysses 8 inside a node x ring 8 across"
    double = _line(frame, "jax.cp_double_ring")
    assert not double["ranked"] and "no form of its strategy" in double["note"]


def test_a_measured_kernel_point_and_kernels_not_modelled_across_families():
    frame = recommend(Question("causal", 32 * 1024, gpus=1, framework="jax"))
    flex = _line(frame, "jax.pallas_flex")
    # The canonical runs hold this point several times (the cp run's
    # single-GPU kernels, the blog run, the paper run); the newest row
    # stands, and the line names its run.
    want = {"backend": "jax.pallas_flex", "mask": "causal", "seqlen": 32768, "direction": "fwd"}
    candidates = {run: _row(run / part, **want) for run, part in (
        (H100_BLOG, "jax-32k-full+causal"), (H100_PAPER, "jax-32k-40k-causal"))}
    run, row = max(candidates.items(), key=lambda item: item[1]["timestamp"])
    assert flex["source"] == MEASURED and flex["fwd_tflops"] == pytest.approx(row["tflops"])
    assert flex["evidence"].startswith(f"results/{run.name}")
    # cuDNN cannot express documents: where its row says so, the line gives that
    # reason; elsewhere its full and causal curve does not speak for documents.
    documents = recommend(Question("causal_document", 32 * 1024, gpus=1, framework="jax"))
    cudnn = _line(documents, "jax.cudnn")
    assert not cudnn["ranked"] and cudnn["note"].startswith("UNSUPPORTED: ")
    documents = recommend(Question("causal_document", 128 * 1024, gpus=1, framework="jax"))
    cudnn = _line(documents, "jax.cudnn")
    assert not cudnn["ranked"] and "no counted causal_document rows of jax.cudnn" in cudnn["note"]


def test_the_model_is_not_ranked_where_its_nearest_point_is_off():
    # Which strategy the model misses by more than the limit moves with the
    # committed rows; the rule does not: off lines are listed, not ranked.
    frame = recommend(Question("full_document", 64 * 1024, gpus=8, framework="torch",
                               device="H200"))
    off = frame["note"].astype(str).str.contains("not ranked: the model is off")
    assert off.sum() >= 1
    for is_off, (_, line) in zip(off, frame.iterrows()):
        if not line["model_error"]:
            continue
        worst = max(abs(float(part.split(" % ")[0].split()[-1]))
                    for part in line["model_error"].split("; "))
        # Rounded to whole percent for display: the limit itself may print on either side.
        assert (worst >= MAX_MODEL_ERROR_PCT) if is_off else (worst <= MAX_MODEL_ERROR_PCT)
        assert line["ranked"] != is_off


@pytest.mark.slow
def test_ulysses_beyond_the_query_heads_is_refused_with_the_reason():
    frame = recommend(Question("full", 256 * 1024, gpus=128, framework="jax"))
    ulysses = _line(frame, "jax.cp_ulysses")
    assert not ulysses["ranked"] and "64 query heads do not divide by 128" in ulysses["note"]


def test_questions_that_cannot_be_asked_name_the_flag():
    with pytest.raises(ValueError, match="--seqlen=1000 does not split over --gpus=3"):
        Question("full", 1000, gpus=3).check()
    with pytest.raises(ValueError, match="--heads=64:7"):
        Question("full", 1024, heads_kv=7).check()
    with pytest.raises(ValueError, match="--framework=mxnet"):
        Question("full", 1024, framework="mxnet").check()
    with pytest.raises(ValueError, match="LCAB has measured H100, H200"):
        evidence_lib.device_label("A100")


def test_layout_in_words():
    assert layout("usp", 64, 8, 8) == "Ulysses 8 inside a node x ring 8 across"
    assert layout("ring", 4, 8, 8) == "ring of 4 GPUs"
    assert layout("ulysses", 16, 8, 8) == "Ulysses (heads) over 16 GPUs on 2 nodes"


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "lcab.advise", *args], check=False,
                          capture_output=True, text=True, cwd=cwd or ROOT, timeout=300)


@pytest.mark.slow
def test_cli_answers_from_any_directory(tmp_path):
    done = _cli("--mask=causal_document", "--seqlen=32k", "--gpus=4", "--framework=jax",
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("LCAB advice for causal_document at 32k tokens on 4 H100s")
    assert "| 1    | jax       | jax.cp_allgather (jax.pallas_flex), balanced dispatch" in \
        done.stdout
    assert "results/2026-11-28-h100x4-cp (canonical cp run" in done.stdout


@pytest.mark.parametrize("args, said", [
    (["--mask=foo", "--seqlen=1k"], "--mask: one of full, causal"),
    (["--seqlen=1k"], "--mask is required"),
    (["--mask=full", "--seqlen=lots"], "--seqlen: a length such as 32768"),
    (["--mask=full", "--seqlen=1k", "--device=A100"], "value should be one of <H100|H200>"),
    (["--mask=full", "--seqlen=1000", "--gpus=3"], "--seqlen=1000 does not split over"),
    (["--mask=full", "--seqlen=1k", "--mask_param=window"], "give name=value"),
])
def test_cli_bad_flags_fail_with_a_message(args, said):
    done = _cli(*args)
    assert done.returncode != 0
    assert said in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_cli_without_canonical_runs_says_so(tmp_path):
    done = _cli("--mask=full", "--seqlen=1k", f"--results_root={tmp_path}")
    assert done.returncode != 0 and "no canonical run on H100" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_guide_cell_tells_an_unmeasured_length_from_a_refused_one():
    """No ranked candidate: "not measured" where a kernel of the framework was
    refused only for running shorter lengths (memory is not modelled), "none
    ranked" where every candidate was refused on its merits."""
    def frame(*notes):
        return pd.DataFrame([{"framework": "jax", "strategy": "-", "backend": f"jax.k{i}",
                              "ranked": False, "note": note} for i, note in enumerate(notes)])

    past = f"not ranked: longer than the 24k it ran on this card, and {MEMORY_NOT_MODELLED}"
    off = "not ranked: the model is off by 47 % at the nearest measured point (over 25 %)"
    assert guide.cell(frame(past, off), "jax") == "not measured"
    assert guide.cell(frame(off, "MISMATCH: max error 0.3"), "jax") == "none ranked"
    assert guide.cell(frame(past), "torch") == "none ranked"


@pytest.mark.slow
def test_guide_is_generated_from_the_committed_rows(tmp_path):
    path = tmp_path / "guide.md"
    done = _cli(f"--guide={path}")
    assert done.returncode == 0, done.stderr
    assert path.read_text() == (ROOT / "docs" / "guide.md").read_text(), (
        "docs/guide.md is stale: python -m lcab.advise --guide=docs/guide.md")


def test_evidence_reads_only_the_cards_canonical_runs():
    evidence = evidence_lib.load("H100")
    names = [folder.name for folder in evidence.folders]
    assert names and all(canonical.parse_folder(n)[1].startswith("h100") for n in names)
    assert {row["device"] for row in evidence.rows if row.get("status") == "OK"} == {
        "NVIDIA H100 80GB HBM3"}


@pytest.mark.slow
def test_the_documented_example_is_the_commands_output():
    text = (ROOT / "docs" / "advise_example.md").read_text()
    found = re.search(r"<!-- advise example: python -m lcab.advise ([^>]*) -->\n```\n(.*?)```\n",
                      text, re.DOTALL)
    assert found, "docs/advise_example.md's example block is missing"
    done = _cli(*found.group(1).split())
    assert done.returncode == 0, done.stderr
    assert done.stdout == found.group(2), (
        "docs/advise_example.md is stale: rerun the command in its marker")
