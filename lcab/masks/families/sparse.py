"""Block-sparse masks: per q block, a random top-k choice of kv blocks.

As in the seed paper (LongCA-bench, with MagiAttention's pattern
generators): every q block keeps k = max(1, int(keep * n_kv_blocks)) kv
blocks, the top k of uniform random scores. Kept tiles are full; runs of
adjacent kept kv blocks merge into one slice.
"""

import numpy as np

from lcab.masks.families.base import check_positive, register
from lcab.masks.slices import FULL

DEFAULT_BLOCK = 128
DEFAULT_AVG_BLOCK = 512
DEFAULT_MIN_BLOCK = 128  # the paper's smallest variable block
DEFAULT_KEEP = 0.2
# How many kv blocks a q block keeps: int(keep * n) as the paper, or
# round(keep * n) as LCAB before 2026-11-27 (kept so its rows rebuild).
ROUNDINGS = {"floor": int, "nearest": round}
# Variable block sizes: the paper's random partition, or LCAB's earlier
# sizes uniform in [b/2, 3b/2] (kept so its rows rebuild).
SIZINGS = ("partition", "uniform")


def _check_keep(keep) -> float:
    keep = float(keep)
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep={keep} must be in (0, 1]: the kept fraction of kv blocks")
    return keep


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value


def _topk_tiles(q_edges, k_edges, keep, rng, rounding="floor") -> np.ndarray:
    """Slice table keeping int(keep * n_k) kv blocks (at least 1) per q block."""
    n_q, n_k = len(q_edges) - 1, len(k_edges) - 1
    k = min(max(1, ROUNDINGS[rounding](keep * n_k)), n_k)
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


def _uniform_sizes_edges(seqlen, avg, rng):
    """LCAB's earlier variable blocks: sizes uniform in [avg/2, 3*avg/2], the last clipped."""
    low, high = max(1, avg // 2), max(1, avg // 2) + avg
    sizes = rng.integers(low, high + 1, size=seqlen // low + 2)
    edges = np.concatenate([[0], np.cumsum(sizes)])
    cut = int(np.searchsorted(edges, seqlen))
    edges = edges[: cut + 1].copy()
    edges[-1] = seqlen
    return edges


def _variable_edges(seqlen, n_blocks, min_block, rng):
    """n_blocks blocks of at least min_block tokens covering seqlen: the
    tokens beyond n_blocks * min_block are split at n_blocks - 1 uniform
    random cut points (the paper's random partition)."""
    extra = seqlen - n_blocks * min_block
    cuts = np.sort(rng.integers(0, extra, size=n_blocks - 1, endpoint=True))
    sizes = np.diff(np.concatenate([[0], cuts, [extra]])) + min_block
    return np.concatenate([[0], np.cumsum(sizes)])


@register("block_sparse", params=("block_size", "keep", "rounding"))
def block_sparse(seqlen, rng, block_size=DEFAULT_BLOCK, keep=DEFAULT_KEEP, rounding="floor"):
    """Uniform block-sparse: per q block keep a fraction of kv blocks (top-k of random scores)."""
    block = check_positive("block_size", block_size)
    keep = _check_keep(keep)
    _check_choice("rounding", rounding, tuple(ROUNDINGS))
    edges = _uniform_edges(seqlen, block)
    params = {"block_size": block, "keep": keep, "rounding": rounding}
    return _topk_tiles(edges, edges, keep, rng, rounding), params


@register("var_block_sparse", params=("block_size", "keep", "min_block", "sizes", "rounding"))
def var_block_sparse(seqlen, rng, block_size=DEFAULT_AVG_BLOCK, keep=DEFAULT_KEEP,
                     min_block=DEFAULT_MIN_BLOCK, sizes="partition", rounding="floor"):
    """Block-sparse with variable blocks: S // block_size blocks of random size >= min_block."""
    avg = check_positive("block_size", block_size)
    keep = _check_keep(keep)
    _check_choice("sizes", sizes, SIZINGS)
    _check_choice("rounding", rounding, tuple(ROUNDINGS))
    params = {"block_size": avg, "keep": keep, "sizes": sizes, "rounding": rounding}
    if sizes == "uniform":
        q_edges = _uniform_sizes_edges(seqlen, avg, rng)
        k_edges = _uniform_sizes_edges(seqlen, avg, rng)
        return _topk_tiles(q_edges, k_edges, keep, rng, rounding), params
    least = check_positive("min_block", min_block)
    n_blocks = max(1, seqlen // avg)
    if n_blocks * least > seqlen:
        raise ValueError(
            f"var_block_sparse: {n_blocks} blocks of at least min_block={least} do not fit "
            f"seqlen={seqlen}; choose min_block <= {seqlen // n_blocks}")
    q_edges = _variable_edges(seqlen, n_blocks, least, rng)
    k_edges = _variable_edges(seqlen, n_blocks, least, rng)
    return _topk_tiles(q_edges, k_edges, keep, rng, rounding), {**params, "min_block": least}
