"""The full-size check's references kept on disk (lcab.reference_cache).

A process that checks a workload another process already checked reads the
reference instead of computing it, gets the very same errors, and still
catches a wrong backend; anything the reference depends on (seed, direction,
the code) names another entry; a damaged entry is computed again; the folder
stays within its bound; a folder that cannot be written costs a warning.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from lcab import fullcheck, reference_cache, registry
from lcab.experiments import canonical
from lcab.experiments import canonical_parts as defined
from lcab.masks import make_mask
from lcab.workloads import Workload

jax = pytest.importorskip("jax")

from jax_backends import reference as jax_reference
from jax_backends.kernels.xla import XlaBackend


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return ([rng.standard_normal((2, 8, 3)).astype(np.float32) for _ in range(4)],
            [rng.standard_normal((1, 5, 3)).astype(np.float32) for _ in range(2)])


def test_an_entry_reads_back_exactly(tmp_path):
    selection, sampled = _arrays()
    reference_cache.save(tmp_path, "a", selection, sampled)
    got_selection, got_sampled = reference_cache.load(tmp_path, "a")
    assert len(got_selection) == 4 and len(got_sampled) == 2
    for got, want in zip(got_selection + got_sampled, selection + sampled):
        np.testing.assert_array_equal(got, want)
    assert reference_cache.load(tmp_path, "b") is None
    assert not list(tmp_path.glob("*.tmp"))  # written whole, then renamed


def test_a_forward_entry_has_no_gradients_and_no_sampled_rows(tmp_path):
    out = np.ones((1, 4, 2), dtype=np.float32)
    reference_cache.save(tmp_path, "fwd", [out], [])
    selection, sampled = reference_cache.load(tmp_path, "fwd")
    assert len(selection) == 1 and sampled == []


def test_the_name_changes_with_every_input_and_the_code(tmp_path):
    code = tmp_path / "reference.py"
    code.write_text("x = 1\n")
    base = reference_cache.entry_name(("key", True, "jax"), [code])
    assert base == reference_cache.entry_name(("key", True, "jax"), [code])
    assert base != reference_cache.entry_name(("key", False, "jax"), [code])
    assert base != reference_cache.entry_name(("key", True, "torch"), [code])
    code.write_text("x = 2\n")
    assert base != reference_cache.entry_name(("key", True, "jax"), [code])


def test_a_damaged_entry_is_a_miss_and_goes(tmp_path):
    (tmp_path / f"bad{reference_cache.SUFFIX}").write_bytes(b"not a zip")
    with pytest.warns(UserWarning, match="unreadable"):
        assert reference_cache.load(tmp_path, "bad") is None
    assert not (tmp_path / f"bad{reference_cache.SUFFIX}").exists()


def test_the_folder_keeps_its_bound_dropping_the_oldest(tmp_path):
    selection, sampled = _arrays()
    for index, name in enumerate(("old", "middle", "new")):
        reference_cache.save(tmp_path, name, selection, sampled)
        stamp = time.time() - 100 + index
        os.utime(tmp_path / f"{name}{reference_cache.SUFFIX}", (stamp, stamp))
    size = (tmp_path / f"new{reference_cache.SUFFIX}").stat().st_size
    removed = reference_cache.evict(tmp_path, keep="old", max_bytes=2 * size)
    # "old" is the oldest but was just written: the next oldest goes instead.
    assert removed == ["middle"]
    assert sorted(p.stem for p in tmp_path.glob("*.npz")) == ["new", "old"]
    assert reference_cache.evict(tmp_path, keep="new", max_bytes=0) == ["old"]


def test_a_folder_it_cannot_write_costs_a_warning(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    selection, sampled = _arrays()
    with pytest.warns(UserWarning, match="could not write"):
        reference_cache.save(blocked, "a", selection, sampled)


# --- Through the runtime's full check (JAX on the CPU) ----------------------

def _workload(seqlen=1024):
    return Workload(batch=2, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=8, heads_kv=4,
                    head_dim=32, dtype="float32",
                    mask=make_mask("causal_document", seqlen, seed=0))


@pytest.fixture
def counted(monkeypatch):
    """How often the JAX reference's attention runs."""
    calls = []
    original = jax_reference.attention

    def attention(*args, **kwargs):
        calls.append(kwargs.get("chunks") is None)
        return original(*args, **kwargs)

    monkeypatch.setattr(jax_reference, "attention", attention)
    return calls


def _fresh_runtime():
    """A runtime with nothing kept in memory, as in another process."""
    runtime = registry.load_runtime("jax")
    runtime._kept_reference = None
    return runtime


