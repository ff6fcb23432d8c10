"""Document-length histograms and the uncapped sampler (LCAB's original)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lcab.masks import doc_lengths, doc_samplers


@pytest.mark.parametrize("name", doc_lengths.DISTRIBUTIONS)
def test_histograms_load_as_probabilities(name):
    hist = doc_lengths.histogram(name)
    assert hist.weight.sum() == pytest.approx(1.0)
    assert (hist.weight > 0).all()
    assert (hist.lo >= 1).all() and (hist.hi > hist.lo).all()
    assert (hist.lo[1:] >= hist.lo[:-1]).all()  # buckets in order


def test_csv_buckets_are_closed_intervals():
    hist = doc_lengths.histogram("chatqa2_long_sft")
    # "[0, 10]" and "[11, 50]" -> [1, 11) and [11, 51): contiguous, no gaps.
    assert (hist.lo[0], hist.hi[0], hist.lo[1], hist.hi[1]) == (1, 11, 11, 51)
    assert hist.hi[-1] == 196609
    assert hist.weight[4] == pytest.approx(3794735 / 13463217)
    # The numbers as written, which the peers' samplers read.
    assert (hist.first[0], hist.last[0], hist.first[-1], hist.last[-1]) == (0, 10, 131073, 196608)


@given(
    seqlen=st.integers(1, 300_000),
    seed=st.integers(0, 2**32 - 1),
    name=st.sampled_from(doc_lengths.DISTRIBUTIONS),
)
def test_sampled_lengths_fill_the_sequence_exactly(seqlen, seed, name):
    lens = doc_samplers.sample("uncapped", seqlen, np.random.default_rng(seed), name)
    assert sum(lens) == seqlen and min(lens) >= 1
    again = doc_samplers.sample("uncapped", seqlen, np.random.default_rng(seed), name)
    assert lens == again


@pytest.mark.parametrize("name", doc_lengths.DISTRIBUTIONS)
def test_lengths_follow_the_histogram(name):
    hist = doc_lengths.histogram(name)
    rng = np.random.default_rng(0)
    # About 100k documents: bucket frequencies within +-0.004 (over 4 sigma).
    lens = doc_samplers.sample("uncapped", int(hist.mean() * 100_000), rng, name)[:-1]
    bucket = np.searchsorted(hist.lo, lens, side="right") - 1
    observed = np.bincount(bucket, minlength=len(hist.weight)) / len(lens)
    np.testing.assert_allclose(observed, hist.weight, atol=0.004)


def test_unknown_distribution_names_the_choices():
    with pytest.raises(ValueError, match="chatqa2_long_sft"):
        doc_lengths.histogram("wikipedia")
