"""The float64 reference against an independent loop and finite differences."""

import math

import numpy as np
import pytest

from lcab import reference
from lcab.masks import AttnMask, AttnSlice, make_mask


def loop_attention(q, k, v, visible, scale):
    """Attention one query row at a time, in plain Python arithmetic."""
    b, sq, hq, d = q.shape
    hkv = k.shape[2]
    out = np.zeros_like(q)
    lse = np.full((b, hq, sq), -np.inf)
    for bi in range(b):
        for h in range(hq):
            kv = h // (hq // hkv)
            for i in range(sq):
                keys = [j for j in range(k.shape[1]) if visible[i, j]]
                if not keys:
                    continue
                scores = [scale * float(np.dot(q[bi, i, h], k[bi, j, kv])) for j in keys]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                lse[bi, h, i] = top + math.log(total)
                for w, j in zip(weights, keys):
                    out[bi, i, h] += w / total * v[bi, j, kv]
    return out, lse


def random_qkv(rng, b=2, sq=24, sk=24, hq=4, hkv=2, d=8):
    return (
        rng.standard_normal((b, sq, hq, d)),
        rng.standard_normal((b, sk, hkv, d)),
        rng.standard_normal((b, sk, hkv, d)),
    )


MASKS = {
    "causal": lambda: make_mask("causal", 24),
    "documents": lambda: make_mask("causal_document", 24, doc_lens=[5, 11, 8]),
    "window": lambda: make_mask("sliding_window", 24, window=3),
    "share_question": lambda: make_mask("share_question", 24, doc_lens=[6, 9, 9]),
    "block_sparse": lambda: make_mask("block_sparse", 24, block_size=4, keep=0.3, seed=3),
    # Rows 10..13 see nothing at all.
    "empty_rows": lambda: AttnMask(
        24, 24, [AttnSlice(0, 10, 0, 24, "full"), AttnSlice(14, 24, 0, 24, "causal")]
    ),
}


@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_attention_matches_an_independent_loop(mask_name, heads):
    rng = np.random.default_rng(0)
    q, k, v = random_qkv(rng, hq=heads[0], hkv=heads[1])
    mask = MASKS[mask_name]()
    out, lse = reference.attention(q, k, v, mask)
    expected_out, expected_lse = loop_attention(q, k, v, mask.to_dense(), 1 / math.sqrt(8))
    np.testing.assert_allclose(out, expected_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=1e-12)


def test_rows_that_see_nothing_give_zero_and_minus_infinity():
    rng = np.random.default_rng(1)
    q, k, v = random_qkv(rng)
    out, lse = reference.attention(q, k, v, MASKS["empty_rows"]())
    assert np.all(out[:, 10:14] == 0)
    assert np.all(np.isneginf(lse[:, :, 10:14]))
    assert np.all(np.isfinite(lse[:, :, :10])) and np.all(np.isfinite(out))
    dq, dk, dv = reference.attention_grads(q, k, v, MASKS["empty_rows"](), np.ones_like(q))
    assert np.all(dq[:, 10:14] == 0) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


def test_scale_and_rectangular_masks():
    rng = np.random.default_rng(2)
    q, k, v = random_qkv(rng, sq=6, sk=10)
    mask = AttnMask(6, 10, [AttnSlice(0, 6, 0, 10, "causal")])  # bottom-right aligned
    out, lse = reference.attention(q, k, v, mask, scale=0.3)
    expected_out, expected_lse = loop_attention(q, k, v, mask.to_dense(), 0.3)
    np.testing.assert_allclose(out, expected_out, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, atol=1e-12)


@pytest.mark.parametrize("mask_name", ["causal", "documents", "share_question", "empty_rows"])
def test_gradients_match_finite_differences(mask_name):
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, b=1, sq=24, sk=24, hq=4, hkv=2, d=4)
    mask = MASKS[mask_name]()
    dout = rng.standard_normal(q.shape)
    grads = reference.attention_grads(q, k, v, mask, dout)

    def loss(q_, k_, v_):
        return float(np.sum(reference.attention(q_, k_, v_, mask)[0] * dout))

    eps = 1e-6
    for which, grad in enumerate(grads):
        args = [q, k, v]
        flat = args[which].reshape(-1)
        for index in rng.choice(flat.size, size=25, replace=False):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[which].reshape(-1)[index] += eps
            minus[which].reshape(-1)[index] -= eps
            numeric = (loss(*plus) - loss(*minus)) / (2 * eps)
            assert grad.reshape(-1)[index] == pytest.approx(numeric, rel=1e-5, abs=1e-7)


def test_shape_errors():
    rng = np.random.default_rng(4)
    q, k, v = random_qkv(rng, hq=3, hkv=2)
    with pytest.raises(ValueError, match="heads_q=3 is not a multiple of heads_kv=2"):
        reference.attention(q, k, v, make_mask("causal", 24))
    q, k, v = random_qkv(rng)
    with pytest.raises(ValueError, match="mask is 16 x 16"):
        reference.attention(q, k, v, make_mask("causal", 16))
