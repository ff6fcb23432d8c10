"""Document-length histograms: published dataset statistics.

Each histogram is a list of length buckets with weights. How a histogram
becomes the documents of one packed sequence is a sampler's job
(lcab.masks.doc_samplers).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import json
import re
from importlib import resources

import numpy as np

# name -> (file in lcab/data/doc_lengths, source)
_SOURCES = {
    "chatqa2_long_sft": ("chatqa2_long_sft.csv", "ChatQA2 long SFT (the seed blog's)"),
    "pile": ("pile.json", "The Pile (LongCA-bench)"),
    "prolong64k": ("prolong64k.json", "ProLong 64k (LongCA-bench)"),
    "prolong512k": ("prolong512k.json", "ProLong 512k (LongCA-bench)"),
}
DISTRIBUTIONS = tuple(_SOURCES)
DEFAULT_DISTRIBUTION = "chatqa2_long_sft"

_BUCKET = re.compile(r"^\s*\[\s*(\d+)\s*,\s*(\d+)\s*([)\]])\s*$")


@dataclasses.dataclass(frozen=True)
class LengthHistogram:
    name: str
    source: str
    lo: np.ndarray  # inclusive lower bound of each bucket (at least 1)
    hi: np.ndarray  # exclusive upper bound of each bucket
    weight: np.ndarray  # probabilities, summing to 1
    # The two numbers each bucket is written with ("[a,b)" or "[a, b]"),
    # which the peers' samplers read without the brackets.
    first: np.ndarray
    last: np.ndarray

    def mean(self) -> float:
        return float(np.sum(self.weight * (self.lo + self.hi - 1) / 2))


def _parse_bucket(text: str) -> tuple[int, int, int, int]:
    """'[a, b]' or '[a,b)' -> (lo, hi) half-open with lo >= 1, then (a, b)."""
    match = _BUCKET.match(text)
    if not match:
        raise ValueError(f"cannot parse length bucket {text!r}")
    first, last, close = int(match[1]), int(match[2]), match[3]
    hi = last + 1 if close == "]" else last
    # A document has at least one token.
    return max(first, 1), hi, first, last


@functools.cache
def histogram(name: str) -> LengthHistogram:
    if name not in _SOURCES:
        raise ValueError(f"distribution={name!r} is not one of {DISTRIBUTIONS}")
    filename, source = _SOURCES[name]
    text = resources.files("lcab.data").joinpath("doc_lengths", filename).read_text()
    if filename.endswith(".json"):
        items = [(_parse_bucket(k), float(v)) for k, v in json.loads(text).items()]
    else:
        rows = csv.DictReader(io.StringIO(text))
        items = [(_parse_bucket(row["range"]), float(row["number"])) for row in rows]
    bounds = np.array([b for b, _ in items], dtype=np.int64)
    weight = np.array([w for _, w in items], dtype=np.float64)
    return LengthHistogram(
        name, source, bounds[:, 0], bounds[:, 1], weight / weight.sum(), bounds[:, 2], bounds[:, 3]
    )
