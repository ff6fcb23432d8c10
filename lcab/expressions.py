"""How a mask translates into the vocabularies kernels understand.

Framework-neutral and exact: each function returns None when the mask is
not expressible that way, so a backend can say UNSUPPORTED instead of
running something else. Backends in both frameworks share these.
"""

from __future__ import annotations

import numpy as np

from lcab.masks import AttnMask, Documents

# Largest dense boolean mask a backend may build for a family it has no
# native way to express: 16k x 16k (256 MiB). Past it the dense mask is a
# different benchmark, and the scores it masks would not fit anyway.
DENSE_MASK_CELLS = 1 << 28


def causal_flag(mask: AttnMask) -> bool | None:
    """True for causal, False for full (no mask at all), None otherwise."""
    documents = mask.documents()
    if documents is None or len(documents.lens) != 1:
        return None
    return documents.causal


def flag_path(mask: AttnMask) -> str | None:
    """"is_causal" or "no mask" where flags alone express the mask, else None."""
    causal = causal_flag(mask)
    if causal is None:
        return None
    return "is_causal" if causal else "no mask"


def window(mask: AttnMask) -> tuple[int, int] | None:
    """FlashAttention-style (left, right), -1 unbounded; None if no band."""
    return mask.window()


def sliding_window(mask: AttnMask) -> tuple[int, int] | None:
    """The window only when it is a true sliding window (a bounded side).

    Full (-1, -1) and causal (-1, 0) are better expressed by causal_flag.
    """
    found = mask.window()
    if found is None or (found[0] == -1 and found[1] in (-1, 0)):
        return None
    return found


def cu_seqlens(mask: AttnMask) -> tuple[np.ndarray, bool] | None:
    """(cu_seqlens int32 of length docs+1, causal inside documents) or None."""
    documents = mask.documents()
    if documents is None:
        return None
    return documents.cu_seqlens(), documents.causal


def segment_ids(mask: AttnMask) -> tuple[np.ndarray, bool] | None:
    """(document id per token, int32, causal inside documents) or None."""
    documents = mask.documents()
    if documents is None:
        return None
    return document_ids(documents), documents.causal


def document_ids(documents: Documents) -> np.ndarray:
    """The document id (int32) of every token of packed documents."""
    return np.repeat(np.arange(len(documents.lens), dtype=np.int32), documents.lens)


# The vocabularies kernel APIs state masks in, in the order a backend tries
# them: the cheapest statement first, so a one-document mask, which is also
# packed documents, goes to the causal flag.
VOCABULARIES = ("flag", "window", "documents")


def statements(mask: AttnMask) -> dict[str, bool | tuple[int, int] | Documents]:
    """Every vocabulary that states `mask` exactly, in VOCABULARIES order,
    -> what it states: "flag" the causal flag (False: no mask), "window" a
    true sliding window (left, right), "documents" the packed Documents.

    A backend takes the first its API speaks; none: not expressible there.
    """
    found = {"flag": causal_flag(mask), "window": sliding_window(mask),
             "documents": mask.documents()}
    return {vocabulary: value for vocabulary, value in found.items() if value is not None}


def dense_mask_fits(mask: AttnMask) -> bool:
    return mask.seqlen_q * mask.seqlen_k <= DENSE_MASK_CELLS
