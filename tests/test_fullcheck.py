"""The full-size check (lcab.fullcheck) catches faults the small probe cannot.

Each deliberately wrong backend below is jax.xla (right everywhere) with one
fault that shows only at the timed size or only in part of the output: a
dropped 128 x 128 tile at 4k, a window edge shifted by one, a wrong last
K/V group, a wrong second batch row, wrong rows past 2k tokens, a NaN only
at the timed length, a dK wrong only in the last K/V head. Each is run
through the runtime's full check at 4k tokens on a CPU and must fail it;
jax.xla itself must pass. The torch reference is held to the same.

A second set of faults hides from the selection (first and last batch row
and GQA group): a wrong middle batch row, wrong middle K/V heads, a NaN in
a middle head, a dQ wrong in a middle head, a NaN in a middle head's dK.
The sampled rows (every batch row and head) or the rule that no value may
be non-finite must catch each, in jax and in a NumPy plugin.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from lcab import fullcheck, registry, results
from lcab import reference as numpy_reference
from lcab.masks import MASK_NAMES, AttnMask, AttnSlice, make_mask
from lcab.numpy_runtime import NumpyRuntime, _DenseReference
from lcab.runner import Case, Settings, run_cases
from lcab.workloads import Workload

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax_backends import reference as jax_reference
from jax_backends.kernels.xla import XlaBackend

SEQLEN = 4096
TILE = 128


def workload(mask=None, seqlen=SEQLEN, batch=2, heads=(8, 4), dtype="float32", head_dim=32):
    mask = mask or make_mask("causal", seqlen)
    return Workload(batch=batch, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=heads[0],
                    heads_kv=heads[1], head_dim=head_dim, dtype=dtype, mask=mask)


def causal_without_tile(seqlen: int, row: int, col: int) -> AttnMask:
    """The causal mask with the (row, col) tile of TILE x TILE hidden."""
    r0, r1, c0, c1 = row * TILE, (row + 1) * TILE, col * TILE, (col + 1) * TILE
    assert c1 <= r0, "a tile below the diagonal"
    slices = [AttnSlice(0, r0, 0, r0, "causal"),
              AttnSlice(r0, r1, 0, c0), AttnSlice(r0, r1, c1, r1, "causal"),
              AttnSlice(r1, seqlen, 0, c0), AttnSlice(r1, seqlen, c1, seqlen)]
    # Rows from r1 on see [0, c0) and [c1, row]: split the second part.
    slices[-1:] = [AttnSlice(r1, seqlen, c1, r1), AttnSlice(r1, seqlen, r1, seqlen, "causal")]
    return AttnMask(seqlen, seqlen, slices)


class Faulty(XlaBackend):
    """jax.xla with a fault: `mask_for` runs another mask, `damage` edits out."""

    name = "jax.test_faulty"
    fault = None

    def mask_for(self, workload):
        return workload.mask

    def damage(self, out, seqlen):
        return out

    def build(self, workload):
        right = super().build(dataclasses.replace(workload, mask=self.mask_for(workload)))
        return lambda q, k, v: self.damage(right(q, k, v), workload.seqlen_q)


class DroppedTile(Faulty):
    def mask_for(self, workload):
        if workload.seqlen_q < SEQLEN:
            return workload.mask
        return causal_without_tile(workload.seqlen_q, 20, 5)


class ShiftedWindowEdge(Faulty):
    def mask_for(self, workload):
        window = workload.mask.params["window"]
        return make_mask("sliding_window_causal", workload.seqlen_q, window=window + 1)


class WrongLastGroup(Faulty):
    def damage(self, out, seqlen):
        return out.at[:, :, -2:].multiply(1.1)  # heads 6, 7: the last group of 8:4


class WrongSecondBatchRow(Faulty):
    def damage(self, out, seqlen):
        return out.at[1].multiply(1.1)


class WrongPast2k(Faulty):
    def damage(self, out, seqlen):
        return out.at[:, 2048:].multiply(1.1)


class NanAtTimedSize(Faulty):
    def damage(self, out, seqlen):
        return out.at[0, seqlen - 1, 0, 0].set(jnp.nan) if seqlen == SEQLEN else out


@jax.custom_vjp
def _wrong_last_dk(k):
    return k


_wrong_last_dk.defvjp(lambda k: (k, None), lambda _, g: (g.at[:, :, -1].multiply(1.2),))


class WrongLastDk(Faulty):
    """dK wrong in the last K/V head, from 2k tokens on (the probe is right)."""

    def build(self, workload):
        right = XlaBackend.build(self, workload)
        if workload.seqlen_q < 2048:
            return right
        return lambda q, k, v: right(q, _wrong_last_dk(k), v)


def check(backend, w, backward=True):
    runtime = registry.load_runtime("jax")
    plan = fullcheck.plan(w)
    return fullcheck.result(plan, runtime.full_check(backend.build(w), backend.layout, plan,
                                                     backward), 0.0)


def test_the_right_kernel_passes_at_4k():
    result = check(XlaBackend(), workload())
    assert result.ok("fwd") and result.ok("bwd"), result.errors
    assert set(result.errors) == {"out", "dq", "dk", "dv"}
    assert max(result.errors.values()) < 1e-4  # float32 both sides


@pytest.mark.parametrize("faulty, mask", [
    (DroppedTile, None),
    (ShiftedWindowEdge, make_mask("sliding_window_causal", SEQLEN, window=256)),
    (WrongLastGroup, None),
    (WrongSecondBatchRow, None),
    (WrongPast2k, None),
    (NanAtTimedSize, None),
], ids=lambda x: getattr(x, "__name__", ""))
def test_each_fault_is_caught_forward(faulty, mask):
    result = check(faulty(), workload(mask), backward=False)
    assert not result.ok("fwd"), result.errors
    assert result.error("fwd") > 5 * result.tolerance


def test_a_wrong_dk_in_the_last_kv_head_fails_backward_only():
    result = check(WrongLastDk(), workload())
    assert result.ok("fwd")
    assert not result.ok("bwd") and result.errors["dk"] > 0.1


def test_the_faults_hide_from_the_small_probe():
    """The point of the check: at 1k tokens these backends are right."""
    for faulty in (DroppedTile, NanAtTimedSize):
        result = check(faulty(), workload(seqlen=1024))
        assert result.ok("bwd"), (faulty.__name__, result.errors)


def test_selection_takes_whole_first_and_last_groups_and_batch_rows():
    w = workload(batch=3, heads=(64, 8))
    chosen = fullcheck.selection(w)
    assert chosen.batch_rows == (0, 2) and chosen.kv_heads == (0, 7)
    assert chosen.q_heads == (*range(8), *range(56, 64))
    assert chosen.describe(w) == "batch 0,2 of 3; kv 0,7 of 8; q 0-7,56-63 of 64"


@pytest.mark.parametrize("name", MASK_NAMES)
def test_the_reference_mask_is_the_mask_from_its_slices(name):
    """Chunk by chunk, jax_backends.reference sees exactly mask.to_dense()."""
    seqlen, rows = 1000, 64  # an odd chunking: the last chunk is part padding
    mask = make_mask(name, seqlen)
    chunks = fullcheck.slices_by_chunk(mask.slice_table, seqlen, rows)
    seen = np.concatenate([
        np.asarray(jax_reference.visible(jnp.asarray(chunk), i * rows, rows, seqlen))
        for i, chunk in enumerate(chunks)])
    np.testing.assert_array_equal(seen[:seqlen], mask.to_dense())
    assert not seen[seqlen:].any()


def test_chunk_rows_bound_the_scores():
    w = workload(seqlen=65536, batch=1, heads=(64, 8))
    rows = fullcheck.chunk_rows(w, checked_heads=16, checked_rows=1)
    assert rows * 65536 * 16 <= fullcheck.CHUNK_ELEMENTS and rows & (rows - 1) == 0
    assert fullcheck.chunk_rows(workload(seqlen=100), 4, 2) == 128  # no longer than needed


def test_runner_writes_mismatch_with_the_figures_and_times_the_rest(tmp_path):
    registry.register_backend("jax.test_wrong_dk", f"{__name__}:WrongLastDk")
    registry.register_backend("jax.test_nan", f"{__name__}:NanAtTimedSize")
    path = tmp_path / "rows.jsonl"
    settings = Settings(warmup=0, iters=1, run_id="t", git_commit="abc")
    w = workload(seqlen=2048, heads=(4, 2))
    run_cases([Case("jax.test_wrong_dk", w), Case("jax.xla", w)], results.Writer(path), settings)
    rows = {(r["backend"], r["direction"]): r for r in results.read_rows([path])}
    fwd, bwd = rows["jax.test_wrong_dk", "fwd"], rows["jax.test_wrong_dk", "bwd"]
    assert fwd["status"] == "OK" and fwd["check_err"] < 1e-4
    assert bwd["status"] == "MISMATCH" and "full-size check" in bwd["reason"]
    assert "dk" in bwd["reason"] and bwd["median_ms"] is None
    assert bwd["check_errors"]["dk"] > 0.1 and bwd["check_len"] == 2048
    assert bwd["check_heads"] == "batch 0-1 of 2; kv 0-1 of 2; q 0-3 of 4"  # all: no sample
    for direction in ("fwd", "bwd"):
        ok = rows["jax.xla", direction]
        assert ok["status"] == "OK" and ok["check_err"] < 1e-4 and ok["check_s"] > 0
        assert ok["spread"] >= 1.0 or ok["spread"] is None
    # A NaN at the timed size: the probe passes, the check does not.
    path2 = tmp_path / "nan.jsonl"
    run_cases([Case("jax.test_nan", workload(heads=(4, 2)), ("fwd",))], results.Writer(path2),
              settings)
    (row,) = results.read_rows([path2])
    assert row["status"] == "MISMATCH" and row["check_err"] is None
    assert row["check_errors"] == {"out": "inf"}


def test_check_can_be_turned_off_and_tables_mark_it(tmp_path):
    from lcab.report import tables

    w = workload(seqlen=256, heads=(4, 2))
    for full_check in (True, False):
        settings = Settings(warmup=0, iters=1, run_id=f"t{full_check}", git_commit="abc",
                            full_check=full_check)
        run_cases([Case("jax.xla", w, ("fwd",))], results.Writer(tmp_path / f"{full_check}.jsonl"),
                  settings)
    checked, = results.read_rows([tmp_path / "True.jsonl"])
    unchecked, = results.read_rows([tmp_path / "False.jsonl"])
    assert checked["check_err"] is not None and unchecked["check_err"] is None
    frame = results.load([tmp_path / "False.jsonl"])
    assert tables.kernel_table(frame, "fwd").iloc[0, 0].endswith(tables.FLAG_UNCHECKED)
    frame = results.load([tmp_path / "True.jsonl"])
    assert not tables.kernel_table(frame, "fwd").iloc[0, 0].endswith(tables.FLAG_UNCHECKED)
    assert json.dumps(checked["check_errors"])


def test_tables_flag_an_unsteady_figure():
    from lcab.report import tables

    assert tables.format_cell("OK", 612.4, spread=1.05) == "612"
    assert tables.format_cell("OK", 612.4, spread=1.25) == "612" + tables.FLAG_UNSTEADY
    assert tables.format_cell("OK", 612.4, checked=False) == "612" + tables.FLAG_UNCHECKED
    assert tables.format_cell("MISMATCH", float("nan"), spread=2.0) == "MM"


def test_the_torch_reference_agrees_and_catches_a_fault():
    torch = pytest.importorskip("torch")
    runtime = registry.load_runtime("torch")
    backend = registry.load_backend("torch.sdpa_math", {})
    w = workload(make_mask("sliding_window_causal", 1500, window=200), seqlen=1500)
    plan = fullcheck.plan(w)
    errors = runtime.full_check(backend.build(w), backend.layout, plan, True)
    assert max(errors.values()) < 1e-4, errors
    right = backend.build(w)

    def wrong(q, k, v):  # the last query row of the last batch row, wrong
        out = right(q, k, v)
        return torch.cat([out[:, :, :-1], out[:, :, -1:] * 1.5], dim=2) if backend.layout \
            == "bhsd" else torch.cat([out[:, :-1], out[:, -1:] * 1.5], dim=1)

    errors = runtime.full_check(wrong, backend.layout, plan, False)
    assert errors["out"] > 0.05


# --- Faults outside the selection -----------------------------------------
# At batch 4 and 16:8 heads the selection is batch rows 0 and 3, K/V heads 0
# and 7 (query heads 0, 1, 14, 15). Each fault: (tensor, index, how), `how`
# a factor or NaN; NaNs sit at rows the sampled chunks do not hold.
HIDDEN_FAULTS = {
    "batch_row_1_of_4": ("out", np.s_[1], 1.1),
    "kv_heads_2_to_5": ("k", np.s_[:, :, 2:6], 1.25),
    "nan_in_a_middle_head": ("out", np.s_[2, 100, 6, 0], math.nan),
    "dq_of_a_middle_head": ("dq", np.s_[:, :, 6], 1.2),
    "nan_in_dk_of_a_middle_head": ("dk", np.s_[1, 150, 3, 0], math.nan),
}
BACKWARD_FAULTS = {"dq_of_a_middle_head", "nan_in_dk_of_a_middle_head"}


def hidden_fault_workload(seqlen):
    return workload(seqlen=seqlen, batch=4, heads=(16, 8), head_dim=16)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks small enough that the sampled rows are a part of the sequence."""
    monkeypatch.setattr(fullcheck, "CHUNK_ELEMENTS", 2**16)


