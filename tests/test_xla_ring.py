"""jax.xla's ring kernel (jax_backends/kernels/xla_ring.py) as a ring uses it:
each K/V block attended on its own, the blocks merged by log-sum-exp, and
each block's gradients taken from the rows' final out and lse, against the
float64 reference; its dense-mask limit and its place in the protocol."""

import jax.numpy as jnp
import numpy as np
import pytest

from jax_backends.kernels import xla
from jax_backends.kernels.ring_kernel import RingKernel
from jax_backends.kernels.xla_ring import DenseRing
from lcab import expressions, reference
from lcab.cp.submask import sub_mask
from lcab.masks import AttnMask, AttnSlice, small_mask
from lcab.workloads import Workload

SEQLEN, BLOCKS = 64, 2


def inputs(heads=(4, 2), head_dim=16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(1, SEQLEN, heads[0], head_dim))
    k, v = (rng.normal(size=(1, SEQLEN, heads[1], head_dim)) for _ in range(2))
    dout = rng.normal(size=q.shape)
    return [x.astype(np.float32) for x in (q, k, v, dout)]


def ring(mask):
    """(out, lse, dq, dk, dv) from the kernel, one K/V block at a time."""
    kernel = DenseRing()
    q, k, v, dout = inputs()
    size = SEQLEN // BLOCKS
    blocks = [(i * size, (i + 1) * size) for i in range(BLOCKS)]
    workload = Workload(1, SEQLEN, SEQLEN, 4, 2, 16, "float32", mask)
    kernel, tables = kernel.bind([sub_mask(mask, [(0, SEQLEN)], [b]) for b in blocks], workload)
    assert tables.shape == (BLOCKS, SEQLEN, size) and tables.dtype == bool
    parts = [kernel.attend(q, k[:, a:b], v[:, a:b], tables[i]) for i, (a, b) in enumerate(blocks)]
    lse = np.logaddexp.reduce([np.asarray(part_lse) for _, part_lse in parts], axis=0)
    seen = np.where(np.isfinite(lse), lse, 0.0)
    out = sum(np.asarray(part_out) * np.exp(np.asarray(part_lse) - seen).transpose(0, 2, 1)[..., None]
              for part_out, part_lse in parts)
    out, lse = jnp.asarray(out, jnp.float32), jnp.asarray(lse, jnp.float32)
    grads = [kernel.gradients(q, k[:, a:b], v[:, a:b], out, lse, dout, tables[i])
             for i, (a, b) in enumerate(blocks)]
    dq = sum(np.asarray(g[0]) for g in grads)
    dk, dv = (np.concatenate([np.asarray(g[n]) for g in grads], axis=1) for n in (1, 2))
    return np.asarray(out), np.asarray(lse), dq, dk, dv


@pytest.mark.parametrize("mask", [
    small_mask("causal", SEQLEN), small_mask("share_question", SEQLEN),
    # Rows 32-63 see no key: out 0, lse -inf, no gradient.
    AttnMask(SEQLEN, SEQLEN, [AttnSlice(0, 32, 0, 32, "causal"), AttnSlice(0, 32, 32, 64)]),
], ids=["causal", "share_question", "rows_that_see_nothing"])
def test_blocks_merged_by_lse_match_the_reference(mask):
    q, k, v, dout = inputs()
    out, lse, dq, dk, dv = ring(mask)
    want_out, want_lse = reference.attention(q, k, v, mask)
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(want_lse))
    np.testing.assert_allclose(lse[np.isfinite(lse)], want_lse[np.isfinite(want_lse)], atol=2e-5)
    for got, want in zip((dq, dk, dv), reference.attention_grads(q, k, v, mask, dout)):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_the_dense_ring_kernel_is_a_ring_kernel_built_per_rank():
    kernel = xla.XlaBackend().ring_kernel()
    assert isinstance(kernel, DenseRing) and isinstance(kernel, RingKernel)
    assert kernel.how.startswith("dense boolean mask per rank and step (O(S^2/cp^2)")
    assert kernel.from_tables is False  # all-gather and Ulysses build each rank's own


def test_the_dense_ring_kernel_honours_the_dense_mask_limit(monkeypatch):
    # cp 2 at 64 tokens: 32 x 32 cells a step, two steps a rank.
    steps = [small_mask("causal", 32), small_mask("full", 32)]
    assert DenseRing().problem(steps) is None
    monkeypatch.setattr(expressions, "DENSE_MASK_CELLS", 1500)
    assert DenseRing().problem(steps) == (
        "the dense ring kernel of inner jax.xla holds 2 step masks of 32 x 32 per rank, "
        "over 1500 cells")
