"""Small-scale masks: each family with parameters that show its structure.

Used for pictures and for correctness probes: at a few hundred tokens the
default parameters (1024-token windows and blocks, real document lengths)
would collapse most families into full or causal, so a probe would not
test what the family is about. Sizes scale with the sequence length.
"""

from __future__ import annotations

from lcab.masks.factory import make_mask, taken_params
from lcab.masks.mask import AttnMask

SMALL_SEQLEN = 256
_DOC_LENS = (40, 72, 24, 56, 64)  # out of 256: five uneven documents
# Parameters at 256 tokens.
SMALL_PARAMS: dict[str, dict] = {
    "sliding_window": {"window": 24},
    "sliding_window_causal": {"window": 24},
    "longformer_window": {"global_len": 20},
    "longca_global_window": {"global_len": 20},
    "full_document": {"doc_lens": _DOC_LENS},
    "causal_document": {"doc_lens": _DOC_LENS},
    "block_causal_document": {"doc_lens": _DOC_LENS, "block_size": 16},
    "varlen_block_causal": {"doc_lens": _DOC_LENS, "block_size": 24},
    "share_question": {"doc_lens": _DOC_LENS},
    "causal_blockwise": {"doc_lens": _DOC_LENS},
    "prefix_lm_causal": {"prefix_len": 64},
    "prefix_lm_document": {"doc_lens": _DOC_LENS, "prefix_len": 16},
    "block_sparse": {"block_size": 16, "keep": 0.25},
    "var_block_sparse": {"block_size": 24, "keep": 0.25, "min_block": 8},
}


# Parameters a drawn mask leaves to its seed (they depend on the documents
# or are drawn from the length).
_DRAWN = ("doc_lens", "prefix_len", "global_len")


def small_params(name: str, seqlen: int = SMALL_SEQLEN, drawn: bool = False) -> dict:
    """Family `name`'s structure-revealing parameters, scaled from 256
    tokens to `seqlen`. drawn: documents (from the pile histogram), prefix
    and global lengths are left to the mask's seed, so many seeds give many
    masks of the same structure."""
    scale = seqlen / SMALL_SEQLEN
    out = {}
    for key, value in SMALL_PARAMS.get(name, {}).items():
        if drawn and key in _DRAWN:
            if key == "doc_lens":
                out.update(taken_params(name, distribution="pile"))
        elif key == "doc_lens":
            lens = [max(1, round(x * scale)) for x in value[:-1]]
            out[key] = [*lens, seqlen - sum(lens)]
        elif key == "keep":
            out[key] = value
        else:
            out[key] = max(1, round(value * scale))
    return out


def small_mask(name: str, seqlen: int = SMALL_SEQLEN, seed: int = 0) -> AttnMask:
    """Family `name` at `seqlen` (>= 32) with structure-revealing parameters."""
    if seqlen < 32:
        raise ValueError(f"small masks need seqlen >= 32, got {seqlen=}")
    return make_mask(name, seqlen, seed=seed, **small_params(name, seqlen))


_SIZE_PARAMS = ("window", "prefix_len", "global_len", "block_size", "min_block")
# How the documents were drawn: scaled masks give their documents explicitly.
_DRAW_PARAMS = ("distribution", "sampler", "doc_cap", "seed")
# Sparse blocks keep at least this size, so that a probe stays a few tiles
# of a blocked pattern rather than a cloud of single cells.
_MIN_BLOCK = 16


def scaled_mask(mask: AttnMask, seqlen: int, keep_sizes: bool = False) -> AttnMask:
    """The same family with every size parameter scaled to `seqlen` tokens.

    Document boundaries scale with the sequence (documents that shrink to
    nothing merge into their neighbour); windows, prefix, global and block
    lengths scale and stay at least 1; the kept fraction and seed stay. The
    result is how the mask would look if the whole workload were small, so
    a kernel expresses it the same way as the full-size mask. keep_sizes:
    windows, prefix, global and block lengths keep their size (a window
    still spans as many tiles), only documents scale; ValueError where a
    kept size does not fit `seqlen`.
    """
    ratio = seqlen / mask.seqlen_q
    params = {k: v for k, v in mask.params.items() if k not in _DRAW_PARAMS}
    for key in _SIZE_PARAMS:
        if key in params and keep_sizes:
            if params[key] >= seqlen:
                raise ValueError(f"{key}={params[key]} does not fit {seqlen} tokens")
        elif key in params:
            floor = min(params[key], _MIN_BLOCK) if key in ("block_size", "min_block") else 1
            params[key] = max(floor, round(params[key] * ratio))
    if "doc_lens" in params:
        ends = [round(end * ratio) for end in _cumulative(params["doc_lens"])]
        bounds = sorted({0, *ends, seqlen})
        params["doc_lens"] = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    return make_mask(mask.name, seqlen, seed=mask.params.get("seed", 0), **params)


def _cumulative(lens):
    total, out = 0, []
    for length in lens:
        total += length
        out.append(total)
    return out