def test_the_hidden_faults_lie_outside_the_selection():
    chosen = fullcheck.selection(hidden_fault_workload(256))
    assert chosen.batch_rows == (0, 3) and chosen.kv_heads == (0, 7)
    assert chosen.q_heads == (0, 1, 14, 15)


def jax_damage(x, index, how):
    return x.at[index].set(how) if math.isnan(how) else x.at[index].multiply(how)


def jax_gradient_fault(index, how):
    """The identity, whose gradient is damaged at `index`."""
    @jax.custom_vjp
    def identity(x):
        return x

    identity.defvjp(lambda x: (x, None), lambda _, g: (jax_damage(g, index, how),))
    return identity


class HiddenFault(XlaBackend):
    """jax.xla with one of HIDDEN_FAULTS."""

    name = "jax.test_hidden_fault"

    def __init__(self, fault=None):
        self.fault = fault

    def build(self, workload):
        right = super().build(workload)
        if self.fault is None:
            return right
        tensor, index, how = HIDDEN_FAULTS[self.fault]
        through = {name: jax_gradient_fault(index, how) if tensor == name else (lambda x: x)
                   for name in ("dq", "dk")}

        def attend(q, k, v):
            k = jax_damage(k, index, how) if tensor == "k" else k
            out = right(through["dq"](q), through["dk"](k), v)
            return jax_damage(out, index, how) if tensor == "out" else out

        return attend


