"""Window-shaped masks: sliding windows and global windows (Longformer's, the seed paper's).

Window (left, right) follows FlashAttention: query i sees keys j with
i - left <= j <= i + right.
"""

from lcab.masks.families.base import band_rows, check_positive, register, table
from lcab.masks.slices import CAUSAL, FULL

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


def _global_len(seqlen, rng, global_len):
    """g drawn in [1, max(1, S//3 - 1)] (the seed paper's range) unless given."""
    if global_len is None:
        global_len = int(rng.integers(1, max(seqlen // 3 - 1, 1) + 1))
    return min(check_positive("global_len", global_len), seqlen)


@register("longformer_window", params=("global_len",))
def longformer_window(seqlen, rng, global_len=None):
    """Longformer: the first g tokens are global (see and are seen by all), plus a (g, g) band."""
    g = _global_len(seqlen, rng, global_len)
    rows = [
        (0, g, 0, seqlen, FULL),  # global queries see everything
        (g, seqlen, 0, g, FULL),  # every query sees the global keys
        *band_rows(g, seqlen, g, seqlen, g, g),
    ]
    return table(rows), {"global_len": g}


@register("longca_global_window", params=("global_len",))
def longca_global_window(seqlen, rng, global_len=None):
    """The seed paper's global sliding window, as its ranges (its FLOPs) define it.

    Two causal (bottom-right aligned) slices stand for the global part: all
    queries x the first g keys, and the first g queries x the other keys;
    plus a (g, g) band over the rest. So the global queries see no global
    key, and only the last g queries see global keys.
    """
    g = _global_len(seqlen, rng, global_len)
    rows = [
        (0, seqlen, 0, g, CAUSAL),
        (0, g, g, seqlen, CAUSAL),
        *band_rows(g, seqlen, g, seqlen, g, g),
    ]
    return table(rows), {"global_len": g}
