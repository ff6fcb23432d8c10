"""Masks in the exact slice representation (see docs/masks.md).

    from lcab.masks import make_mask
    mask = make_mask("causal_document", 32768, seed=0)
    mask.area(), mask.cu_seqlens(), mask.block_schedule(128, 128)
"""

from lcab.masks.factory import ALIASES, MASK_NAMES, canonical_name, make_mask, taken_params
from lcab.masks.families import FAMILIES as FAMILIES_BY_NAME
from lcab.masks.mask import DENSE_LIMIT, AttnMask, Documents
from lcab.masks.schedule import BlockSchedule
from lcab.masks.small import small_mask
from lcab.masks.slices import KINDS, AttnSlice

__all__ = [
    "ALIASES",
    "DENSE_LIMIT",
    "FAMILIES_BY_NAME",
    "KINDS",
    "MASK_NAMES",
    "AttnMask",
    "AttnSlice",
    "BlockSchedule",
    "Documents",
    "canonical_name",
    "make_mask",
    "taken_params",
    "small_mask",
]
