"""jax_backends.module.attention: the nnx layer against a float64 NumPy
composition of the same layer, across backends and a CP strategy; its
FLOP count by hand; the named settings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_backends.module.attention import (
    LcabAttention,
    module_flops,
    paper_setting,
    seed_setting,
    train_step_fn,
)
from lcab import reference
from lcab.masks import make_mask, small_mask

D_MODEL, HEADS_Q, HEADS_KV, HEAD_DIM = 32, 4, 2, 16
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


def layer(backend, mask, options=None, seed=0):
    return LcabAttention(D_MODEL, HEADS_Q, HEADS_KV, HEAD_DIM, backend=backend,
                         backend_options=options, mask=mask, dtype="float32",
                         rngs=nnx.Rngs(seed))


def inputs(seqlen, batch=2, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(2, batch, seqlen, D_MODEL))


def weights(module):
    return {name: np.asarray(getattr(module, name).kernel[...], np.float64)
            for name in PROJECTIONS}


def composed(w, x, mask, dy):
    """(y, dx, dW by name) of the same layer in float64 NumPy, by hand."""
    batch, seqlen, _ = x.shape

    def heads(a, count):
        return a.reshape(batch, seqlen, count, HEAD_DIM)

    q, k, v = (heads(x @ w[name], count) for name, count in
               (("q_proj", HEADS_Q), ("k_proj", HEADS_KV), ("v_proj", HEADS_KV)))
    out = reference.attention(q, k, v, mask)[0].reshape(batch, seqlen, -1)
    y = out @ w["out_proj"]
    dout = heads(dy @ w["out_proj"].T, HEADS_Q)
    dq, dk, dv = reference.attention_grads(q, k, v, mask, dout)

    def flat(a):  # (tokens, features): the GEMMs' view
        return a.reshape(batch * seqlen, -1)

    grads = {"out_proj": flat(out).T @ flat(dy)}
    dx = 0
    for name, d in (("q_proj", dq), ("k_proj", dk), ("v_proj", dv)):
        grads[name] = flat(x).T @ flat(d)
        dx = dx + flat(d) @ w[name].T
    return y, dx.reshape(x.shape), grads


def run_step(module, x, dy):
    y, dx, dparams = train_step_fn(module)(jnp.asarray(x, jnp.float32),
                                          jnp.asarray(dy, jnp.float32))
    grads = {name: np.asarray(dparams[name]["kernel"][...]) for name in PROJECTIONS}
    return np.asarray(y), np.asarray(dx), grads


@pytest.mark.parametrize("backend,mask_name", [
    ("jax.xla", "causal"),  # the is_causal flag
    ("jax.xla", "share_question"),  # a dense boolean mask
    ("jax.pallas_flex", "block_causal_document"),  # Pallas interpret mode on a CPU
])
def test_output_and_gradients_match_a_float64_composition(backend, mask_name):
    mask = small_mask(mask_name, 64)
    module = layer(backend, mask)
    x, dy = inputs(64)
    want_y, want_dx, want_grads = composed(weights(module), x, mask, dy)
    # The jitted step first: the attention function is built inside its trace
    # and must serve the eager call after it too (no leaked tracers).
    y, dx, grads = run_step(module, x, dy)
    np.testing.assert_allclose(y, want_y, atol=2e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(module(jnp.asarray(x, jnp.float32))), want_y,
                               atol=2e-4, rtol=0)
    np.testing.assert_allclose(dx, want_dx, atol=2e-4, rtol=0)
    for name in PROJECTIONS:
        scale = np.abs(want_grads[name]).max()
        np.testing.assert_allclose(grads[name], want_grads[name], atol=2e-5 * scale, rtol=0,
                                   err_msg=name)


@pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 JAX devices")
def test_the_ring_layer_matches_the_xla_layer_on_packed_documents():
    mask = small_mask("causal_document", 64)
    x, dy = inputs(64)
    ring = layer("jax.cp_ring", mask, {"cp_size": "2", "dispatch": "zigzag"})
    dense = layer("jax.xla", mask)
    for (name, got), want in zip(weights(ring).items(), weights(dense).values()):
        np.testing.assert_array_equal(got, want, err_msg=name)  # same seed, same params
    y_ring, dx_ring, grads_ring = run_step(ring, x, dy)
    y_xla, dx_xla, grads_xla = run_step(dense, x, dy)
    np.testing.assert_allclose(y_ring, y_xla, atol=1e-5, rtol=0)
    np.testing.assert_allclose(dx_ring, dx_xla, atol=1e-5, rtol=0)
    for name in PROJECTIONS:
        np.testing.assert_allclose(grads_ring[name], grads_xla[name], atol=1e-4, rtol=0,
                                   err_msg=name)


def test_a_backend_that_cannot_express_the_mask_raises_with_its_reason():
    # Pallas's mha states causal and documents, not windows; never run as something else.
    mask = small_mask("sliding_window_causal", 128)
    with pytest.raises(ValueError, match="jax.pallas_triton cannot run .*not expressible"):
        LcabAttention(D_MODEL, 2, 2, HEAD_DIM, backend="jax.pallas_triton", mask=mask,
                      dtype="float32", rngs=nnx.Rngs(0))


def test_a_heads_first_backend_gets_and_gives_heads_first_arrays():
    from jax_backends.module.attention import _in_bshd

    def doubles_bhsd(q, k, v):
        assert q.shape == (1, HEADS_Q, 8, HEAD_DIM) and k.shape == (1, HEADS_KV, 8, HEAD_DIM)
        return 2 * q

    q = jnp.arange(HEADS_Q * 8 * HEAD_DIM, dtype=jnp.float32).reshape(1, 8, HEADS_Q, HEAD_DIM)
    k = jnp.zeros((1, 8, HEADS_KV, HEAD_DIM))
    np.testing.assert_array_equal(_in_bshd(doubles_bhsd, "bhsd")(q, k, k), 2 * q)


def test_an_input_of_another_length_than_the_mask_is_refused():
    module = layer("jax.xla", small_mask("causal", 64))
    with pytest.raises(ValueError, match="seqlen=32 but the mask causal is 64 x 64"):
        module(jnp.zeros((1, 32, D_MODEL)))


def test_the_output_comes_in_the_compute_dtype_from_float32_parameters():
    module = LcabAttention(D_MODEL, HEADS_Q, HEADS_KV, HEAD_DIM, backend="jax.xla",
                           mask=small_mask("causal", 32), dtype="bf16", rngs=nnx.Rngs(0))
    assert module.q_proj.kernel[...].dtype == jnp.float32
    assert module(jnp.zeros((1, 32, D_MODEL))).dtype == jnp.bfloat16


def test_module_flops_by_hand():
    # batch 2, 4 tokens, d_model 8, heads 2:1 of 4; causal area 4 * 5 / 2 = 10.
    mask = make_mask("causal", 4)
    forward = module_flops(2, 4, 8, 2, 1, 4, mask, "fwd")
    # Q: 2*8*8*8 = 1024, K and V: 2*8*8*4 = 512 each, out: 2*8*8*8 = 1024 (M = 8 tokens).
    assert forward.projections == 1024 + 512 + 512 + 1024
    assert forward.attention == 4 * 2 * 2 * 4 * 10
    assert forward.total == 3072 + 640
    backward = module_flops(2, 4, 8, 2, 1, 4, mask, "bwd")
    assert (backward.projections, backward.attention) == (2 * 3072, 1600)  # 2x and 2.5x
    both = module_flops(2, 4, 8, 2, 1, 4, mask, "fwd_bwd")
    assert (both.projections, both.attention) == (3 * 3072, 2240)
    with pytest.raises(ValueError, match="direction='sideways'"):
        module_flops(2, 4, 8, 2, 1, 4, mask, "sideways")


def test_the_seed_and_paper_settings():
    seed = seed_setting(4)
    assert (seed.heads_q, seed.heads_kv, seed.head_dim, seed.d_model) == (8, 1, 128, 1024)
    assert (seed.cp_size, seed.seqlen, seed.tokens_per_rank) == (4, 32768, 8192)
    assert (seed.batch, seed.dtype) == (1, "bfloat16")
    paper = paper_setting(8)
    assert (paper.heads_q, paper.heads_kv, paper.head_dim, paper.d_model) == (64, 8, 128, 8192)
    assert (paper.seqlen, paper.tokens_per_rank) == (65536, 8192)