def numpy_damage(x, index, how):
    x = np.array(x, dtype=np.float64)
    x[index] = how if math.isnan(how) else x[index] * how
    return x


def numpy_backend(mask, fault=None):
    """A NumPy plugin's function (lcab.numpy_runtime): the float64 reference,
    with one of HIDDEN_FAULTS."""
    tensor, index, how = HIDDEN_FAULTS[fault] if fault else (None, None, None)

    def attend(q, k, v):
        k = numpy_damage(k, index, how) if tensor == "k" else k
        out = numpy_reference.attention(q, k, v, mask)[0]
        return numpy_damage(out, index, how) if tensor == "out" else out

    def grads(q, k, v, dout):
        found = dict(zip(("dq", "dk", "dv"), numpy_reference.attention_grads(q, k, v, mask,
                                                                              dout)))
        if tensor in found:
            found[tensor] = numpy_damage(found[tensor], index, how)
        return [found[name] for name in ("dq", "dk", "dv")]

    attend.grads = grads
    return attend


def hidden_fault_check(framework, fault, backward):
    if framework == "jax":
        w = hidden_fault_workload(1024)
        backend = HiddenFault(fault)
        fn, layout, runtime = backend.build(w), backend.layout, registry.load_runtime("jax")
    else:
        w = hidden_fault_workload(256)
        fn, layout, runtime = numpy_backend(w.mask, fault), "bshd", NumpyRuntime()
    plan = fullcheck.plan(w)
    assert len(plan.sampled_rows) < w.seqlen_q  # a sample, not every row
    if fault and math.isnan(HIDDEN_FAULTS[fault][2]):  # left to the non-finite rule
        assert HIDDEN_FAULTS[fault][1][1] not in plan.sampled_rows
    return fullcheck.result(plan, runtime.full_check(fn, layout, plan, backward), 0.0)


