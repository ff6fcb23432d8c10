"""python -m lcab.masks draws a picture of every family."""

import subprocess
import sys

import matplotlib.image
import numpy as np

from lcab.masks import MASK_NAMES
from lcab.masks.small import small_mask


def test_cli_writes_one_picture_per_family_and_a_grid(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lcab.masks", "--out", str(tmp_path), "--seqlen", "128"],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    names = {path.stem for path in tmp_path.glob("*.png")}
    assert names == {*MASK_NAMES, "masks"}
    grid = matplotlib.image.imread(tmp_path / "masks.png")
    assert grid.shape[0] > 400 and grid.shape[1] > 800
    # Pictures differ: a causal picture is not a full one.
    full = matplotlib.image.imread(tmp_path / "full.png")
    causal = matplotlib.image.imread(tmp_path / "causal.png")
    assert full.shape == causal.shape and not np.array_equal(full, causal)


def test_cli_rejects_bad_flags(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lcab.masks", "--out", str(tmp_path), "--seqlen", "4"],
        capture_output=True, text=True,
    )
    assert result.returncode != 0 and "seqlen" in result.stderr


def test_picture_masks_show_their_structure():
    for name in MASK_NAMES:
        mask = small_mask(name)
        assert mask.seqlen_q == 256 and 0 < mask.density() <= 1
        if name not in ("full", "prefix_lm_causal", "longformer_window", "causal"):
            assert mask.density() < 0.35, name  # small parameters, visible pattern
