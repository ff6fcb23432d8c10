"""What `python -m lcab.experiments` runs when a setting is not given.

Without a GPU: a small CPU sweep that finishes in about two minutes (2 cores). With one:
the seed blog's kernel sweep (six masks, 4k..128k, 64:8 heads, d=128, bf16,
chatqa2 document lengths). A flag given on the command line or in a
flagfile always wins over the preset.
"""

import shutil

CPU = {
    "masks": ["full", "causal", "causal_document", "sliding_window_causal"],
    "seqlens": ["256", "512", "1024"],
    "heads": "4:2",
    "head_dim": 64,
    "dtype": "float32",
    "warmup": 1,
    "iters": 3,
    "window": 128,
    "doc_distribution": "pile",
}

GPU = {
    "masks": [
        "full", "causal", "full_document", "causal_document",
        "sliding_window_causal", "block_causal_document",
    ],
    "seqlens": ["4k", "8k", "16k", "32k", "64k", "128k"],
    "heads": "64:8",
    "head_dim": 128,
    "dtype": "bfloat16",
    "warmup": 3,
    "iters": 10,
    "window": 1024,
    "doc_distribution": "chatqa2_long_sft",
}


def has_gpu() -> bool:
    """A GPU is visible to this machine (without importing a framework)."""
    return shutil.which("nvidia-smi") is not None


def current() -> dict:
    return GPU if has_gpu() else CPU
