"""A calibrated performance model of context parallelism: predicted per-GPU
TFLOP/s of each strategy at any GPU count, from measured kernel curves,
the exact per-rank mask areas and an alpha-beta network model.

    from lcab.model import KernelCurve, Network, Shape, predict
"""

from lcab.model.kernel_curve import KernelCurve
from lcab.model.network import (
    INFINIBAND_NDR,
    NVLINK_H100,
    Network,
    network_from_comm,
    networks_from_comm,
)
from lcab.model.strategies import HBM_H100, STRATEGIES, Prediction, Shape, predict

__all__ = [
    "HBM_H100",
    "INFINIBAND_NDR",
    "NVLINK_H100",
    "STRATEGIES",
    "KernelCurve",
    "Network",
    "Prediction",
    "Shape",
    "network_from_comm",
    "networks_from_comm",
    "predict",
]
