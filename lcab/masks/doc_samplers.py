"""Packed-sequence samplers: document lengths that fill a sequence of S tokens.

Three named samplers read the same histograms (lcab.masks.doc_lengths); they
differ in how a histogram becomes documents, and the seeds differ exactly
there (docs/masks.md, "Document samplers"):

- `uncapped`: LCAB's original. A bucket by weight, a length uniform in the
  bucket, the last document clipped. No cap: at 8k-64k a few documents
  can fill most of the sequence.
- `magi_pack`: MagiAttention's packing (its blog's kernel and CP sweeps).
  Every bucket is one length, its midpoint; documents longer than
  cap * S (cap 0.25) are cut into pieces of cap * S and a remainder;
  the whole dataset is shuffled and packed back to back into sequences of
  S tokens, a document that crosses a sequence's end continuing in the
  next. One such pack is drawn: its first document is the remainder of a
  document cut by the pack's start (length-biased, as in a long stream),
  the next ones are drawn by their share of the dataset's pieces, and the
  last is cut by the pack's end.
- `longca`: LongCA-bench's (the seed paper). A bucket by weight, a length
  uniform over the bucket's two written numbers *inclusive* (randint(a, b)),
  clipped to what is left, a 0 raised to 1. Without a named histogram it
  follows the paper's schedule: pile up to 12k tokens, prolong64k up to
  64k, prolong512k up to 1m.
"""

from __future__ import annotations

import functools

import numpy as np

from lcab.masks import doc_lengths

SAMPLERS = ("uncapped", "magi_pack", "longca")
DEFAULT_SAMPLER = "uncapped"
DEFAULT_CAP = 0.25  # MagiAttention's chunk_ratio
# The seed paper's histogram by total length (LongCA-bench's kernel benchmark
# up to 64k; its CP benchmark adds prolong512k beyond).
LONGCA_SCHEDULE = ((12 * 1024, "pile"), (64 * 1024, "prolong64k"), (1024 * 1024, "prolong512k"))


def check_sampler(name: str) -> str:
    if name not in SAMPLERS:
        raise ValueError(f"sampler={name!r} is not one of {', '.join(SAMPLERS)}")
    return name


def check_cap(cap) -> float:
    cap = float(cap)
    if not 0.0 < cap <= 1.0:
        raise ValueError(f"doc_cap={cap} must be in (0, 1]: a fraction of the sequence")
    return cap


def default_distribution(sampler: str, seqlen: int) -> str:
    """The histogram a sampler reads when none is named."""
    if sampler != "longca":
        return doc_lengths.DEFAULT_DISTRIBUTION
    for longest, name in LONGCA_SCHEDULE:
        if seqlen <= longest:
            return name
    raise ValueError(
        f"seqlen={seqlen}: the longca schedule has histograms up to "
        f"{LONGCA_SCHEDULE[-1][0]} tokens; name a distribution")


def sample(sampler: str, seqlen: int, rng: np.random.Generator, distribution: str,
           cap: float | None = None) -> list[int]:
    """Document lengths summing to seqlen, drawn by `sampler` from `distribution`."""
    check_sampler(sampler)
    if cap is not None and sampler != "magi_pack":
        raise ValueError(f"doc_cap applies to the magi_pack sampler only, not {sampler!r}")
    hist = doc_lengths.histogram(distribution)
    if sampler == "uncapped":
        return _fill(seqlen, rng, _bucket_lengths(hist.lo, hist.hi, hist.weight), hist.mean())
    if sampler == "longca":
        inclusive = _bucket_lengths(hist.first, hist.last + 1, hist.weight)

        def draw(rng: np.random.Generator, n: int) -> np.ndarray:
            return np.maximum(inclusive(rng, n), 1)  # the paper raises a 0 to 1

        mean = float(np.sum(hist.weight * (hist.first + hist.last) / 2))
        return _fill(seqlen, rng, draw, max(mean, 1.0))
    return _magi_pack(seqlen, rng, hist, check_cap(DEFAULT_CAP if cap is None else cap))


def _bucket_lengths(lo, hi, weight):
    """Draws of n lengths: a bucket by weight, then uniform in [lo, hi)."""

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        bucket = rng.choice(len(weight), size=n, p=weight)
        return rng.integers(lo[bucket], hi[bucket])

    return draw


def _fill(seqlen: int, rng: np.random.Generator, draw, mean: float,
          first: int | None = None) -> list[int]:
    """Lengths from `draw` (after `first`) until seqlen is filled, the last clipped."""
    lens: list[int] = []
    remaining = seqlen
    if first is not None:
        lens.append(min(first, remaining))
        remaining -= lens[-1]
    while remaining > 0:
        # Draw in batches sized by the mean, so long sequences cost few calls.
        for length in draw(rng, int(remaining / mean) + 8).tolist():
            length = min(length, remaining)
            lens.append(length)
            remaining -= length
            if remaining == 0:
                break
    return lens


@functools.cache
def _pieces(distribution: str, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """MagiAttention's dataset after cutting at `chunk` tokens: every piece
    length and its share of all pieces."""
    hist = doc_lengths.histogram(distribution)
    mid = (hist.first + hist.last) // 2
    if mid.min() < 1:
        raise ValueError(f"{distribution}: a bucket's midpoint is 0 tokens")
    whole = mid // chunk  # full pieces per document
    tail = mid % chunk
    lengths = np.concatenate([[chunk], tail[tail > 0]])
    weights = np.concatenate([[np.sum(whole * hist.weight)], hist.weight[tail > 0]])
    keep = weights > 0
    lengths, weights = lengths[keep], weights[keep]
    order = np.argsort(lengths, kind="stable")
    lengths, weights = lengths[order], weights[order]
    # Merge equal lengths (a midpoint may equal the chunk or another tail).
    unique, index = np.unique(lengths, return_inverse=True)
    return unique, np.bincount(index, weights=weights) / weights.sum()


def _magi_pack(seqlen: int, rng: np.random.Generator, hist, cap: float) -> list[int]:
    chunk = int(seqlen * cap)
    smallest = int(((hist.first + hist.last) // 2).min())
    if chunk < smallest:
        raise ValueError(
            f"doc_cap={cap} of seqlen={seqlen} is {chunk} tokens, below {hist.name}'s "
            f"shortest document ({smallest}); choose doc_cap >= {smallest / seqlen:.3g}")
    lengths, share = _pieces(hist.name, chunk)
    # The pack's start cuts a piece chosen by its share of tokens; the
    # pack keeps a uniform 1..L of its L tokens (all of it when the cut
    # falls at its start).
    biased = share * lengths
    crossing = int(lengths[rng.choice(len(lengths), p=biased / biased.sum())])
    first = int(rng.integers(1, crossing, endpoint=True))

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return lengths[rng.choice(len(lengths), size=n, p=share)]

    return _fill(seqlen, rng, draw, float(np.sum(share * lengths)), first=first)
