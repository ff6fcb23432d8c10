"""The probe-sizing rule (lcab.validation, Backend.probe_needs): a backend
that pipelines over tiles is probed where its pipelines wrap.

For every mask of the paper's fourteen and the seed's six at their timed
lengths, the chosen probe makes the busiest program of every pass visit at
least four tiles and see two runs of unmasked tiles (as far as the timed
case does), at a length that is a multiple of no block; jax.pallas_flex
declares its tilings and pins the timed case's dK/dV launch order.
"""

from __future__ import annotations

import math

import pytest

from lcab import validation
from lcab.backend import Backend, ProbeNeeds, Support
from lcab.masks import make_mask
from lcab.masks.factory import taken_params
from lcab.workloads import Workload

PAPER = ("full", "causal", "sliding_window", "sliding_window_causal", "longca_global_window",
         "full_document", "causal_document", "block_causal_document", "share_question",
         "causal_blockwise", "prefix_lm_document", "prefix_lm_causal", "block_sparse",
         "var_block_sparse")
HOPPER_TILES = ((128, 128), (128, 128))  # pallas_flex's forward and Mosaic backward


class Tiled(Backend):
    """Runs every mask one way; pipelines over the given tiles."""

    name = "numpy.tiled"
    framework = "numpy"
    tilings = HOPPER_TILES

    def mask_support(self, workload):
        return Support.yes("one way")

    def build(self, workload):
        raise NotImplementedError

    def probe_needs(self, workload):
        return ProbeNeeds(tilings=self.tilings)


def timed(name, seqlen, distribution, heads=(64, 8), batch=1):
    mask = make_mask(name, seqlen, **taken_params(name, distribution=distribution, window=1024))
    return Workload(batch=batch, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=heads[0],
                    heads_kv=heads[1], head_dim=128, dtype="bfloat16", mask=mask)


@pytest.mark.parametrize("name", PAPER)
@pytest.mark.parametrize("seqlen, distribution", [(32768, "prolong64k"),
                                                  (65536, "chatqa2_long_sft")])
def test_the_probe_wraps_every_pipeline_the_timed_case_wraps(name, seqlen, distribution):
    workload = timed(name, seqlen, distribution)
    probe, note = validation.choose_probe(Tiled(), workload)
    assert note == ""
    assert probe.mask.name == name and probe.seqlen_q <= validation.MAX_SIZED_PROBE
    assert probe.seqlen_q % 128 and probe.seqlen_q % 2  # the padding path runs
    for have, full_size in zip(validation.reach(probe.mask, 128, 128),
                               validation.reach(workload.mask, 128, 128)):
        assert have.tiles >= min(4, full_size.tiles)
        assert have.runs >= min(2, full_size.runs)
    assert probe.gqa_ratio == workload.gqa_ratio and probe.heads_kv <= 2


def test_reach_counts_tiles_and_runs_of_unmasked_tiles():
    causal = make_mask("causal", 1024)
    by_q, by_k = validation.reach(causal, 128, 128)
    assert by_q == validation.Reach(tiles=8, runs=1) and by_k == by_q
    sparse = make_mask("block_sparse", 32768, block_size=128, keep=0.2)
    assert validation.reach(sparse, 128, 128)[0].runs > 2


def test_a_probe_that_cannot_reach_says_so():
    class Huge(Tiled):
        tilings = ((1024, 1024),)  # four tiles need 4k tokens: past the cap

    _, note = validation.choose_probe(Huge(), timed("causal", 32768, "pile"))
    assert "short of the timed pipelines" in note and "of 4 tiles per program" in note


def test_short_workloads_are_their_own_probe():
    workload = timed("causal_document", 2048, "pile")
    probe, note = validation.choose_probe(Tiled(), workload)
    assert probe.mask == workload.mask and note == ""


def test_backends_without_needs_keep_the_short_probe():
    class Plain(Tiled):
        def probe_needs(self, workload):
            return None

    probe, _ = validation.choose_probe(Plain(), timed("causal", 32768, "pile"))
    assert probe.seqlen_q == Plain.probe_seqlen


def test_pallas_flex_declares_its_tilings_and_pins_the_launch_order():
    pytest.importorskip("jax")
    from jax_backends.pallas_flex.backend import PallasFlexBackend

    backend = PallasFlexBackend()
    workload = timed("causal_document", 16384, "chatqa2_long_sft")
    needs = backend.probe_needs(workload)
    assert needs.tilings[0] == (128, 128) and needs.min_tiles == 4
    order, split = backend.launch_order(workload)
    pinned, note = backend.pinned_to(workload)
    assert pinned.lowering.dkv_launch == order and order in note and split == 1
    # The probe's own heads and length alone could pick the other order.
    probe, _ = validation.choose_probe(backend, workload)
    assert pinned.launch_order(probe) == (order, 1)
    assert backend.pinned_to(workload)[0].set_options == backend.set_options


def test_pallas_flex_pins_the_dkv_split_of_the_timed_workload():
    """A split of a short sequence's dK/dV programs ("auto" chooses one on
    the Mosaic backward, schedule.dkv_split has the rule's tests; a CPU
    runs Triton, so the split is asked): the probe runs the timed
    workload's split, and the note says so."""
    pytest.importorskip("jax")
    from jax_backends.pallas_flex.backend import PallasFlexBackend

    short = timed("causal", 512, "pile")
    assert PallasFlexBackend().launch_order(short)[1] == 1  # Triton under "auto"
    backend = PallasFlexBackend(dkv_split="4")
    split = backend.launch_order(short)[1]
    assert split == 4
    pinned, note = backend.pinned_to(short)
    assert pinned.lowering.dkv_split == str(split) and f"block in {split} dK/dV programs" in note
    probe, _ = validation.choose_probe(backend, short)
    assert pinned.launch_order(probe)[1] == math.gcd(split, probe.heads_q // probe.heads_kv)


def test_unsized_probes_leave_the_needs_aside():
    probe, note = validation.choose_probe(Tiled(), timed("causal", 32768, "pile"), sized=False)
    assert probe.seqlen_q == Tiled.probe_seqlen and note == ""


@pytest.mark.parametrize("full_check, sized", [(True, False), (False, True)])
def test_the_runner_sizes_probes_only_without_the_full_size_check(tmp_path, monkeypatch,
                                                                  full_check, sized):
    """The full-size check runs the timed pipelines themselves; a probe
    sized to reach them would repeat it (and cost a compile per length)."""
    from lcab import results
    from lcab.runner import Runner, Settings

    probed = []

    def check_probe(backend, runtime, probe, **_):
        probed.append(probe)
        return validation.Verdict(0.0, 0.0, 0.04, probe.mask.name)

    monkeypatch.setattr(validation, "check_probe", check_probe)
    runner = Runner(results.Writer(tmp_path / "rows.jsonl"),
                    Settings(warmup=0, iters=1, full_check=full_check))
    workload = timed("causal", 32768, "pile")
    backend = Tiled()
    runner._validate(backend, None, workload, backend.supports(workload), backward=True)
    assert (probed[0].seqlen_q != Tiled.probe_seqlen) == sized
