"""Packed-document masks: several documents back to back in one sequence."""

from lcab.masks.families.base import (
    check_positive,
    doc_bounds,
    register,
    resolve_doc_lens,
    table,
)
from lcab.masks.slices import CAUSAL, FULL

DOC_PARAMS = ("doc_lens", "distribution")
DEFAULT_BLOCK = 1024  # block-causal documents are made of 1024-token blocks
MAX_BLOCKS_PER_DOC = 8


@register("full_document", params=DOC_PARAMS, aliases=("varlen_full",))
def full_document(seqlen, rng, doc_lens=None, distribution=None):
    """Full attention inside each packed document."""
    lens, params = resolve_doc_lens(seqlen, rng, doc_lens, distribution)
    return table((s, e, s, e, FULL) for s, e in doc_bounds(lens)), params


@register("causal_document", params=DOC_PARAMS, aliases=("varlen_causal",))
def causal_document(seqlen, rng, doc_lens=None, distribution=None):
    """Causal attention inside each packed document."""
    lens, params = resolve_doc_lens(seqlen, rng, doc_lens, distribution)
    return table((s, e, s, e, CAUSAL) for s, e in doc_bounds(lens)), params


@register(
    "block_causal_document",
    params=("doc_lens", "block_size"),
    aliases=("varlen_block_causal",),
)
def block_causal_document(seqlen, rng, doc_lens=None, block_size=None):
    """Block-causal documents: a query block sees its document up to its block's end.

    Documents are 1-8 blocks long (uniform), the last clipped, unless doc_lens
    is given; then each document is cut into blocks, its last block shorter.
    """
    block = check_positive("block_size", block_size or DEFAULT_BLOCK)
    if doc_lens is None:
        lens, left = [], seqlen
        while left > 0:
            lens.append(min(int(rng.integers(1, MAX_BLOCKS_PER_DOC + 1)) * block, left))
            left -= lens[-1]
        params = {"doc_lens": lens}
    else:
        lens, params = resolve_doc_lens(seqlen, rng, doc_lens)
    rows = []
    for start, end in doc_bounds(lens):
        for block_start in range(start, end, block):
            block_end = min(block_start + block, end)
            rows.append((block_start, block_end, start, block_end, FULL))
    return table(rows), {**params, "block_size": block}


@register("share_question", params=DOC_PARAMS)
def share_question(seqlen, rng, doc_lens=None, distribution=None):
    """Doc 0 is a shared question; later docs are causal and also see all of doc 0."""
    lens, params = resolve_doc_lens(seqlen, rng, doc_lens, distribution)
    bounds = doc_bounds(lens)
    question_end = bounds[0][1]
    rows = [(0, question_end, 0, question_end, CAUSAL)]
    for start, end in bounds[1:]:
        rows += [(start, end, 0, question_end, FULL), (start, end, start, end, CAUSAL)]
    return table(rows), params


@register("causal_blockwise", params=DOC_PARAMS)
def causal_blockwise(seqlen, rng, doc_lens=None, distribution=None):
    """Causal inside each document; the last document sees everything before it."""
    lens, params = resolve_doc_lens(seqlen, rng, doc_lens, distribution)
    bounds = doc_bounds(lens)
    rows = [(s, e, s, e, CAUSAL) for s, e in bounds[:-1]]
    last_start = bounds[-1][0]
    # Bottom-right aligned causal over all keys: row i sees keys j <= i.
    rows.append((last_start, seqlen, 0, seqlen, CAUSAL))
    return table(rows), params


@register("prefix_lm_document", params=(*DOC_PARAMS, "prefix_len"))
def prefix_lm_document(seqlen, rng, doc_lens=None, distribution=None, prefix_len=None):
    """Prefix-LM inside each document: the first p tokens of a document are bidirectional.

    p is drawn in [1, len(doc 0)] unless given, and clipped to shorter documents.
    """
    lens, params = resolve_doc_lens(seqlen, rng, doc_lens, distribution)
    if prefix_len is None:
        prefix_len = int(rng.integers(1, lens[0] + 1))
    p = check_positive("prefix_len", prefix_len)
    rows = []
    for start, end in doc_bounds(lens):
        mid = min(start + p, end)
        rows += [(start, mid, start, mid, FULL), (mid, end, start, end, CAUSAL)]
    return table(rows), {**params, "prefix_len": p}
