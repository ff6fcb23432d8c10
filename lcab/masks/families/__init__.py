"""Mask families, one module per kind of mask; importing registers them."""

# Import order is the order of MASK_NAMES (and of tables and pictures).
from lcab.masks.families import dense, windows, documents, prefix, sparse  # noqa: F401, I001
from lcab.masks.families.base import FAMILIES, Family

__all__ = ["FAMILIES", "Family"]
