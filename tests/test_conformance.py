"""Every registered kernel backend, JAX and PyTorch, against its own claims.

The test bodies are tests/conformance.py's; a kernel's own test file keeps
only what is special to it.
"""

import pytest

from tests import conformance


class TestClaims(conformance.Claims):
    """Host-side: supports() alone, no GPU needed."""


@pytest.mark.slow  # the interpret-mode Pallas kernels take seconds a case on a CPU
class TestAgainstReference(conformance.AgainstReference):
    """Small sizes; on a CPU the Pallas kernels run in interpret mode."""


@pytest.mark.gpu
class TestAgainstReferenceAtModelShapes(conformance.AgainstReference):
    """The seed's head_dim and GQA ratio, where every GPU kernel can run."""

    SEQLEN = 512
    HEADS = (8, 2)
    HEAD_DIM = 128


@pytest.mark.gpu
class TestAtFullSize(conformance.AtFullSize):
    """Lengths that wrap every pipeline, against the full-size reference."""