@pytest.mark.parametrize("framework", ["jax", "numpy"])
def test_the_right_backend_passes_with_sampled_rows(framework, small_chunks):
    result = hidden_fault_check(framework, None, backward=True)
    assert set(result.errors) == {"out", "dq", "dk", "dv"}
    assert max(result.errors.values()) < 1e-4, result.errors


@pytest.mark.parametrize("fault", sorted(HIDDEN_FAULTS))
@pytest.mark.parametrize("framework", ["jax", "numpy"])
def test_each_fault_outside_the_selection_is_caught(framework, fault, small_chunks):
    backward = fault in BACKWARD_FAULTS
    result = hidden_fault_check(framework, fault, backward)
    tensor, _, how = HIDDEN_FAULTS[fault]
    direction = "bwd" if backward else "fwd"
    assert result.error(direction) > 5 * result.tolerance, result.errors
    if math.isnan(how):  # found by the non-finite rule, in its own tensor only
        assert result.errors[tensor] == math.inf
        assert all(np.isfinite(e) for name, e in result.errors.items() if name != tensor)
    if tensor == "dq":
        assert result.ok("fwd") and result.errors["dq"] > 0.05


def test_plan_samples_the_first_middle_and_last_chunk_of_every_head():
    w = workload(seqlen=32768, batch=2, heads=(64, 8), head_dim=128)
    plan = fullcheck.plan(w)
    assert plan.sample_rows == 32  # 32 rows x 32k keys x 64 heads x 2 rows = 2^27 scores
    assert plan.sample_rows * w.seqlen_k * w.heads_q * w.batch <= fullcheck.CHUNK_ELEMENTS
    assert plan.sample_rows < plan.chunk_rows
    assert plan.sampled_chunks == (0, 512, 1023)
    np.testing.assert_array_equal(plan.sampled_rows, np.r_[0:32, 16384:16416, 32736:32768])
    every = fullcheck.slices_by_chunk(w.mask.slice_table, w.seqlen_q, plan.sample_rows)
    np.testing.assert_array_equal(plan.sampled_slices, every[list(plan.sampled_chunks)])
    assert plan.describe() == (
        "batch 0-1 of 2; kv 0,7 of 8; q 0-7,56-63 of 64; "
        "every batch row and head at query rows 0-31, 16384-16415, 32736-32767")
    assert fullcheck.result(plan, {"out": 0.0}, 0.0).heads == plan.describe()


