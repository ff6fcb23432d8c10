"""Pictures of masks: see the pattern before trusting a number about it."""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lcab.masks.factory import MASK_NAMES  # noqa: E402
from lcab.masks.mask import AttnMask  # noqa: E402
from lcab.masks.small import small_mask  # noqa: E402

PICTURE_SEQLEN = 256


def _draw(ax, mask: AttnMask) -> None:
    ax.imshow(mask.to_dense(), cmap="Blues", vmin=0, vmax=1.4, interpolation="nearest")
    ax.set_title(f"{mask.name}\ndensity {mask.density():.2f}", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def draw_all(out_dir: str | pathlib.Path, seqlen: int = PICTURE_SEQLEN) -> list[pathlib.Path]:
    """One PNG per family plus masks.png with all of them; returns the paths."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    masks = [small_mask(name, seqlen) for name in MASK_NAMES]
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
