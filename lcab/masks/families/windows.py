"""Window-shaped masks: sliding windows and Longformer-style global windows.

Window (left, right) follows FlashAttention: query i sees keys j with
i - left <= j <= i + right.
"""

from lcab.masks.families.base import band_rows, check_positive, register, table
from lcab.masks.slices import FULL

DEFAULT_WINDOW = 1024  # the seed's setting


@register("sliding_window", params=("window",))
def sliding_window(seqlen, rng, window=DEFAULT_WINDOW):
    """A (w, w) window: query i sees keys i-w..i+w."""
    w = check_positive("window", window, allow_zero=True)
    return table(band_rows(0, seqlen, 0, seqlen, w, w)), {"window": w}


@register("sliding_window_causal", params=("window",))
def sliding_window_causal(seqlen, rng, window=DEFAULT_WINDOW):
    """A (w, 0) window: query i sees keys i-w..i."""
    w = check_positive("window", window, allow_zero=True)
    return table(band_rows(0, seqlen, 0, seqlen, w, 0)), {"window": w}


@register("global_sliding_window", params=("global_len",))
def global_sliding_window(seqlen, rng, global_len=None):
    """Longformer: the first g tokens are global, plus a (g, g) band."""
    if global_len is None:
        global_len = int(rng.integers(1, max(seqlen // 3 - 1, 1) + 1))
    g = check_positive("global_len", global_len)
    g = min(g, seqlen)
    rows = [
        (0, g, 0, seqlen, FULL),  # global queries see everything
        (g, seqlen, 0, g, FULL),  # every query sees the global keys
        *band_rows(g, seqlen, g, seqlen, g, g),
    ]
    return table(rows), {"global_len": g}
