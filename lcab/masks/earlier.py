"""Masks as rows written before 2026-11-27 name them (docs/masks.md, "Rows
written earlier"): a family since renamed, or a generator whose earlier
form is now a parameter value the row does not record. `as_today` reads
such a row's mask as today's names and parameters, so the row rebuilds its
own mask (same fingerprint); `is_earlier_form` tells those forms apart.
"""

from __future__ import annotations

from collections.abc import Mapping

from lcab.masks.factory import make_mask

RENAMED = {"global_sliding_window": "longformer_window"}
# family -> (the parameter today's generator records, the earlier form's values)
EARLIER_FORMS = {
    "block_sparse": ("rounding", {"rounding": "nearest"}),
    "var_block_sparse": ("sizes", {"sizes": "uniform", "rounding": "nearest"}),
}


def as_today(mask: str, seqlen: int, params: Mapping, fingerprint: str | None) -> tuple[str, dict]:
    """(family, params) of a row's mask under today's names and parameters."""
    mask = RENAMED.get(mask, mask)
    params = dict(params)
    if mask not in EARLIER_FORMS:
        return mask, params
    marker, earlier = EARLIER_FORMS[mask]
    if params and marker not in params and not _built_today(mask, seqlen, params, fingerprint):
        params.update(earlier)
    return mask, params


def is_earlier_form(params: Mapping) -> bool:
    """Whether block-sparse parameters name one of the earlier generators."""
    return any(params.get(key) == value
               for _, earlier in EARLIER_FORMS.values() for key, value in earlier.items())


def _built_today(mask: str, seqlen: int, params: dict, fingerprint: str | None) -> bool:
    """Whether today's generator made the row's mask (some rows were written
    by it before it recorded its form): the fingerprint decides."""
    if "min_block" in params:  # only today's var_block_sparse has it
        return True
    rest = {k: v for k, v in params.items() if k != "seed"}
    try:
        built = make_mask(mask, int(seqlen), seed=params.get("seed", 0), **rest)
    except (TypeError, ValueError):
        return False
    return built.fingerprint() == fingerprint
