"""Collective times from an alpha-beta model per link level.

Two levels: the GPUs of one node (NVLink) and the network between nodes. A
collective whose ranks span more than one node runs at the network's rate
(a ring crosses a node boundary at every step; all-to-all sends the share
bound for other nodes over the network while the rest stays on NVLink).
Each level's beta is a *bus* bandwidth (nccl-tests' convention,
lcab/comm.py), so one formula serves every op:

    ppermute    alpha + bytes / beta
    all_gather  alpha + (n - 1) / n * bytes / beta      (bytes = the output)
    all_to_all  alpha + (n - 1) / n * bytes / beta      (within a node)

Defaults. Inside a node: the links are fitted to comm rows
(`network_from_comm`; lcab.model.calibration picks the rows) of one
framework, the one whose strategies are modelled: each framework times its
own collectives (JAX's and torch's differ), and a fit over both would
describe neither. An op without rows keeps NVLINK_H100, fitted to the comm suite's rows on four H100s joined
by NVLink (results/gpu/2026-11-26-h100x4-cp/comm, 4 ranks). Between nodes:
InfiniBand NDR, 400 Gb/s = 50 GB/s per GPU (one NIC per GPU, as in NVIDIA's
DGX H100), of which nccl-tests typically reach about 80 %: 40 GB/s, and
20 us per collective. These are published figures, not measurements here.
"""

from __future__ import annotations

import dataclasses

from lcab.comm import COMM_OPS, AlphaBeta, bus_factor, fit_alpha_beta

# Fitted to results/gpu/2026-11-26-h100x4-cp/comm at 4 ranks (bus bandwidth).
NVLINK_H100 = {
    "ppermute": AlphaBeta(26.0e-6, 202e9),
    "all_gather": AlphaBeta(26.1e-6, 278e9),
    "all_to_all": AlphaBeta(26.1e-6, 246e9),
}
INFINIBAND_NDR = AlphaBeta(20e-6, 40e9)


@dataclasses.dataclass(frozen=True)
class Network:
    gpus_per_node: int = 8
    intra: dict = dataclasses.field(default_factory=lambda: dict(NVLINK_H100))
    inter: AlphaBeta = INFINIBAND_NDR

    def __post_init__(self):
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node={self.gpus_per_node} must be >= 1")
        missing = set(COMM_OPS) - set(self.intra)
        if missing:
            raise ValueError(f"no intra-node link for {sorted(missing)}")

    def seconds(self, op: str, nbytes: float, ranks: int) -> float:
        """One `op` of `nbytes` per rank (all_gather: its output) over `ranks`."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        share = bus_factor(op, ranks)  # 1 for ppermute, (n-1)/n otherwise
        inside = self.intra[op]
        if ranks <= self.gpus_per_node:
            return inside.alpha_s + share * nbytes / inside.beta_bytes_per_s
        if op == "all_to_all":
            staying = (self.gpus_per_node - 1) / ranks * nbytes / inside.beta_bytes_per_s
            leaving = (ranks - self.gpus_per_node) / ranks * nbytes / self.inter.beta_bytes_per_s
            return self.inter.alpha_s + max(staying, leaving)
        return self.inter.alpha_s + share * nbytes / self.inter.beta_bytes_per_s

    def with_bandwidth(self, factor: float) -> "Network":
        """Every beta scaled by `factor` (what-if and monotonicity checks)."""
        scale = lambda ab: AlphaBeta(ab.alpha_s, ab.beta_bytes_per_s * factor)  # noqa: E731
        return dataclasses.replace(self, intra={op: scale(ab) for op, ab in self.intra.items()},
                                   inter=scale(self.inter))


def network_from_comm(rows, *, framework: str, gpus_per_node: int = 8,
                      inter: AlphaBeta = INFINIBAND_NDR) -> Network:
    """Intra-node links fitted to `framework`'s comm rows (comm_fits); an op
    without rows to fit keeps its NVLINK_H100 constant."""
    fitted = {op: link for op, (link, _) in comm_fits(rows, framework).items()}
    return Network(gpus_per_node=gpus_per_node, intra={**NVLINK_H100, **fitted}, inter=inter)


def networks_from_comm(rows, *, gpus_per_node: int = 8,
                       inter: AlphaBeta = INFINIBAND_NDR) -> dict[str, Network]:
    """framework -> network_from_comm of its rows, for every framework that
    `rows` measured (attention or comm rows)."""
    frameworks = {row["framework"] for row in rows if row.get("framework")}
    return {name: network_from_comm(rows, framework=name, gpus_per_node=gpus_per_node,
                                    inter=inter) for name in sorted(frameworks)}


def comm_rows(rows, framework: str) -> list:
    """The OK, timed comm rows of `framework`'s collectives."""
    return [r for r in rows if r.get("suite") == "comm" and r.get("framework") == framework
            and r.get("status") == "OK" and r.get("median_ms")]


def comm_fits(rows, framework: str) -> dict[str, tuple[AlphaBeta, list]]:
    """op -> (its link, the rows fitted): per op, `framework`'s OK comm rows
    of the largest rank count measured, fitted as time = alpha + bus bytes /
    beta. An op with no such rows, or too few sizes to fit, is left out."""
    fits = {}
    mine = comm_rows(rows, framework)
    for op in COMM_OPS:
        ok = [r for r in mine if r.get("op") == op]
        if not ok:
            continue
        ranks = max(r["ranks"] for r in ok)
        ok = [r for r in ok if r["ranks"] == ranks]
        try:
            fits[op] = (fit_alpha_beta([r["bytes"] * bus_factor(op, ranks) for r in ok],
                                       [r["median_ms"] * 1e-3 for r in ok]), ok)
        except ValueError:
            continue
    return fits
