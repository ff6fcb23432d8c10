"""JAX and PyTorch backends that are right on the probe and wrong where
they are timed, for the harness's tests; registered by importing this
module, as a --backend_modules plugin would be.

Each wraps a correct dense kernel (jax.xla, torch.sdpa_math) and breaks
its output only beyond what the small probe has: more than 1024 tokens
(NaN), a third batch row, or K/V heads past the first two.
"""

import importlib

from lcab import registry

LONGEST_RIGHT = 1024  # the probe of a longer workload is shorter than this


def _nan_beyond_probe(out, seqlen: int):
    # A product keeps the output differentiable: the backward runs, on NaN.
    return out * float("nan") if seqlen > LONGEST_RIGHT else out


def _faulty(base_path: str, name: str, fault):
    """A subclass of the backend at `base_path` ("module:Class") named
    `name`, its output changed by `fault(out, q, k)`."""
    module, attribute = base_path.split(":")
    base = getattr(importlib.import_module(module), attribute)

    class Faulty(base):
        def build(self, workload):
            right = super().build(workload)
            return lambda q, k, v: fault(right(q, k, v), q, k)

    Faulty.name = name
    return Faulty


class _JaxFault:
    """jax.xla, its output changed by `fault(out, q, k)` ((b, s, h, d) arrays)."""

    @classmethod
    def backend(cls):
        return _faulty("jax_backends.kernels.xla:XlaBackend", cls.name, cls.fault)


class JaxNanBeyondProbe(_JaxFault):
    name = "jax.fault_nan_beyond_probe"

    @staticmethod
    def fault(out, q, k):
        return _nan_beyond_probe(out, q.shape[1])


class JaxWrongBatchRow(_JaxFault):
    name = "jax.fault_wrong_batch_row"

    @staticmethod
    def fault(out, q, k):
        return out.at[2].add(1.0) if q.shape[0] > 2 else out


class JaxWrongMiddleHeads(_JaxFault):
    name = "jax.fault_wrong_middle_heads"

    @staticmethod
    def fault(out, q, k):
        heads_kv, group = k.shape[2], q.shape[2] // k.shape[2]
        return out.at[:, :, 2 * group:(heads_kv - 1) * group].add(1.0) if heads_kv > 2 else out


class _TorchFault:
    """torch.sdpa_math, its output changed by `fault(out, q, k)` ((b, h, s, d))."""

    @classmethod
    def backend(cls):
        return _faulty("torch_backends.kernels.sdpa:SdpaMathBackend", cls.name, cls.fault)


class TorchNanBeyondProbe(_TorchFault):
    name = "torch.fault_nan_beyond_probe"

    @staticmethod
    def fault(out, q, k):
        return _nan_beyond_probe(out, q.shape[2])


class TorchWrongBatchRow(_TorchFault):
    name = "torch.fault_wrong_batch_row"

    @staticmethod
    def fault(out, q, k):
        if q.shape[0] <= 2:
            return out
        shift = out.new_zeros(out.shape)
        shift[2] = 1.0
        return out + shift


class TorchWrongMiddleHeads(_TorchFault):
    name = "torch.fault_wrong_middle_heads"

    @staticmethod
    def fault(out, q, k):
        heads_kv, group = k.shape[1], q.shape[1] // k.shape[1]
        if heads_kv <= 2:
            return out
        shift = out.new_zeros(out.shape)
        shift[:, 2 * group:(heads_kv - 1) * group] = 1.0
        return out + shift


FAULTS = (JaxNanBeyondProbe, JaxWrongBatchRow, JaxWrongMiddleHeads,
          TorchNanBeyondProbe, TorchWrongBatchRow, TorchWrongMiddleHeads)
_CLASSES = {f"{fault.__name__}Backend": fault for fault in FAULTS}


def __getattr__(name: str):
    """The backend class of a fault, built on first use so that importing
    this module imports neither framework."""
    if name not in _CLASSES:
        raise AttributeError(name)
    return _CLASSES[name].backend()


for _name, _fault in _CLASSES.items():
    registry.register_backend(_fault.name, f"{__name__}:{_name}")
