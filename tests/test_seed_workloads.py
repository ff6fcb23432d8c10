"""The seeds' workloads, checked against the seeds' definitions as docs/masks.md
states them: the document samplers (statistics over 100 draws against a
direct transcription of each seed's algorithm), the blog's varlen
block-causal mask, the paper's global window, block-sparse rounding and
variable blocks (dense at small sizes, area at 128k), and the flagfiles
that name each seed's setting."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcab.experiments import presets
from lcab.experiments.sweep import Sweep
from lcab.masks import doc_lengths, doc_samplers, make_mask

DRAWS = 100


# ----- the seeds' samplers, transcribed from the docs' description ---------
def magi_packs(seqlen, n_packs, seed, cap=0.25, scale=100):
    """MagiAttention's DatasetSampler as docs/masks.md states it: every
    chatqa2 bucket is `count` documents of its midpoint length (counts
    divided by `scale` to keep the test small), each cut into pieces of
    cap * S and a remainder; all pieces shuffled, laid back to back and cut
    every S tokens; packs shuffled."""
    hist = doc_lengths.histogram("chatqa2_long_sft")
    counts = np.rint(hist.weight * 13463214 / scale).astype(int)
    chunk = int(seqlen * cap)
    pieces = []
    for mid, count in zip((hist.first + hist.last) // 2, counts):
        pieces += [chunk] * int(mid // chunk) * count + [int(mid % chunk)] * count * int(mid % chunk > 0)
    rng = np.random.default_rng(seed)
    stream = rng.permutation(np.array(pieces))
    ends = np.cumsum(stream)
    packs = []
    for k in rng.permutation(int(ends[-1] // seqlen))[:n_packs]:
        lo, hi = k * seqlen, (k + 1) * seqlen
        inside = ends[(ends > lo) & (ends < hi)]
        cuts = np.concatenate([[lo], inside, [hi]])
        packs.append(np.diff(cuts).tolist())
    return packs


def longca_draws(seqlen, distribution, n, seed):
    """LongCA-bench's generate_seqlens as docs/masks.md states it: a bucket by
    weight, randint(a, b) inclusive over its two numbers, clipped to what is
    left, a 0 raised to 1."""
    hist = doc_lengths.histogram(distribution)
    buckets = list(zip(hist.first.tolist(), hist.last.tolist()))
    r = random.Random(seed)
    out = []
    for _ in range(n):
        lens, left = [], seqlen
        while left > 0:
            a, b = r.choices(buckets, weights=hist.weight.tolist())[0]
            length = max(min(r.randint(a, b), left), 1)
            lens.append(length)
            left -= length
        out.append(lens)
    return out


def ours(sampler, seqlen, distribution, n, seed=0):
    rng = np.random.default_rng(seed)
    return [doc_samplers.sample(sampler, seqlen, rng, distribution) for _ in range(n)]


def per_pack(packs, seqlen):
    """Per pack: share of tokens in documents longer than S/4, in documents
    of exactly S/4 (MagiAttention's pieces), mean document length."""
    rows = []
    for lens in packs:
        lens = np.array(lens)
        assert lens.sum() == seqlen and lens.min() >= 1
        rows.append((lens[lens > seqlen / 4].sum() / seqlen,
                     lens[lens == seqlen // 4].sum() / seqlen, lens.mean()))
    return np.array(rows)


def assert_same_within_error(a, b, names):
    """Means of two independent samples agree within 4.5 standard errors."""
    for j, name in enumerate(names):
        se = np.sqrt(a[:, j].var(ddof=1) / len(a) + b[:, j].var(ddof=1) / len(b))
        assert abs(a[:, j].mean() - b[:, j].mean()) <= 4.5 * se + 1e-12, (
            name, a[:, j].mean(), b[:, j].mean(), se)


STATS = ("share > S/4", "share at S/4", "mean length")


@pytest.mark.parametrize("seqlen", [8192, 32768])
def test_magi_pack_matches_the_blogs_packing(seqlen):
    theirs = per_pack(magi_packs(seqlen, DRAWS, seed=42), seqlen)
    mine = per_pack(ours("magi_pack", seqlen, "chatqa2_long_sft", DRAWS), seqlen)
    assert theirs[:, 0].max() == mine[:, 0].max() == 0  # nothing beyond S/4
    assert_same_within_error(theirs, mine, STATS)


def test_the_uncapped_sampler_is_what_the_blog_caps():
    # The figure the seed comparison found: at 8k about 43 % of tokens in
    # documents longer than S/4 (none under magi_pack).
    share = per_pack(ours("uncapped", 8192, "chatqa2_long_sft", 400), 8192)[:, 0].mean()
    assert 0.35 < share < 0.5


@pytest.mark.parametrize("seqlen, distribution", [(8192, "pile"), (32768, "prolong64k")])
def test_longca_matches_the_papers_sampler(seqlen, distribution):
    theirs = per_pack(longca_draws(seqlen, distribution, DRAWS, seed=42), seqlen)
    mine = per_pack(ours("longca", seqlen, distribution, DRAWS), seqlen)
    assert_same_within_error(theirs, mine, STATS)


def test_longca_draws_the_bucket_ends_and_raises_zero_to_one():
    lens = np.concatenate(ours("longca", 1 << 22, "pile", 1))
    # pile's first bucket is written [0,32): 0 (made 1) and 32 both occur.
    assert (lens == 32).any() and (lens == 1).any() and lens.min() == 1


def test_the_papers_length_schedule():
    pick = doc_samplers.default_distribution
    assert [pick("longca", s) for s in (1024, 12288, 12289, 65536, 65537, 1 << 20)] == [
        "pile", "pile", "prolong64k", "prolong64k", "prolong512k", "prolong512k"]
    assert pick("magi_pack", 65536) == pick("uncapped", 8) == "chatqa2_long_sft"
    with pytest.raises(ValueError, match="1048576"):
        pick("longca", (1 << 20) + 1)
    mask = make_mask("causal_document", 16384, sampler="longca")
    assert mask.params["distribution"] == "prolong64k" and mask.params["sampler"] == "longca"


def test_magi_pack_records_its_cap_and_caps_every_document():
    mask = make_mask("full_document", 65536, seed=3, sampler="magi_pack", doc_cap=0.125)
    assert mask.params["doc_cap"] == 0.125 and max(mask.doc_lens()) <= 8192
    rebuilt = make_mask("full_document", 65536, **mask.params)
    assert rebuilt == mask and rebuilt.params == mask.params


# ----- masks, dense at small sizes and area at 128k -----------------------
@settings(max_examples=60, deadline=None)
@given(seqlen=st.integers(1, 300), data=st.data())
def test_varlen_block_causal_is_block_causal_inside_sampled_documents(seqlen, data):
    block = data.draw(st.integers(1, 64))
    seed = data.draw(st.integers(0, 1000))
    mask = make_mask("varlen_block_causal", seqlen, seed=seed, block_size=block,
                     sampler="uncapped", distribution="pile")
    lens = mask.params["doc_lens"]
    starts = np.repeat(np.cumsum([0, *lens[:-1]]), lens)
    ends = np.repeat(np.cumsum(lens), lens)
    _, j = np.indices((seqlen, seqlen))
    block_end = np.minimum(starts + ((np.arange(seqlen) - starts) // block + 1) * block, ends)
    same = starts[:, None] == starts[None, :]
    np.testing.assert_array_equal(mask.to_dense(), same & (j < block_end[:, None]))


def test_varlen_block_causal_defaults_to_the_blogs_2048_blocks():
    mask = make_mask("varlen_block_causal", 131072, seed=0, sampler="magi_pack")
    assert mask.params["block_size"] == 2048
    lens = np.array(mask.doc_lens() or mask.params["doc_lens"])
    blocks = -(-lens // 2048)
    # Area: per document, block b (0-based) of size s_b sees start..its end.
    area = 0
    for length in lens.tolist():
        sizes = [min(2048, length - b * 2048) for b in range(-(-length // 2048))]
        area += sum(s * (b * 2048 + s) for b, s in enumerate(sizes))
    assert mask.area() == area and len(mask.slice_table) == blocks.sum()


def papers_global_window(seqlen, g):
    """The paper's ranges (its FLOPs basis): q[0,S) x k[0,g) causal and
    q[0,g) x k[g,S) causal, both bottom-right aligned, plus a (g, g) band
    over [g, S)."""
    i, j = np.indices((seqlen, seqlen))
    first = (j < g) & (j <= i - (seqlen - g))
    second = (i < g) & (j >= g) & (j - g <= i + seqlen - 2 * g)
    band = (i >= g) & (j >= g) & (np.abs(i - j) <= g)
    return first | second | band


@given(seqlen=st.integers(3, 300), data=st.data())
def test_longca_global_window_is_the_papers_ranges(seqlen, data):
    g = data.draw(st.integers(1, max(1, seqlen // 3 - 1)))
    mask = make_mask("longca_global_window", seqlen, global_len=g)
    np.testing.assert_array_equal(mask.to_dense(), papers_global_window(seqlen, g))


def test_the_two_global_windows_at_32k_and_128k():
    # The seed comparison's figure: at 32k, seed 0, Longformer's area is
    # 1.54x the paper's ranges'.
    a = make_mask("longformer_window", 32768, seed=0)
    b = make_mask("longca_global_window", 32768, seed=0)
    assert a.params == b.params and a.area() / b.area() == pytest.approx(1.536, abs=0.001)
    # Area at 128k, row by row from the ranges' definition.
    seqlen = 131072
    mask = make_mask("longca_global_window", seqlen, seed=5)
    g = mask.params["global_len"]
    i = np.arange(seqlen, dtype=np.int64)
    first = np.clip(i - (seqlen - g) + 1, 0, g)
    second = np.where(i < g, np.clip(i + seqlen - 2 * g + 1, 0, seqlen - g), 0)
    band = np.where(i >= g, np.minimum(i + g, seqlen - 1) - np.maximum(i - g, g) + 1, 0)
    assert mask.area() == int(first.sum() + second.sum() + band.sum())


@pytest.mark.parametrize("seqlen, block, keep, kept", [
    (16384, 128, 0.2, 25),    # int(25.6): the paper floors where round() gave 26
    (16384, 64, 0.1, 25),     # int(25.6) of 256 blocks
    (4096, 128, 0.01, 1),     # at least one
    (131072, 128, 0.3, 307),  # int(307.2)
])
def test_block_sparse_keeps_the_papers_count(seqlen, block, keep, kept):
    mask = make_mask("block_sparse", seqlen, seed=1, block_size=block, keep=keep)
    n = seqlen // block
    assert mask.area() == n * kept * block * block
    if seqlen <= 4096:
        tiles = mask.to_dense().reshape(n, block, n, block).any(axis=(1, 3))
        assert (tiles.sum(axis=1) == kept).all()


@pytest.mark.parametrize("seqlen, avg, least", [(16384, 512, 128), (49152, 128, 128),
                                                (131072, 1024, 128), (1000, 96, 8)])
def test_var_block_sparse_is_the_papers_random_partition(seqlen, avg, least):
    mask = make_mask("var_block_sparse", seqlen, seed=2, block_size=avg, keep=0.5,
                     min_block=least)
    n = seqlen // avg
    q_edges = np.unique(mask.slice_table[:, :2])
    sizes = np.diff(q_edges)
    assert len(sizes) == n and sizes.sum() == seqlen and sizes.min() >= least
    if avg == least:  # no room to vary: uniform blocks
        assert (sizes == avg).all()
    # Every q block keeps int(keep * n) kv blocks: its kept keys are that
    # many whole kv blocks, so between k * least and all of S.
    kept = max(1, int(0.5 * n))
    per_q = np.zeros(n, dtype=np.int64)
    for q0, q1, k0, k1, _ in mask.slice_table:
        per_q[np.searchsorted(q_edges, q0)] += k1 - k0
    assert (per_q >= kept * least).all() and (per_q <= seqlen).all()
    assert mask.area() == int((per_q * sizes).sum())


# ----- bad combinations -----------------------------------------------------
@pytest.mark.parametrize("build, message", [
    (lambda: make_mask("causal_document", 4096, sampler="magi_pack", doc_cap=0.0), r"\(0, 1\]"),
    (lambda: make_mask("causal_document", 4096, sampler="magi_pack", doc_cap=1.5), r"\(0, 1\]"),
    (lambda: make_mask("causal_document", 16, sampler="magi_pack"), "shortest document"),
    (lambda: make_mask("causal_document", 4096, sampler="longca", doc_cap=0.5), "magi_pack sampler only"),
    (lambda: make_mask("causal_document", 4096, sampler="packed"), "uncapped, magi_pack, longca"),
    (lambda: make_mask("causal_document", (1 << 20) + 2, sampler="longca"), "name a distribution"),
    (lambda: make_mask("block_sparse", 4096, keep=0.0), r"keep=0.0 must be in \(0, 1\]"),
    (lambda: make_mask("block_sparse", 4096, keep=1.01), r"\(0, 1\]"),
    (lambda: make_mask("var_block_sparse", 4096, block_size=64, min_block=128), "min_block"),
])
def test_bad_combinations_name_the_value_and_the_range(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# ----- one flag per seed ------------------------------------------------------
def test_seed_blog_flags_are_the_blogs_setting():
    flags = presets.read("experiments/seed_blog.flags")
    assert flags["masks"].split(",") == ["full", "causal", "full_document", "causal_document",
                                         "sliding_window_causal", "varlen_block_causal"]
    assert flags["seqlens"] == "1k,2k,4k,8k,16k,24k,32k,64k"
    assert (flags["heads"], flags["head_dim"], flags["dtype"], flags["window"]) == (
        "64:8", "128", "bfloat16", "1024")
    # The histogram and cap are magi_pack's defaults, which the flagfile
    # leaves unset so that, as the GPU preset, it carries them into no other sweep.
    assert flags["doc_sampler"] == "magi_pack"
    assert "doc_distribution" not in flags and "doc_cap" not in flags
    mask = make_mask("causal_document", 65536, sampler="magi_pack")
    assert (mask.params["distribution"], mask.params["doc_cap"]) == ("chatqa2_long_sft", 0.25)


def test_paper_flags_are_the_papers_setting():
    flags = presets.read("experiments/paper.flags")
    masks = flags["masks"].split(",")
    assert len(masks) == 12 and "longca_global_window" in masks
    assert "longformer_window" not in masks and "varlen_block_causal" not in masks
    assert flags["seqlens"] == "1k,2k,4k,8k,16k,24k,32k,40k,48k"
    assert flags["doc_sampler"] == "longca" and "doc_distribution" not in flags
    sparse = presets.read("experiments/paper_block_sparse.flags")
    assert (sparse["heads"], sparse["seqlens"], sparse["keep"], sparse["sparse_block"]) == (
        "4:4", "16k,48k", "0.1,0.2,0.5,0.8,1.0", "64,128")


def test_a_sparsity_sweep_runs_every_kept_fraction_and_block():
    sweep = Sweep(backends=("jax.xla",), masks=("block_sparse", "causal"),
                  seqlens=(4096,), keeps=(0.1, 0.5, 1.0), sparse_blocks=(64, 128))
    cases = sweep.cases()
    sparse = [c.workload.mask.params for c in cases if c.workload.mask.name == "block_sparse"]
    assert sorted((p["keep"], p["block_size"]) for p in sparse) == sorted(
        (k, b) for k in (0.1, 0.5, 1.0) for b in (64, 128))
    assert [c.workload.mask.name for c in cases].count("causal") == 1


# ----- rows written before these workloads ------------------------------------
def test_earlier_rows_rebuild_their_own_masks():
    """Rows of 2026-11-27's full-size gate (before the seeds' workloads):
    global_sliding_window reads as longformer_window, and the earlier
    block-sparse generators (round(), uniform variable sizes) rebuild each
    row's mask to its recorded fingerprint."""
    from lcab import results
    from lcab.model.validation import mask_of

    frame = results.load("results/gpu/2026-11-27-full-size-gate/table")
    old = frame[frame["mask"].isin(["longformer_window", "block_sparse", "var_block_sparse"])]
    assert set(old["mask"]) == {"longformer_window", "block_sparse", "var_block_sparse"}
    assert "global_sliding_window" not in set(frame["mask"])
    for _, row in old.drop_duplicates("mask_fingerprint").iterrows():
        assert mask_of(row).fingerprint() == row["mask_fingerprint"]
    # At 32k (256 blocks) round(51.2) == int(51.2): the same mask, read as
    # today's; the variable blocks were uniform sizes.
    assert mask_of(old[old["mask"] == "block_sparse"].iloc[0]).params["rounding"] == "floor"
    assert mask_of(old[old["mask"] == "var_block_sparse"].iloc[0]).params["sizes"] == "uniform"


def test_rows_of_todays_generators_that_do_not_name_it_read_as_today():
    """The seed-workloads run's first rows were written before block_sparse
    recorded its rounding: their fingerprint says which generator they are."""
    from lcab import results

    frame = results.load("results/gpu/2026-11-27-seed-workloads/paper")
    sparse = frame[frame["mask"].isin(["block_sparse", "var_block_sparse"])]
    params = [results.json_field(p) for p in sparse["mask_params"]]
    assert len(params) == 12 and all(
        p.get("rounding", "floor") == "floor" and p.get("sizes", "partition") == "partition"
        for p in params)


@pytest.mark.parametrize("flags, message", [
    (["--doc_sampler=longca", "--doc_cap=0.5"], "magi_pack sampler only"),
    (["--doc_sampler=magi_pack", "--doc_cap=1.5"], r"must be in \(0, 1\]"),
    (["--keep=0.2,1.5"], r"not a kept fraction in \(0, 1\]"),
])
def test_bad_combinations_on_the_command_line_end_without_a_traceback(flags, message):
    import re
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "lcab.experiments", "--masks=causal_document,block_sparse",
         "--seqlens=4k", "--backends=jax.xla", "--out=/nonexistent/never-written", *flags],
        capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert re.search(message, done.stderr), done.stderr[-500:]
