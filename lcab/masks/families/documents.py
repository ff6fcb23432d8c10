"""Packed-document masks: several documents back to back in one sequence."""

from lcab.masks.families.base import (
    DOC_PARAMS,
    check_positive,
    doc_bounds,
    register,
    resolve_doc_lens,
    table,
)
from lcab.masks.slices import CAUSAL, FULL

# The seed paper's block-causal documents: 1-8 blocks of 1024 tokens.
PAPER_BLOCK = 1024
MAX_BLOCKS_PER_DOC = 8
# MagiAttention's varlen block-causal (Magi-1): documents cut into 2048-token blocks.
MAGI_BLOCK = 2048


@register("full_document", params=DOC_PARAMS, aliases=("varlen_full",))
def full_document(seqlen, rng, **drawn):
    """Full attention inside each packed document."""
    lens, params = resolve_doc_lens(seqlen, rng, **drawn)
    return table((s, e, s, e, FULL) for s, e in doc_bounds(lens)), params


@register("causal_document", params=DOC_PARAMS, aliases=("varlen_causal",))
def causal_document(seqlen, rng, **drawn):
    """Causal attention inside each packed document."""
    lens, params = resolve_doc_lens(seqlen, rng, **drawn)
    return table((s, e, s, e, CAUSAL) for s, e in doc_bounds(lens)), params


def _block_causal(lens, block) -> list:
    """Each document cut into blocks of `block` (its last block shorter); a
    block's queries see their document up to the block's end."""
    rows = []
    for start, end in doc_bounds(lens):
        for block_start in range(start, end, block):
            block_end = min(block_start + block, end)
            rows.append((block_start, block_end, start, block_end, FULL))
    return rows


@register("block_causal_document", params=("doc_lens", "block_size"))
def block_causal_document(seqlen, rng, doc_lens=None, block_size=None):
    """The seed paper's block-causal documents: 1-8 blocks of 1024 tokens each.

    Documents are 1-8 blocks long (uniform), the last clipped, unless doc_lens
    is given; then each document is cut into blocks, its last block shorter.
    """
    block = check_positive("block_size", block_size or PAPER_BLOCK)
    if doc_lens is None:
        lens, left = [], seqlen
        while left > 0:
            lens.append(min(int(rng.integers(1, MAX_BLOCKS_PER_DOC + 1)) * block, left))
            left -= lens[-1]
        params = {"doc_lens": lens}
    else:
        lens, params = resolve_doc_lens(seqlen, rng, doc_lens)
    return table(_block_causal(lens, block)), {**params, "block_size": block}


@register("varlen_block_causal", params=(*DOC_PARAMS, "block_size"))
def varlen_block_causal(seqlen, rng, block_size=None, **drawn):
    """MagiAttention's varlen block-causal: sampled documents cut into 2048-token blocks."""
    block = check_positive("block_size", block_size or MAGI_BLOCK)
    lens, params = resolve_doc_lens(seqlen, rng, **drawn)
    return table(_block_causal(lens, block)), {**params, "block_size": block}


@register("share_question", params=DOC_PARAMS)
def share_question(seqlen, rng, **drawn):
    """Doc 0 is a shared question; later docs are causal and also see all of doc 0."""
    lens, params = resolve_doc_lens(seqlen, rng, **drawn)
    bounds = doc_bounds(lens)
    question_end = bounds[0][1]
    rows = [(0, question_end, 0, question_end, CAUSAL)]
    for start, end in bounds[1:]:
        rows += [(start, end, 0, question_end, FULL), (start, end, start, end, CAUSAL)]
    return table(rows), params


@register("causal_blockwise", params=DOC_PARAMS)
def causal_blockwise(seqlen, rng, **drawn):
    """Causal inside each document; the last document sees everything before it."""
    lens, params = resolve_doc_lens(seqlen, rng, **drawn)
    bounds = doc_bounds(lens)
    rows = [(s, e, s, e, CAUSAL) for s, e in bounds[:-1]]
    last_start = bounds[-1][0]
    # Bottom-right aligned causal over all keys: row i sees keys j <= i.
    rows.append((last_start, seqlen, 0, seqlen, CAUSAL))
    return table(rows), params


@register("prefix_lm_document", params=(*DOC_PARAMS, "prefix_len"))
def prefix_lm_document(seqlen, rng, prefix_len=None, **drawn):
    """Prefix-LM inside each document: the first p tokens of a document are bidirectional.

    p is drawn in [1, len(doc 0)] unless given, and clipped to shorter documents.
    """
    lens, params = resolve_doc_lens(seqlen, rng, **drawn)
    if prefix_len is None:
        prefix_len = int(rng.integers(1, lens[0] + 1))
    p = check_positive("prefix_len", prefix_len)
    rows = []
    for start, end in doc_bounds(lens):
        mid = min(start + p, end)
        rows += [(start, mid, start, mid, FULL), (mid, end, start, end, CAUSAL)]
    return table(rows), {**params, "prefix_len": p}
