"""torch.sdpa_*: scaled_dot_product_attention pinned to one SDPA backend.

Causal (and full) use the native is_causal flag; every other family needs a
dense boolean attn_mask, which is the honest way the math backend expresses
it and is labelled so in the row's notes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from lcab.backend import Backend, Support
from lcab.workloads import Workload

DENSE_MASK_CELLS = 1 << 28  # 16k x 16k


def _native(workload: Workload) -> str | None:
    documents = workload.mask.documents()
    if documents is not None and len(documents.lens) == 1:
        return "is_causal" if documents.causal else "no mask"
    return None


class SdpaMathBackend(Backend):
    name = "torch.sdpa_math"
    framework = "torch"
    description = "torch SDPA, MATH backend (reference-grade, dense scores)"
    layout = "bhsd"
    requires = ("torch",)
    sdpa_backend = SDPBackend.MATH

    def mask_support(self, workload: Workload) -> Support:
        native = _native(workload)
        if native:
            return Support.yes(f"{native}; enable_gqa")
        cells = workload.seqlen_q * workload.seqlen_k
        if cells > DENSE_MASK_CELLS:
            return Support.no(
                f"a dense mask of {workload.seqlen_q} x {workload.seqlen_k} exceeds "
                f"{DENSE_MASK_CELLS} cells"
            )
        return Support.yes("dense boolean attn_mask; enable_gqa")

    def build(self, workload: Workload):
        native = _native(workload)
        causal = native == "is_causal"
        mask = None
        if native is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            dense = workload.mask.to_dense(max_elements=DENSE_MASK_CELLS)
            mask = torch.from_numpy(dense).to(device)
        gqa = workload.heads_q != workload.heads_kv
        backend = self.sdpa_backend

        def attend(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa
                )

        return attend
