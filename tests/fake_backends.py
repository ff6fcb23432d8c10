"""Host-only backends that misbehave on purpose, for the harness's tests.

They run on lcab's NumPy runtime (framework "numpy") and are registered by
importing this module, the way a --backend_modules plugin would be.
"""

import os
import sys
import time

import numpy as np

from lcab import reference, registry
from lcab.backend import Backend, Support
from lcab.masks import AttnMask
from lcab.numpy_runtime import round_to


def _reference_fn(mask: AttnMask, dtype: str, *, delay_s: float = 0.0):
    def attend(q, k, v):
        time.sleep(delay_s)
        return round_to(reference.attention(q, k, v, mask)[0], dtype)

    attend.grads = lambda q, k, v, dout: [
        round_to(g, dtype) for g in reference.attention_grads(q, k, v, mask, dout)
    ]
    return attend


class ReferenceBackend(Backend):
    """Correct: the float64 reference, rounded to the input dtype."""

    name = "numpy.reference"
    framework = "numpy"
    delay_s = 0.0

    def mask_support(self, workload):
        if workload.seqlen_q * workload.seqlen_k > 1 << 22:
            return Support.no("dense reference limited to 2048 x 2048")
        return Support.yes("dense float64 reference")

    def build(self, workload):
        return _reference_fn(workload.mask, workload.dtype, delay_s=self.delay_s)


class TunableBackend(ReferenceBackend):
    """Correct, with a constructor option (rows record it)."""

    name = "numpy.tunable"
    options = {"variant": str}

    def __init__(self, variant: str = "a"):
        self.variant = variant


class SlowBackend(ReferenceBackend):
    name = "numpy.slow"
    delay_s = 0.3


class OffByOneWindowBackend(ReferenceBackend):
    """Wrong: every query also sees the key right after its last visible one."""

    name = "numpy.off_by_one"
    directions = ("fwd",)

    def build(self, workload):
        dense = workload.mask.to_dense()
        widened = dense | np.roll(dense, 1, axis=1)
        dtype = workload.dtype

        def attend(q, k, v):
            group = q.shape[2] // k.shape[2]
            k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
            scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
            scores = np.where(widened, scores, -np.inf)
            weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
            weights /= weights.sum(axis=-1, keepdims=True)
            return round_to(np.einsum("bhqk,bkhd->bqhd", weights, v), dtype)

        return attend


class OutOfMemoryBackend(ReferenceBackend):
    """Validates fine, then runs out of memory above 512 tokens."""

    name = "numpy.oom"

    def build(self, workload):
        if workload.seqlen_q > 512:
            raise MemoryError("out of memory: tried to allocate 80.00 GiB")
        return super().build(workload)


class RaisingBackend(ReferenceBackend):
    name = "numpy.raises"

    def build(self, workload):
        raise RuntimeError(f"kernel launch failed for {workload.seqlen_q=}")


class CausalOnlyBackend(ReferenceBackend):
    name = "numpy.causal_only"
    directions = ("fwd",)

    def mask_support(self, workload):
        documents = workload.mask.documents()
        if documents is None or not documents.causal or len(documents.lens) != 1:
            return Support.no("only the causal mask")
        return Support.yes("is_causal")


class CrashingBackend(ReferenceBackend):
    """Kills its process outright, as a crashed driver would."""

    name = "numpy.crash"

    def build(self, workload):
        os._exit(3)


class MissingPackageBackend(ReferenceBackend):
    name = "numpy.missing"
    requires = ("a_package_that_is_not_installed",)


for _cls in (ReferenceBackend, TunableBackend, SlowBackend, OffByOneWindowBackend,
             OutOfMemoryBackend,
             RaisingBackend, CausalOnlyBackend, CrashingBackend, MissingPackageBackend):
    registry.register_backend(_cls.name, f"{__name__}:{_cls.__name__}")


class NanBackend(ReferenceBackend):
    """Returns NaN everywhere: a broken kernel."""

    name = "numpy.nan"
    directions = ("fwd",)

    def build(self, workload):
        return lambda q, k, v: np.full(q.shape, np.nan, dtype=np.float32)


class IgnoresMaskBackend(ReferenceBackend):
    """Claims every mask, always computes full attention."""

    name = "numpy.ignores_mask"
    directions = ("fwd",)

    def build(self, workload):
        full = AttnMask(workload.seqlen_q, workload.seqlen_k,
                        np.array([[0, workload.seqlen_q, 0, workload.seqlen_k, 0]]))
        return _reference_fn(full, workload.dtype)


class RaisesInSupportsBackend(ReferenceBackend):
    name = "numpy.raises_in_supports"

    def mask_support(self, workload):
        raise KeyError("no table entry for this mask")


class RaisesAtStartBackend(ReferenceBackend):
    name = "numpy.raises_at_start"

    def __init__(self):
        raise RuntimeError("driver handle could not be created")


