"""jax.module (the module-level benchmark): a dispatched layer computes the
natural-order layer's values in the dispatch order, its training step's
gradients match, and the CLI writes rows that count the whole layer."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_backends.module.attention import module_flops
from jax_backends.module.backend import ModuleBackend
from lcab import registry, results
from lcab.masks import make_mask, small_mask
from lcab.workloads import Workload
from tests.row_checks import measured_or_noisy


def module_function(inner, mask, options=None, heads=(4, 2), head_dim=16):
    backend = registry.load_backend("jax.module", {"inner": inner, **(options or {})})
    workload = Workload(2, mask.seqlen_q, mask.seqlen_k, *heads, head_dim, "float32", mask)
    return backend, workload, backend.build(workload)


@pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 JAX devices")
def test_the_dispatched_ring_layer_is_the_natural_layer_in_dispatch_order():
    mask = small_mask("causal_document", 64)
    _, _, ring = module_function("jax.cp_ring", mask, {"cp_size": "2", "dispatch": "balanced"})
    _, _, xla = module_function("jax.xla", mask)
    x_ring, params, dy_ring = ring.timed_inputs([None] * 4)
    x, params_xla, dy = xla.timed_inputs([None] * 4)
    order = np.asarray(ring.layer().attention.built(2, 64).order)
    np.testing.assert_array_equal(np.asarray(x_ring), np.asarray(x)[:, order])
    y_ring, dx_ring, dparams_ring = jax.jit(ring.timed_fwd_bwd)(x_ring, params, dy_ring)
    y, dx, dparams = jax.jit(xla.timed_fwd_bwd)(x, params_xla, dy)
    np.testing.assert_allclose(np.asarray(y_ring), np.asarray(y)[:, order], atol=2e-5)
    np.testing.assert_allclose(np.asarray(dx_ring), np.asarray(dx)[:, order], atol=2e-5)
    for got, want in zip(jax.tree.leaves(dparams_ring), jax.tree.leaves(dparams)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)
    # Called, the function is the inner attention the correctness gate checks.
    q = jnp.ones((2, 64, 4, 16))
    k = v = jnp.ones((2, 64, 2, 16))
    assert ring(q, k, v).shape == (2, 64, 4, 16)


def test_flops_support_and_strategy_come_from_the_layer_and_its_inner_backend():
    mask = make_mask("causal", 256)
    backend, workload, _ = module_function("jax.xla", mask, {"d_model": "96"})
    assert backend.flops(workload, "bwd") == module_flops(2, 256, 96, 4, 2, 16, mask,
                                                          "bwd").total
    support = backend.supports(workload)
    assert support.ok and "module d_model 96: projections around inner jax.xla" in support.how
    assert backend.strategy == "jax.xla" and backend.cp_size == 1
    assert backend.layout == registry.load_backend("jax.xla").layout


@pytest.mark.parametrize("options, message", [
    ({"inner": "torch.flex"}, "must be a JAX kernel or CP backend"),
    ({"inner": "jax.xla", "cp_size": "2"}, "cp_size apply to a CP strategy"),
    ({"inner": "jax.xla", "d_model": "-1"}, "d_model=-1 must be >= 0"),
])
def test_bad_options_say_what_is_wrong(options, message):
    cls = registry.all_backends()["jax.module"].load()
    with pytest.raises(ValueError, match=message):
        cls(**cls.parse_options(options))


def test_the_cli_times_the_layer_and_counts_its_flops(tmp_path):
    command = [sys.executable, "-m", "lcab.experiments", "--suite=module", "--framework=jax",
               "--backends=jax.module", "--backend_options=jax.module:inner=jax.cp_allgather",
               "--cp_size=2", "--dispatch=zigzag", "--masks=causal,causal_document",
               "--seqlens=256", "--heads=4:2", "--head_dim=16", "--dtype=float32",
               "--warmup=1", "--iters=5", f"--out={tmp_path}", "--noprogress", "--nosummary",
               "--git_commit=test"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = results.read_rows([tmp_path / "module_jax.jsonl"])
    assert len(rows) == 4
    for row in rows:
        assert measured_or_noisy(row), row["reason"]
        assert row["max_err"] < 1e-4 and row["cp_size"] == 2 and row["strategy"] == "allgather"
        mask = make_mask(row["mask"], 256, **{k: v for k, v in row["mask_params"].items()
                                               if k != "seed"})
        assert row["flops"] == module_flops(1, 256, 64, 4, 2, 16, mask, row["direction"]).total
        assert "projections around inner jax.cp_allgather" in row["notes"]
        assert ["jax.module", "cp_size", "2"] in json.loads(row["flags"])["backend_options"]
    assert ModuleBackend.suite == "module"


def test_an_unavailable_inner_backend_makes_the_module_unavailable():
    try:
        registry.load_backend("jax.cudnn")
    except registry.Unavailable as exc:
        reason = str(exc)
    else:
        pytest.skip("jax.cudnn runs here")
    with pytest.raises(registry.Unavailable) as raised:
        registry.load_backend("jax.module", {"inner": "jax.cudnn"})
    assert reason in str(raised.value)
    # Constructing alone (the CLI's option check) loads nothing.
    cls = registry.all_backends()["jax.module"].load()
    assert cls(inner="jax.cudnn")._inner is None