def test_sampled_rows_stop_at_the_sequence_and_stay_a_handful():
    w = workload(seqlen=131072 - 100, batch=4, heads=(64, 8), head_dim=128)
    plan = fullcheck.plan(w)
    assert plan.sample_rows == fullcheck.MIN_CHUNK_ROWS
    last = plan.sampled_chunks[-1] * plan.sample_rows
    np.testing.assert_array_equal(plan.sampled_rows[-(w.seqlen_q - last):],
                                  np.arange(last, w.seqlen_q))
    assert plan.sampled_rows[-1] == w.seqlen_q - 1
    assert plan.key != fullcheck.plan(dataclasses.replace(w, batch=1)).key
    short = fullcheck.plan(workload(seqlen=300, heads=(8, 4)))
    assert short.sampled_chunks == (0,) and short.describe().endswith("query rows 0-299")
    whole = fullcheck.plan(workload(seqlen=300, heads=(4, 2)))  # the selection has it all
    assert whole.sampled_chunks == () and len(whole.sampled_rows) == 0
    assert whole.describe() == "batch 0-1 of 2; kv 0-1 of 2; q 0-3 of 4"


def _reference_on_chunks(framework):
    """(to_framework, reference module, to_numpy) of one framework."""
    if framework == "jax":
        return jnp.asarray, jax_reference, np.asarray
    if framework == "torch":
        torch = pytest.importorskip("torch")
        from torch_backends import reference as torch_reference

        return torch.from_numpy, torch_reference, lambda x: x.detach().numpy()
    return (lambda x: x), _DenseReference, np.asarray


