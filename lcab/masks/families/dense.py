"""Full and causal masks."""

from lcab.masks.families.base import register, table
from lcab.masks.slices import CAUSAL, FULL


@register("full")
def full(seqlen, rng):
    """Every query sees every key."""
    return table([(0, seqlen, 0, seqlen, FULL)]), {}


@register("causal")
def causal(seqlen, rng):
    """Query i sees keys j <= i."""
    return table([(0, seqlen, 0, seqlen, CAUSAL)]), {}
