"""A sweep declared as data: parsed settings -> the list of cases to run."""

from __future__ import annotations

import dataclasses
import itertools

from lcab import registry
from lcab.masks import canonical_name, make_mask, taken_params
from lcab.runner import Case
from lcab.workloads import Workload, canonical_dtype, format_seqlen, parse_seqlen  # noqa: F401


def parse_heads(text: str) -> tuple[int, int]:
    """'64:8' -> (64, 8); '16' -> (16, 16)."""
    parts = str(text).split(":")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"heads {text!r} is not 'Q:KV' (e.g. 64:8) or 'H'")
    heads_q, heads_kv = int(parts[0]), int(parts[-1])
    if heads_q <= 0 or heads_kv <= 0 or heads_q % heads_kv:
        raise ValueError(f"heads {text!r}: both positive and Q a multiple of KV")
    return heads_q, heads_kv


def unique(values) -> tuple:
    """`values` in order, each once."""
    return tuple(dict.fromkeys(values))


@dataclasses.dataclass(frozen=True)
class Sweep:
    backends: tuple[str, ...]
    masks: tuple[str, ...]
    seqlens: tuple[int, ...]
    batch: int = 1
    heads: tuple[int, int] = (64, 8)
    head_dim: int = 128
    dtype: str = "bfloat16"
    directions: tuple[str, ...] = ("fwd", "bwd")
    suite: str = "kernel"
    mask_seed: int = 0
    window: int | None = None
    doc_distribution: str | None = None
    doc_sampler: str | None = None
    doc_cap: float | None = None
    # Block-sparse families only: every kept fraction x every block size.
    keeps: tuple[float, ...] = ()
    sparse_blocks: tuple[int, ...] = ()

    def __post_init__(self):
        for name in self.backends:
            registry.check_backend_name(name)
        object.__setattr__(self, "masks", tuple(canonical_name(m) for m in self.masks))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        # A value listed twice (causal,causal; 1k,1024) is one case, run once.
        for listed in ("backends", "masks", "seqlens", "directions", "keeps", "sparse_blocks"):
            object.__setattr__(self, listed, unique(getattr(self, listed)))

    def mask_params(self, name: str) -> dict:
        """The sweep-wide parameters that this family takes."""
        return taken_params(name, window=self.window, distribution=self.doc_distribution,
                            sampler=self.doc_sampler, doc_cap=self.doc_cap)

    def mask_settings(self, name: str) -> list[dict]:
        """Every parameter setting family `name` runs at: one, or for the
        block-sparse families each (keep, block size) of the sweep."""
        if "keep" not in taken_params(name, keep=1.0):
            return [self.mask_params(name)]
        return [{**self.mask_params(name), **taken_params(name, keep=keep, block_size=block)}
                for keep, block in itertools.product(self.keeps or (None,),
                                                     self.sparse_blocks or (None,))]

    def cases(self) -> list[Case]:
        cases = []
        for mask_name in self.masks:
            for seqlen, params in itertools.product(self.seqlens, self.mask_settings(mask_name)):
                mask = make_mask(mask_name, seqlen, seed=self.mask_seed, **params)
                workload = Workload(
                    self.batch, seqlen, seqlen, *self.heads, self.head_dim, self.dtype, mask
                )
                cases += [
                    Case(backend, workload, self.directions, self.suite)
                    for backend in self.backends
                ]
        return cases
