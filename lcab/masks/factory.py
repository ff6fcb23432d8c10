"""make_mask: every mask family by name, seeded and reproducible."""

from __future__ import annotations

import numpy as np

from lcab.masks.families import FAMILIES
from lcab.masks.mask import AttnMask

MASK_NAMES: tuple[str, ...] = tuple(FAMILIES)
ALIASES: dict[str, str] = {
    alias: family.name for family in FAMILIES.values() for alias in family.aliases
}


def canonical_name(name: str) -> str:
    """A family name or alias -> the family name; ValueError names the choices."""
    if name in FAMILIES:
        return name
    if name in ALIASES:
        return ALIASES[name]
    raise ValueError(
        f"unknown mask {name!r}; choose from {', '.join(MASK_NAMES)} "
        f"(aliases: {', '.join(sorted(ALIASES))})"
    )


def taken_params(name: str, **offered) -> dict:
    """The offered parameters that family `name` takes, None ones left out:
    what a sweep-wide setting (window, distribution) means for one family."""
    takes = FAMILIES[canonical_name(name)].params
    return {k: v for k, v in offered.items() if k in takes and v is not None}


def make_mask(name: str, seqlen: int, *, seed: int = 0, **params) -> AttnMask:
    """The mask of family `name` over a (seqlen x seqlen) grid.

    Random parameters (document lengths, prefix or global length, sparse
    blocks) come from numpy's generator seeded with `seed`, so the same
    (name, seqlen, params, seed) is the same mask in every process. Any
    parameter can be given explicitly instead; the resolved values are in
    the mask's `params`.
    """
    family = FAMILIES[canonical_name(name)]
    if int(seqlen) != seqlen or seqlen <= 0:
        raise ValueError(f"seqlen={seqlen!r} must be a positive integer")
    unknown = sorted(set(params) - set(family.params))
    if unknown:
        raise ValueError(
            f"mask {family.name!r} takes no parameter {', '.join(unknown)}; "
            f"it takes: {', '.join(family.params) or 'none'}"
        )
    given = {k: v for k, v in params.items() if v is not None}
    rng = np.random.default_rng(seed)
    table, resolved = family.build(int(seqlen), rng, **given)
    return AttnMask(
        seqlen,
        seqlen,
        table,
        name=family.name,
        params={"seed": seed, **resolved},
        _trusted=True,
    )