def test_a_second_process_reads_the_reference_and_gets_the_same_errors(tmp_path, counted):
    w = _workload()
    backend = XlaBackend()
    plan = fullcheck.plan(w)
    first = _fresh_runtime().full_check(backend.build(w), backend.layout, plan, True,
                                        cache_dir=str(tmp_path))
    assert counted and len(list(tmp_path.glob("*.npz"))) == 1
    computed = len(counted)
    second = _fresh_runtime().full_check(backend.build(w), backend.layout, plan, True,
                                         cache_dir=str(tmp_path))
    assert len(counted) == computed  # read, not computed
    assert second == first and max(first.values()) < 1e-4

    right = backend.build(w)

    def wrong(q, k, v):  # the last query row of every sequence, wrong
        out = right(q, k, v)
        return out.at[:, -1].multiply(1.5)

    errors = _fresh_runtime().full_check(wrong, backend.layout, plan, False,
                                         cache_dir=str(tmp_path))
    assert errors["out"] > 0.05
    # The forward-only reference is its own entry.
    assert len(list(tmp_path.glob("*.npz"))) == 2


def test_another_seed_is_another_entry(tmp_path, counted):
    w = _workload(512)
    backend = XlaBackend()
    for seed in (0, 1):
        plan = fullcheck.plan(w, seed=seed)
        _fresh_runtime().full_check(backend.build(w), backend.layout, plan, True,
                                    cache_dir=str(tmp_path))
    assert len(list(tmp_path.glob("*.npz"))) == 2


def test_without_a_folder_nothing_is_written(tmp_path, counted):
    w = _workload(512)
    backend = XlaBackend()
    plan = fullcheck.plan(w)
    for _ in range(2):
        _fresh_runtime().full_check(backend.build(w), backend.layout, plan, True)
    assert counted.count(True) == 2 and not list(tmp_path.iterdir())


def test_the_canonical_parts_share_one_folder():
    part = defined.parts("cp")[0]
    text = canonical.launch_of(part.runs[0], defined.ROOT / "out", "c0ffee", [], ["0"]).text()
    assert f"--reference_cache={reference_cache.DEFAULT_DIR}" in text


def test_the_torch_runtime_reads_its_own_entries(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from torch_backends import reference as torch_reference

    calls = []
    original = torch_reference.attention
    monkeypatch.setattr(torch_reference, "attention",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    runtime = registry.load_runtime("torch")
    backend = registry.load_backend("torch.sdpa_math", {})
    w = Workload(batch=1, seqlen_q=1500, seqlen_k=1500, heads_q=4, heads_kv=2, head_dim=32,
                 dtype="float32", mask=make_mask("sliding_window_causal", 1500, window=200))
    plan = fullcheck.plan(w)
    runs = []
    for _ in range(2):
        runtime._kept_reference = None
        runs.append(runtime.full_check(backend.build(w), backend.layout, plan, True,
                                       cache_dir=str(tmp_path)))
    assert runs[0] == runs[1] and max(runs[0].values()) < 1e-4
    assert len(calls) == 1  # the selection is whole here: one call, by the first run
    # jax's entry of the same check would be another: the framework is in the name.
    assert len(list(tmp_path.glob("*.npz"))) == 1


def test_a_reference_computed_across_processes_is_not_cached(tmp_path, monkeypatch):
    # One process reading it while another computes it would leave the other waiting.
    from jax_backends import distributed

    runtime = _fresh_runtime()
    assert runtime.reference_is_local
    monkeypatch.setattr(distributed, "multi_process", lambda: True)
    assert not runtime.reference_is_local
    # The rest of the check runs as one process; only the cache's rule says otherwise.
    monkeypatch.setattr(distributed, "multi_process", lambda: False)
    monkeypatch.setattr(type(runtime), "reference_is_local", property(lambda self: False))
    w = _workload(512)
    backend = XlaBackend()
    runtime.full_check(backend.build(w), backend.layout, fullcheck.plan(w), True,
                       cache_dir=str(tmp_path))
    assert not list(tmp_path.iterdir())


def test_a_cp_strategy_on_several_devices_reads_it_too(tmp_path, counted):
    # The strategy's answer is spread over a mesh; the entry comes back on
    # one device, as the reference computed here does.
    w = _workload(1024)
    backend = registry.load_backend("jax.cp_groupcast", {"cp_size": "2",
                                                         "dispatch": "balanced"})
    plan = fullcheck.plan(w)
    runs = [_fresh_runtime().full_check(backend.build(w), backend.layout, plan, True,
                                        cache_dir=str(tmp_path)) for _ in range(2)]
    assert runs[0] == runs[1] and max(runs[0].values()) < 1e-4
    assert counted.count(True) == 1
