"""The workload flags, defined once for every CLI that describes attention
workloads: the benchmark (`python -m lcab.experiments`) and the CP model
(`python -m lcab.model`).

A None default means "not given": the benchmark then takes the preset
flagfile's value (lcab.experiments.presets), the model its own defaults
(FLAGS.set_default in lcab/model/__main__.py). Bad values fail at parse time
with a message naming the valid choices.
"""

from __future__ import annotations

from collections.abc import Callable

from absl import flags

from lcab.cp import DISPATCH_NAMES
from lcab.experiments.sweep import parse_heads
from lcab.flops import TIMED_DIRECTIONS
from lcab.masks import MASK_NAMES, canonical_name
from lcab.masks.doc_lengths import DISTRIBUTIONS
from lcab.masks.doc_samplers import SAMPLERS, check_cap
from lcab.workloads import DTYPES, canonical_dtype

MASKS = flags.DEFINE_list("masks", None, f"Mask families: {', '.join(MASK_NAMES)}.")
HEADS = flags.DEFINE_string("heads", None, "Query:KV heads, e.g. 64:8.")
HEAD_DIM = flags.DEFINE_integer("head_dim", None, "Head dimension.", lower_bound=1)
DTYPE = flags.DEFINE_string("dtype", None, f"One of {', '.join(DTYPES)} (or bf16, fp16, fp32).")
DIRECTIONS = flags.DEFINE_list(
    "directions", ["fwd", "bwd"], "Directions to time: fwd, bwd (bwd = fwd+bwd - fwd).")
DOC_DISTRIBUTION = flags.DEFINE_enum(
    "doc_distribution", None, list(DISTRIBUTIONS),
    "Document-length histogram (default: chatqa2_long_sft; with --doc_sampler=longca, the "
    "seed paper's schedule by length).")
DOC_SAMPLER = flags.DEFINE_enum(
    "doc_sampler", None, list(SAMPLERS),
    "How documents are drawn from the histogram: uncapped (LCAB's original), magi_pack "
    "(MagiAttention's packing, documents cut at --doc_cap of the length) or longca (the seed "
    "paper's). docs/masks.md says how each works.")
DOC_CAP = flags.DEFINE_float(
    "doc_cap", None, "magi_pack only: the longest document as a fraction of the length, "
    "in (0, 1] (default 0.25).")
MASK_SEED = flags.DEFINE_integer("mask_seed", 0, "Seed of random mask parameters, in [0, 2**63).",
                                 lower_bound=0, upper_bound=2**63 - 1)
DISPATCH = flags.DEFINE_list(
    "dispatch", None,
    f"How CP strategies assign tokens to ranks: {', '.join(DISPATCH_NAMES)} (the benchmark "
    "takes one, default zigzag).")


def parse_direction(text: str) -> str:
    if text not in TIMED_DIRECTIONS:
        raise ValueError(f"direction {text!r} is not one of {', '.join(TIMED_DIRECTIONS)}")
    return text


def parse_dispatch(text: str) -> str:
    if text not in DISPATCH_NAMES:
        raise ValueError(f"dispatch {text!r} is not one of {', '.join(DISPATCH_NAMES)}")
    return text


def validate_each(holder: flags.FlagHolder, parse: Callable[[str], object]) -> None:
    """Check every value of the flag (one, or each of a list) with `parse`,
    whose ValueError becomes the flag's error."""

    def check(value) -> bool:
        try:
            for text in value if isinstance(value, list) else [value]:
                parse(text)
        except ValueError as exc:
            raise flags.ValidationError(str(exc)) from exc
        return True

    flags.register_validator(holder.name, lambda value: value is None or check(value))


def refuse_empty(holder: flags.FlagHolder) -> None:
    """A list flag given with nothing in it (--seqlens=) is an error: it
    would run nothing and say nothing."""
    flags.register_validator(
        holder.name, lambda value: value is None or len(value) > 0,
        f"--{holder.name} is given but empty; give at least one value or leave it out")


validate_each(MASKS, canonical_name)
refuse_empty(MASKS)
refuse_empty(DIRECTIONS)
refuse_empty(DISPATCH)
validate_each(HEADS, parse_heads)
validate_each(DTYPE, canonical_dtype)
validate_each(DIRECTIONS, parse_direction)
validate_each(DISPATCH, parse_dispatch)
validate_each(DOC_CAP, check_cap)