@pytest.mark.parametrize("framework", ["jax", "torch", "numpy"])
def test_the_reference_on_chunks_gives_their_rows_of_the_whole(framework):
    """out and dQ of a few chunks of rows, alone, are those rows of the whole."""
    seqlen, rows, chunks = 300, 32, (0, 4, 9)  # chunk 9 is rows 288-299: short
    mask = make_mask("sliding_window_causal", seqlen, window=50)
    rng = np.random.default_rng(0)
    q, dout = (rng.standard_normal((2, seqlen, 4, 8)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((2, seqlen, 2, 8)).astype(np.float32) for _ in range(2))
    to, module, back = _reference_on_chunks(framework)
    every = fullcheck.slices_by_chunk(mask.slice_table, seqlen, rows)
    whole = module.attention(*(to(x) for x in (q, k, v, dout)), every, rows, True)
    picked = np.concatenate([c * rows + np.arange(rows) for c in chunks])
    picked = picked[picked < seqlen]
    part = module.attention(to(q[:, picked]), to(k), to(v), to(dout[:, picked]),
                            every[list(chunks)], rows, True, chunks=chunks)
    assert len(part) == 2  # out and dq: dK and dV need every row
    for got, want in zip(part, whole[:2]):
        np.testing.assert_allclose(back(got), back(want)[:, picked], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back(module.pick_rows(to(q), picked)), q[:, picked])
    (out,) = module.attention(to(q[:, picked]), to(k), to(v), to(dout[:, picked]),
                              every[list(chunks)], rows, False, chunks=chunks)
    np.testing.assert_allclose(back(out), back(whole[0])[:, picked], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("framework", ["numpy", "jax", "torch"])
def test_all_finite_sees_one_bad_value_anywhere(framework):
    if framework == "torch":
        pytest.importorskip("torch")
    runtime = registry.load_runtime(framework) if framework != "numpy" else NumpyRuntime()
    clean = np.ones((2, 64, 4, 8))
    for dtype in ("float32", "bfloat16"):
        assert runtime.all_finite([runtime.from_numpy(clean, dtype)] * 2)
        assert runtime.all_finite(runtime.from_numpy(clean, dtype))
        for bad in (math.nan, math.inf, -math.inf):
            dirty = clean.copy()
            dirty[1, 37, 2, 5] = bad
            assert not runtime.all_finite([runtime.from_numpy(clean, dtype),
                                           runtime.from_numpy(dirty, dtype)]), (dtype, bad)
            assert not runtime.all_finite(runtime.from_numpy(dirty, dtype)), (dtype, bad)
    assert runtime.all_finite([])
