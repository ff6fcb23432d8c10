"""recommend()'s answer as text: the ranked table, then what is listed but
not ranked and why, then the rows it stands on."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lcab.advise.evidence import Evidence
from lcab.advise.recommend import Question
from lcab.report.tables import to_markdown


def figures(row) -> str:
    """"371 / 323" per-GPU TFLOP/s forward / backward ("" without figures)."""
    if not math.isfinite(row["fwd_tflops"]) and not math.isfinite(row["bwd_tflops"]):
        return ""
    return " / ".join(f"{row[f'{d}_tflops']:.0f}" if math.isfinite(row[f"{d}_tflops"]) else "-"
                      for d in ("fwd", "bwd"))


def choice(row) -> str:
    """"jax.cp_groupcast (jax.pallas_flex), balanced" or "jax.cudnn"."""
    if row["strategy"] == "-":
        return row["backend"]
    dispatch = f", {row['dispatch']} dispatch" if row["dispatch"] != "-" else ""
    kernel = f" ({row['kernel']})" if row["kernel"] not in ("-", "?") else ""
    return f"{row['backend']}{kernel}{dispatch}"


def ranked_table(frame: pd.DataFrame) -> pd.DataFrame:
    ranked = frame[frame["ranked"]]
    return pd.DataFrame({
        "rank": ranked["rank"].astype(int),
        "framework": ranked["framework"],
        "kernel / CP strategy": ranked.apply(choice, axis=1),
        "layout": ranked["layout"],
        "per-GPU TFLOP/s fwd / bwd": ranked.apply(figures, axis=1),
        "attention ms fwd + bwd": ranked["step_ms"].map(lambda v: f"{v:.3g}"),
        "source": ranked["source"],
    }).set_index("rank")


def answer(question: Question, frame: pd.DataFrame, evidence: Evidence) -> str:
    lines = [f"LCAB advice for {question.text()}", ""]
    if frame["ranked"].any():
        lines += [to_markdown(ranked_table(frame)), ""]
    else:
        lines += ["Nothing can be ranked for this question (below: why).", ""]
    ranked = frame[frame["ranked"]]
    parts = [[p for p in row["note"].split("; ") if p] for _, row in ranked.iterrows()]
    shared = [p for p in (parts[0] if parts else []) if all(p in mine for mine in parts)]
    if len(ranked):
        lines.append("Where each ranked figure comes from:")
    for evidence_text in dict.fromkeys(ranked["evidence"]):
        ranks = ", ".join(str(r) for r in ranked.loc[ranked["evidence"] == evidence_text, "rank"])
        lines.append(f"- {ranks}: {evidence_text}")
    lines += [f"- all: {part}" for part in shared]
    for (_, row), mine in zip(ranked.iterrows(), parts):
        said = [f"model error at the nearest measured point: {row['model_error']}"] \
            if row["model_error"] else []
        said += [p for p in mine if p not in shared]
        if said:
            lines.append(f"- {row['rank']}: {'; '.join(said)}")
    unranked = frame[~frame["ranked"]]
    if len(unranked):
        lines += ["", "Listed, not ranked:"]
        for _, row in unranked.iterrows():
            shown = figures(row)
            shown = f" ({row['source']} {shown} TFLOP/s)" if shown else ""
            lines.append(f"- {choice(row)}{shown}: {row['note']}")
    lines += _published(question, evidence)
    lines += ["", f"Committed runs read on {evidence.device}:", evidence.describe(),
              ("Modelled figures are lcab.model's (a model, not a measurement): per-GPU "
               "TFLOP/s from exact mask areas, the kernel's measured curve and alpha-beta "
               "links (docs/model.md).")]
    return "\n".join(lines)


def _published(question: Question, evidence: Evidence) -> list[str]:
    """The model against published figures of the question's mask at the
    GPU count nearest it: how far the model goes astray in that regime."""
    if question.gpus == 1 or "jax" not in question.frameworks():
        return []
    frame = evidence.published(question.gpus_per_node, question.inter(), question.shape())
    if frame.empty or not (frame["mask"] == question.mask).any():
        return []
    mine = frame[frame["mask"] == question.mask]
    distance = np.log2(mine["cp"] / question.gpus).abs()
    closest = distance.groupby(mine["published"]).transform("min")
    nearest = mine[distance == closest]
    lines = ["", (f"The model against published figures ({question.mask}, forward, 8k tokens "
                  "per GPU, H100s; other implementations than LCAB's, so this checks the "
                  "model's regime, not these backends):")]
    for _, row in nearest.sort_values(["published", "cp"], kind="stable").iterrows():
        error = 100.0 * (row["model TFLOP/s"] - row["published TFLOP/s"]) / row[
            "published TFLOP/s"]
        packs = f", mean of {row['packs']} packs" if row["packs"] > 1 else ""
        lines.append(f"- {row['published']} at {row['cp']} GPUs: {row['published TFLOP/s']} "
                     f"published; the model ({row['model']}) {row['model TFLOP/s']} "
                     f"({error:+.0f} %{packs})")
    return lines
