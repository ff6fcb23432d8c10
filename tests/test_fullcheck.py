"""The full-size check (lcab.fullcheck) catches faults the small probe cannot.

Each deliberately wrong backend below is jax.xla (right everywhere) with one
fault that shows only at the timed size or only in part of the output: a
dropped 128 x 128 tile at 4k, a window edge shifted by one, a wrong last
K/V group, a wrong second batch row, wrong rows past 2k tokens, a NaN only
at the timed length, a dK wrong only in the last K/V head. Each is run
through the runtime's full check at 4k tokens on a CPU and must fail it;
jax.xla itself must pass. The torch reference is held to the same.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from lcab import fullcheck, registry, results
from lcab.masks import MASK_NAMES, AttnMask, AttnSlice, make_mask
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
    assert bwd["check_heads"] == "batch 0-1 of 2; kv 0-1 of 2; q 0-3 of 4"
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
