"""python -m lcab.advise: which kernel and CP strategy for my mask, length and GPUs.

    python -m lcab.advise --mask=causal_document --seqlen=512k --gpus=64 \\
        --gpus_per_node=8 --device=H100 --framework=jax

Prints the candidates ranked by the attention step's time (forward plus
backward), each with per-GPU TFLOP/s, the CP layout and whether its
figures were measured (which committed row) or modelled (calibrated on
which rows, and the model's error at the nearest measured point); then
what was not ranked and why. --guide=PATH writes docs/guide.md instead.
"""

from __future__ import annotations

import pathlib
import sys

from absl import app, flags

from lcab import canonical
from lcab.advise import evidence as evidence_lib
from lcab.advise.recommend import FRAMEWORKS, Question, recommend
from lcab.advise.text import answer
from lcab.cp import DISPATCH_NAMES
from lcab.experiments.sweep import parse_heads
from lcab.masks import MASK_NAMES, canonical_name
from lcab.masks.doc_lengths import DISTRIBUTIONS
from lcab.masks.doc_samplers import SAMPLERS
from lcab.model.network import INFINIBAND_NDR
from lcab.workloads import DTYPES, canonical_dtype, parse_seqlen

_MASK = flags.DEFINE_string("mask", None, f"Mask family: {', '.join(MASK_NAMES)}.")
_SEQLEN = flags.DEFINE_string("seqlen", None, "Global sequence length, e.g. 32k, 512k, 1m.")
_GPUS = flags.DEFINE_integer("gpus", 1, "GPUs the sequence is spread over (the CP size).",
                             lower_bound=1)
_GPUS_PER_NODE = flags.DEFINE_integer("gpus_per_node", 8, "GPUs joined by NVLink.",
                                      lower_bound=1)
_FRAMEWORK = flags.DEFINE_enum("framework", "any", [*FRAMEWORKS, "any"],
                               "The framework you train in.")
_DEVICE = flags.DEFINE_enum("device", "H100", list(evidence_lib.DEVICES),
                            "Your GPU (LCAB's rows come from these cards).")
_HEADS = flags.DEFINE_string("heads", "64:8", "Query:KV heads.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 128, "Head dimension.", lower_bound=1)
_DTYPE = flags.DEFINE_string("dtype", "bfloat16", f"One of {', '.join(DTYPES)}.")
_DOC_DISTRIBUTION = flags.DEFINE_enum("doc_distribution", "chatqa2_long_sft",
                                      list(DISTRIBUTIONS), "Document-length histogram.")
_DOC_SAMPLER = flags.DEFINE_enum("doc_sampler", "magi_pack", list(SAMPLERS),
                                 "How documents are drawn (docs/masks.md).")
_DOC_CAP = flags.DEFINE_float("doc_cap", None, "magi_pack: longest document as a fraction of "
                              "the length (default 0.25).")
_MASK_PARAM = flags.DEFINE_list("mask_param", [], "Other mask parameters as name=value, e.g. "
                                "window=1024.")
_MASK_SEED = flags.DEFINE_integer("mask_seed", 0, "Seed of random mask parameters.",
                                  lower_bound=0)
_DISPATCH = flags.DEFINE_list("dispatch", ["balanced", "zigzag"],
                              f"Dispatches the model tries: {', '.join(DISPATCH_NAMES)}.")
_INTER_GBPS = flags.DEFINE_float("inter_node_gbps", INFINIBAND_NDR.beta_bytes_per_s / 1e9,
                                 "Bus bandwidth per GPU between nodes (GB/s; default "
                                 "InfiniBand NDR's).", lower_bound=0.001)
_INTER_ALPHA_US = flags.DEFINE_float("inter_node_alpha_us", INFINIBAND_NDR.alpha_s * 1e6,
                                     "Latency of a collective between nodes (us).",
                                     lower_bound=0.0)
_RESULTS_ROOT = flags.DEFINE_string("results_root", str(canonical.RESULTS),
                                    "Folder of the canonical runs: this checkout's results/.")
_GUIDE = flags.DEFINE_string("guide", None, "Write the guide page (docs/guide.md) here "
                             "instead of answering one question.")

flags.register_validator("mask", lambda v: v is None or _known_mask(v),
                         f"--mask: one of {', '.join(MASK_NAMES)}")
flags.register_validator("dtype", lambda v: _parses(canonical_dtype, v),
                         f"--dtype: one of {', '.join(DTYPES)}")
flags.register_validator("heads", lambda v: _parses(parse_heads, v),
                         "--heads: query:KV heads, e.g. 64:8")
flags.register_validator("seqlen", lambda v: v is None or _parses(parse_seqlen, v),
                         "--seqlen: a length such as 32768, 32k or 1m")
flags.register_validator("dispatch", lambda v: set(v) <= set(DISPATCH_NAMES),
                         f"--dispatch: among {', '.join(DISPATCH_NAMES)}")


def _known_mask(name: str) -> bool:
    try:
        canonical_name(name)
    except (KeyError, ValueError):
        return False
    return True


def _parses(parse, value) -> bool:
    try:
        parse(value)
    except (KeyError, ValueError):
        return False
    return True


def _mask_params() -> tuple[tuple[str, object], ...]:
    found = []
    for item in _MASK_PARAM.value:
        name, sep, text = item.partition("=")
        if not sep:
            raise app.UsageError(f"--mask_param={item}: give name=value, e.g. window=1024")
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                value = text
        found.append((name, value))
    return tuple(found)


def question() -> Question:
    for holder in (_MASK, _SEQLEN):
        if holder.value is None:
            raise app.UsageError(f"--{holder.name} is required (e.g. --mask=causal_document "
                                 "--seqlen=128k)")
    heads_q, heads_kv = parse_heads(_HEADS.value)
    return Question(
        mask=canonical_name(_MASK.value), seqlen=parse_seqlen(_SEQLEN.value), gpus=_GPUS.value,
        framework=_FRAMEWORK.value, device=_DEVICE.value, gpus_per_node=_GPUS_PER_NODE.value,
        heads_q=heads_q, heads_kv=heads_kv, head_dim=_HEAD_DIM.value,
        dtype=canonical_dtype(_DTYPE.value), doc_distribution=_DOC_DISTRIBUTION.value,
        doc_sampler=_DOC_SAMPLER.value, doc_cap=_DOC_CAP.value, mask_params=_mask_params(),
        mask_seed=_MASK_SEED.value, inter_alpha_us=_INTER_ALPHA_US.value,
        inter_gbps=_INTER_GBPS.value, dispatches=tuple(_DISPATCH.value))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    root = pathlib.Path(_RESULTS_ROOT.value)
    if _GUIDE.value:
        from lcab.advise import guide

        path = pathlib.Path(_GUIDE.value)
        path.write_text(guide.markdown(root=root))
        print(path)
        return
    asked = question()
    try:
        asked.check()
        evidence = evidence_lib.load(asked.device, root)
    except ValueError as exc:  # a question that cannot be asked, or nothing to answer from
        raise app.UsageError(str(exc)) from None
    print(answer(asked, recommend(asked, evidence), evidence))


def console_main():
    """The lcab-advise console script."""
    try:
        app.run(main)
    except BrokenPipeError:
        sys.exit(1)


if __name__ == "__main__":
    console_main()
