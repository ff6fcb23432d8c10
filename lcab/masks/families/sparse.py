"""Block-sparse masks: per q block, a random top-k choice of kv blocks.

Kept tiles are full; runs of adjacent kept kv blocks merge into one slice.
"""

import numpy as np

from lcab.masks.families.base import check_positive, register
from lcab.masks.slices import FULL

DEFAULT_BLOCK = 128
DEFAULT_AVG_BLOCK = 512
DEFAULT_KEEP = 0.2


def _check_keep(keep) -> float:
    keep = float(keep)
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep={keep} must be in (0, 1]")
    return keep


def _topk_tiles(q_edges, k_edges, keep, rng) -> np.ndarray:
    """Slice table keeping round(keep * n_k) kv blocks (at least 1) per q block."""
    n_q, n_k = len(q_edges) - 1, len(k_edges) - 1
    k = max(1, int(round(keep * n_k)))
    scores = rng.random((n_q, n_k))
    chosen = np.zeros((n_q, n_k), dtype=bool)
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    np.put_along_axis(chosen, top, True, axis=1)
    # Merge runs of kept blocks along each q block's row.
    padded = np.pad(chosen, ((0, 0), (1, 1)))
    change = np.diff(padded.astype(np.int8), axis=1)
    q_idx, run_start = np.nonzero(change == 1)
    _, run_stop = np.nonzero(change == -1)
    return np.stack(
        [
            q_edges[q_idx],
            q_edges[q_idx + 1],
            k_edges[run_start],
            k_edges[run_stop],
            np.full(len(q_idx), FULL),
        ],
        axis=1,
    ).astype(np.int64)


def _uniform_edges(seqlen, block):
    return np.minimum(np.arange(0, seqlen + block, block), seqlen)[: -(-seqlen // block) + 1]


def _variable_edges(seqlen, avg, rng):
    """Block sizes uniform in [avg/2, 3*avg/2], the last one clipped."""
    low, high = max(1, avg // 2), max(1, avg // 2) + avg
    sizes = rng.integers(low, high + 1, size=seqlen // low + 2)
    edges = np.concatenate([[0], np.cumsum(sizes)])
    cut = int(np.searchsorted(edges, seqlen))
    edges = edges[: cut + 1].copy()
    edges[-1] = seqlen
    return edges


@register("block_sparse", params=("block_size", "keep"))
def block_sparse(seqlen, rng, block_size=DEFAULT_BLOCK, keep=DEFAULT_KEEP):
    """Uniform block-sparse: per q block keep a fraction of kv blocks (top-k of random scores)."""
    block = check_positive("block_size", block_size)
    keep = _check_keep(keep)
    edges = _uniform_edges(seqlen, block)
    return _topk_tiles(edges, edges, keep, rng), {"block_size": block, "keep": keep}


@register("var_block_sparse", params=("block_size", "keep"))
def var_block_sparse(seqlen, rng, block_size=DEFAULT_AVG_BLOCK, keep=DEFAULT_KEEP):
    """Block-sparse with variable block sizes (block_size is the average)."""
    avg = check_positive("block_size", block_size)
    keep = _check_keep(keep)
    q_edges = _variable_edges(seqlen, avg, rng)
    k_edges = _variable_edges(seqlen, avg, rng)
    return _topk_tiles(q_edges, k_edges, keep, rng), {"block_size": avg, "keep": keep}
