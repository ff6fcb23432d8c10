"""A mask stated through an attention API's own arguments, or why it cannot be.

The kernels here take a causal flag, maybe a window, maybe packed documents,
and never a dense mask: MaskApi.state tries lcab.expressions.statements in
order and takes the first vocabulary the API speaks; a family none states
is UNSUPPORTED. Each backend supplies only its own words and arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jax_backends import _shared
from lcab import expressions
from lcab.backend import Support
from lcab.workloads import Workload

Stated = tuple[Support, dict[str, Any]]  # Support and the API's keyword arguments
# (workload, what one vocabulary states) -> Stated, or None where the API
# cannot take that value (the next vocabulary is tried).
Speaker = Callable[[Workload, Any], Stated | None]


def causal_flag(causal: str = "is_causal", full: str = "no mask",
                keyword: str = "is_causal") -> Speaker:
    """A causal flag argument; `causal` and `full` are Support.how of each value."""

    def speak(workload: Workload, is_causal: bool) -> Stated:
        return Support.yes(causal if is_causal else full), {keyword: is_causal}

    return speak


IS_CAUSAL = causal_flag()  # jax.nn's and tokamax's is_causal


@dataclasses.dataclass(frozen=True)
class MaskApi:
    """The mask vocabularies an attention API speaks (field names are
    expressions.VOCABULARIES) and the words its refusals use."""

    name: str
    expresses: str  # "..., which expresses only {expresses}"
    flag: Speaker = IS_CAUSAL
    window: Speaker | None = None
    documents: Speaker | None = None
    # jax.nn-style query/key-value sequence lengths, which mean padding:
    # packed documents are refused with that reason.
    lengths_are_padding: bool = False

    def state(self, workload: Workload) -> Stated:
        found = expressions.statements(workload.mask)
        for vocabulary, value in found.items():
            speaker = getattr(self, vocabulary)
            stated = speaker(workload, value) if speaker else None
            if stated is not None:
                return stated
        if self.lengths_are_padding and "documents" in found:
            return _shared.no_packed_documents(self.name), {}
        return _shared.not_expressible(workload, self.name, self.expresses), {}
