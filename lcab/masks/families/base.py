"""What a mask family is, and the registry make_mask reads.

A family turns (seqlen, seeded rng, explicit parameters) into a slice table
plus every parameter it resolved, drawn ones included, so a row in the
results can always name the exact mask it measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from lcab.masks import doc_samplers
from lcab.masks.slices import BI_CAUSAL, CAUSAL, FULL, INV_CAUSAL

Builder = Callable[..., tuple[np.ndarray, dict]]


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    build: Builder
    params: tuple[str, ...]
    summary: str
    aliases: tuple[str, ...] = ()


FAMILIES: dict[str, Family] = {}


def register(name: str, *, params: tuple[str, ...] = (), aliases: tuple[str, ...] = ()):
    """Decorator: add a builder `build(seqlen, rng, **params)` as a family."""

    def wrap(build: Builder) -> Builder:
        summary = (build.__doc__ or "").strip().splitlines()[0]
        FAMILIES[name] = Family(name, build, params, summary, aliases)
        return build

    return wrap


def table(rows) -> np.ndarray:
    """Slice rows -> slice table, dropping slices with no rows or columns."""
    out = np.array(list(rows), dtype=np.int64).reshape(-1, 5)
    return out[(out[:, 1] > out[:, 0]) & (out[:, 3] > out[:, 2])]


def band_rows(q0: int, q1: int, k0: int, k1: int, left: int, right: int) -> list:
    """Slices for: row i in [q0, q1) sees keys [i - left, i + right] & [k0, k1).

    Rows split where a clip starts or stops applying; inside each piece the
    visible interval's two ends are each fixed or move with the row, which
    is exactly one slice kind (fixed/fixed full, fixed/moving causal,
    moving/fixed inv_causal, moving/moving bi_causal).
    """
    cuts = sorted({q0, q1, *[min(max(x, q0), q1) for x in
                              (k0 + left, k1 - right, k0 - right, k1 + left)]})
    rows = []
    for r0, r1 in zip(cuts[:-1], cuts[1:]):
        if r1 <= r0 or r1 - 1 + right < k0 or r0 - left > k1 - 1:
            continue  # these rows see nothing
        lo_moves = r0 - left >= k0
        hi_moves = r1 - 1 + right <= k1 - 1
        col_lo = r0 - left if lo_moves else k0
        col_hi = r1 + right if hi_moves else k1
        kind = {
            (False, False): FULL,
            (False, True): CAUSAL,
            (True, False): INV_CAUSAL,
            (True, True): BI_CAUSAL,
        }[(lo_moves, hi_moves)]
        rows.append((r0, r1, col_lo, col_hi, kind))
    return rows


DOC_PARAMS = ("doc_lens", "distribution", "sampler", "doc_cap")


def resolve_doc_lens(seqlen: int, rng, doc_lens=None, distribution=None, sampler=None,
                     doc_cap=None) -> tuple[list, dict]:
    """Explicit doc_lens (checked) or lengths drawn by a sampler from a histogram.

    With doc_lens, any sampler settings given too are kept as their record
    (a mask rebuilt from its recorded params is the same mask, same params).
    """
    if doc_lens is not None:
        doc_lens = [int(x) for x in doc_lens]
        if any(x <= 0 for x in doc_lens):
            raise ValueError(f"doc_lens must all be positive, got {doc_lens}")
        if sum(doc_lens) != seqlen:
            raise ValueError(f"doc_lens sum to {sum(doc_lens)}, not {seqlen=}")
        record = {"sampler": sampler, "distribution": distribution, "doc_cap": doc_cap}
        return doc_lens, {**{k: v for k, v in record.items() if v is not None},
                          "doc_lens": doc_lens}
    sampler = doc_samplers.check_sampler(sampler or doc_samplers.DEFAULT_SAMPLER)
    distribution = distribution or doc_samplers.default_distribution(sampler, seqlen)
    if sampler == "magi_pack" and doc_cap is None:
        doc_cap = doc_samplers.DEFAULT_CAP  # recorded, so the row names its cap
    drawn = doc_samplers.sample(sampler, seqlen, rng, distribution, doc_cap)
    params = {"sampler": sampler, "distribution": distribution, "doc_lens": drawn}
    if doc_cap is not None:
        params["doc_cap"] = float(doc_cap)
    return drawn, params


def doc_bounds(doc_lens) -> list[tuple[int, int]]:
    ends = np.cumsum(doc_lens).tolist()
    starts = [0] + ends[:-1]
    return list(zip(starts, ends))


def check_positive(name: str, value, *, allow_zero: bool = False) -> int:
    if value is None or int(value) != value or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}={value!r} must be an integer {bound}")
    return int(value)
