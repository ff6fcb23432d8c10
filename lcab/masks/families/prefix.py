"""Prefix-LM over the whole sequence."""

from lcab.masks.families.base import check_positive, register, table
from lcab.masks.slices import CAUSAL, FULL


@register("prefix_lm_causal", params=("prefix_len",))
def prefix_lm_causal(seqlen, rng, prefix_len=None):
    """Keys j < p are visible to every query; causal after that."""
    if prefix_len is None:
        prefix_len = int(rng.integers(1, seqlen + 1))
    p = check_positive("prefix_len", prefix_len)
    if p > seqlen:
        raise ValueError(f"prefix_len={p} exceeds seqlen={seqlen}")
    # Rows i >= p see keys j <= i: a bottom-right aligned causal slice.
    return table([(0, p, 0, p, FULL), (p, seqlen, 0, seqlen, CAUSAL)]), {"prefix_len": p}
