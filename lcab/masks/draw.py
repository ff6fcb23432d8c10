"""Pictures of masks: see the pattern before trusting a number about it."""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lcab.masks.factory import MASK_NAMES, make_mask  # noqa: E402
from lcab.masks.mask import AttnMask  # noqa: E402

PICTURE_SEQLEN = 256
_DOC_FRACTIONS = (40, 72, 24, 56, 64)  # out of 256
# Small, explicit parameters (at 256 tokens; scaled with the picture's size)
# so each family's structure shows.
PICTURE_PARAMS: dict[str, dict] = {
    "sliding_window": {"window": 24},
    "sliding_window_causal": {"window": 24},
    "global_sliding_window": {"global_len": 20},
    "full_document": {"doc_lens": _DOC_FRACTIONS},
    "causal_document": {"doc_lens": _DOC_FRACTIONS},
    "block_causal_document": {"doc_lens": _DOC_FRACTIONS, "block_size": 16},
    "share_question": {"doc_lens": _DOC_FRACTIONS},
    "causal_blockwise": {"doc_lens": _DOC_FRACTIONS},
    "prefix_lm_causal": {"prefix_len": 64},
    "prefix_lm_document": {"doc_lens": _DOC_FRACTIONS, "prefix_len": 16},
    "block_sparse": {"block_size": 16, "keep": 0.25},
    "var_block_sparse": {"block_size": 24, "keep": 0.25},
}


def _scaled(params: dict, seqlen: int) -> dict:
    scale = seqlen / PICTURE_SEQLEN
    out = {}
    for key, value in params.items():
        if key == "doc_lens":
            lens = [max(1, round(x * scale)) for x in value[:-1]]
            out[key] = [*lens, seqlen - sum(lens)]
        elif key == "keep":
            out[key] = value
        else:
            out[key] = max(1, round(value * scale))
    return out


def picture_mask(name: str, seqlen: int = PICTURE_SEQLEN) -> AttnMask:
    return make_mask(name, seqlen, **_scaled(PICTURE_PARAMS.get(name, {}), seqlen))


def _draw(ax, mask: AttnMask) -> None:
    ax.imshow(mask.to_dense(), cmap="Blues", vmin=0, vmax=1.4, interpolation="nearest")
    ax.set_title(f"{mask.name}\ndensity {mask.density():.2f}", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def draw_all(out_dir: str | pathlib.Path, seqlen: int = PICTURE_SEQLEN) -> list[pathlib.Path]:
    """One PNG per family plus masks.png with all of them; returns the paths."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    masks = [picture_mask(name, seqlen) for name in MASK_NAMES]
    written = []
    for mask in masks:
        fig, ax = plt.subplots(figsize=(3, 3.3))
        _draw(ax, mask)
        ax.set_xlabel("key", fontsize=8)
        ax.set_ylabel("query", fontsize=8)
        path = out_dir / f"{mask.name}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    cols = 5
    rows = -(-len(masks) // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(cols * 2.4, rows * 2.8), layout="constrained"
    )
    for ax in axes.flat:
        ax.axis("off")
    for ax, mask in zip(axes.flat, masks):
        ax.axis("on")
        _draw(ax, mask)
    fig.suptitle(f"LCAB mask families at {seqlen} tokens (query down, key across)")
    path = out_dir / "masks.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written
