"""Workload: one attention problem (shapes, dtype, mask) to run and time."""

from __future__ import annotations

import dataclasses
import re

from lcab import flops as flops_lib
from lcab.masks import AttnMask

_SIZE = re.compile(r"^\s*(\d+)\s*([kKmM]?)\s*$")
_UNITS = {"": 1, "k": 1024, "m": 1024 * 1024}
# Beyond this a mask's slices or a block-sparse family's blocks outgrow a
# host's memory before any kernel runs (16m tokens over many GPUs is the far end of CP).
MAX_SEQLEN = 16 * 1024 * 1024


def parse_seqlen(text: str) -> int:
    """'4096', '4k', '128k', '1m' -> tokens (k = 1024, m = 1024**2)."""
    match = _SIZE.match(str(text))
    if not match or int(match[1]) <= 0:
        raise ValueError(f"seqlen {text!r} is not a positive size like 4096, 4k, 128k or 1m")
    tokens = int(match[1]) * _UNITS[match[2].lower()]
    if tokens > MAX_SEQLEN:
        raise ValueError(f"seqlen {text!r} is over {format_seqlen(MAX_SEQLEN)} tokens, the "
                         "longest sequence LCAB builds masks for")
    return tokens


def format_seqlen(tokens: int) -> str:
    """131072 -> '128k', 1048576 -> '1m', 1000 -> '1000'."""
    for suffix, unit in (("m", 1024 * 1024), ("k", 1024)):
        if tokens % unit == 0:
            return f"{tokens // unit}{suffix}"
    return str(tokens)


# Canonical dtype names, with the short spellings the CLI accepts.
DTYPES = ("bfloat16", "float16", "float32")
DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
}


def canonical_dtype(name: str) -> str:
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(
            f"dtype={name!r} is not one of {DTYPES} "
            f"(or aliases {', '.join(sorted(DTYPE_ALIASES))})"
        )
    return name


@dataclasses.dataclass(frozen=True)
class Workload:
    """Shapes follow the (batch, seq, heads, head_dim) layout everywhere."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    mask: AttnMask

    def __post_init__(self):
        for field in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim"):
            value = getattr(self, field)
            if isinstance(value, bool) or int(value) != value or value <= 0:
                raise ValueError(f"{field}={value!r} must be a positive integer")
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"heads_q={self.heads_q} is not a multiple of heads_kv={self.heads_kv}"
            )
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if not isinstance(self.mask, AttnMask):
            raise ValueError(f"mask must be an AttnMask, got {type(self.mask).__name__}")
        if (self.mask.seqlen_q, self.mask.seqlen_k) != (self.seqlen_q, self.seqlen_k):
            raise ValueError(
                f"mask is {self.mask.seqlen_q} x {self.mask.seqlen_k} but the workload "
                f"is {self.seqlen_q} x {self.seqlen_k}"
            )

    @property
    def gqa_ratio(self) -> int:
        return self.heads_q // self.heads_kv

    def flops(self, direction: str = "fwd") -> int:
        return flops_lib.attention_flops(
            self.mask.area(),
            batch=self.batch,
            heads_q=self.heads_q,
            head_dim=self.head_dim,
            direction=direction,
        )

    def key(self) -> str:
        """Stable id of this workload, used to identify a result row."""
        return (
            f"{self.mask.name}@{self.mask.fingerprint()}/b{self.batch}"
            f"/q{self.seqlen_q}/k{self.seqlen_k}/h{self.heads_q}:{self.heads_kv}"
            f"/d{self.head_dim}/{self.dtype}"
        )

    def with_mask(self, mask: AttnMask) -> "Workload":
        """The same shapes over another mask (seqlens follow the mask)."""
        return dataclasses.replace(
            self, mask=mask, seqlen_q=mask.seqlen_q, seqlen_k=mask.seqlen_k
        )