class HangsBackend(ReferenceBackend):
    """Never returns, as a deadlocked kernel would."""

    name = "numpy.hangs"

    def build(self, workload):
        time.sleep(3600)


class CausalForwardOnlyBackend(ReferenceBackend):
    """Both directions for full, the forward alone for causal."""

    name = "numpy.causal_forward_only"

    def mask_support(self, workload):
        causal = workload.mask.documents()
        if causal is not None and causal.causal and len(causal.lens) == 1:
            return Support.yes("is_causal", directions=("fwd",))
        return super().mask_support(workload)


for _cls in (NanBackend, IgnoresMaskBackend, RaisesInSupportsBackend, RaisesAtStartBackend,
             HangsBackend, CausalForwardOnlyBackend):
    registry.register_backend(_cls.name, f"{__name__}:{_cls.__name__}")


class BackwardFailsWhenTimedBackend(ReferenceBackend):
    """Right in the probe and the full-size check; its backward raises once
    timing begins (a backward that fails only under timing, e.g. out of
    memory beside the flush buffer)."""

    name = "numpy.backward_fails_when_timed"

    def build(self, workload):
        attend = _reference_fn(workload.mask, workload.dtype)
        right, calls = attend.grads, []

        def grads(q, k, v, dout):
            calls.append(1)
            if len(calls) > 2:  # the probe's and the full check's are 1 and 2
                raise RuntimeError("backward failed while timed")
            return right(q, k, v, dout)

        attend.grads = grads
        return attend


registry.register_backend(BackwardFailsWhenTimedBackend.name,
                          f"{__name__}:BackwardFailsWhenTimedBackend")


# ----- faults the probe cannot see: only at the timed size, batch or heads ------


def _perturbed(workload, change):
    """The reference, with `change(out)` applied to each forward output."""
    attend = _reference_fn(workload.mask, workload.dtype)
    right = attend

    def wrong(q, k, v):
        out = np.array(right(q, k, v))
        change(out, q, k)
        return out

    wrong.grads = attend.grads
    return wrong


class NanBeyondTheProbeBackend(ReferenceBackend):
    """Right up to 1024 tokens (its probes), NaN beyond: a pipeline that
    breaks once it wraps."""

    name = "numpy.nan_beyond_probe"

    def build(self, workload):
        def change(out, q, k):
            if q.shape[1] > 1024:
                out[:] = np.nan

        return _perturbed(workload, change)


class WrongInThirdBatchRowBackend(ReferenceBackend):
    """Right for batches of two (the probe's), wrong in batch row 2 of more."""

    name = "numpy.wrong_batch_row"

    def build(self, workload):
        def change(out, q, k):
            if q.shape[0] > 2:
                out[2] += 1.0

        return _perturbed(workload, change)


class WrongInMiddleHeadsBackend(ReferenceBackend):
    """Right with two K/V heads (the probe's), wrong in the query heads of
    every K/V head but the first two and the last when there are more."""

    name = "numpy.wrong_middle_heads"

    def build(self, workload):
        def change(out, q, k):
            heads_kv = k.shape[2]
            group = q.shape[2] // heads_kv
            if heads_kv > 2:
                out[:, :, 2 * group:(heads_kv - 1) * group] += 1.0

        return _perturbed(workload, change)


class BackwardRaisesBackend(ReferenceBackend):
    """A forward that works and a backward that always raises."""

    name = "numpy.backward_raises"
    failure = RuntimeError("backward kernel failed to launch")

    def build(self, workload):
        attend = _reference_fn(workload.mask, workload.dtype)

        def grads(q, k, v, dout):
            raise self.failure

        attend.grads = grads
        return attend


class BackwardOutOfMemoryBackend(BackwardRaisesBackend):
    """A forward that works and a backward that always runs out of memory."""

    name = "numpy.backward_oom"
    failure = MemoryError("out of memory: tried to allocate 80.00 GiB in backward")


class ExitsBackend(ReferenceBackend):
    """Calls sys.exit(0) when built for 96 tokens."""

    name = "numpy.sys_exit"

    def build(self, workload):
        if workload.seqlen_q == 96:
            sys.exit(0)
        return super().build(workload)


class HardExitsBackend(ReferenceBackend):
    """Ends its process with os._exit(0) when built for 96 tokens (for any
    length when LCAB_TEST_OS_EXIT is set)."""

    name = "numpy.os_exit"

    def build(self, workload):
        if workload.seqlen_q == 96 or os.environ.get("LCAB_TEST_OS_EXIT"):
            os._exit(0)
        return super().build(workload)


for _cls in (NanBeyondTheProbeBackend, WrongInThirdBatchRowBackend, WrongInMiddleHeadsBackend,
             BackwardRaisesBackend, BackwardOutOfMemoryBackend, ExitsBackend, HardExitsBackend):
    registry.register_backend(_cls.name, f"{__name__}:{_cls.__name__}")
