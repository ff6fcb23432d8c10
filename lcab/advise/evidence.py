"""What the advice stands on, for one kind of GPU: the committed canonical
rows measured on it, the kernel curves and links the model is calibrated
on from those rows, and the model's errors against them.

Every canonical run of every sweep on the card is read (lcab.canonical;
reruns of a part as a cluster starts it are left out, as in the tables),
newest row of each measurement first (lcab.results.newest_rows). Lab
folders (results/gpu/, results/cpu/) are not canonical and are not read.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import pandas as pd

from lcab import canonical, results
from lcab.comm import AlphaBeta
from lcab.model import calibration
from lcab.model.kernel_curve import KernelCurve, curve_rows
from lcab.model.network import INFINIBAND_NDR, Network, networks_from_comm
from lcab.model.strategies import HBM_H100, STRATEGIES
from lcab.model.validation import against_published, predicted_vs_measured
from lcab.report import changes, sources
from lcab.report.tables import inner_kernel
from lcab.results import default_options, json_field
from lcab.status import Status

# The cards LCAB has measured, as a user names them, with the memory
# bandwidth (90 % of NVIDIA's figure) the model's ring merges stream at.
DEVICES = {"H100": HBM_H100, "H200": 0.9 * 4.8e12}


class NoEvidence(ValueError):
    """Nothing committed to answer from; the message is one line for the user."""


def counted(row: dict) -> bool:
    """A row a figure may come from: OK and checked at full size."""
    return row.get("status") == Status.OK.value and row.get("check_err") is not None


@dataclasses.dataclass(frozen=True)
class CpBackend:
    """A CP strategy one framework runs, as its rows name it."""
    framework: str
    backend: str    # e.g. jax.cp_ring
    strategy: str   # lcab.model's name for it, e.g. ring
    inner: str      # the kernel it runs inside, e.g. jax.pallas_flex


@dataclasses.dataclass(eq=False)  # compared by identity: its methods are cached
class Evidence:
    device: str                          # "H100"
    folders: tuple[pathlib.Path, ...]    # the canonical runs read, newest first
    rows: list[dict]                     # their newest rows
    memory_bytes_per_s: float
    _cache: dict = dataclasses.field(default_factory=dict, repr=False)

    def _cached(self, key: tuple, build):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    @functools.cached_property
    def cp_folders(self) -> tuple[pathlib.Path, ...]:
        return tuple(f for f in self.folders if canonical.parse_folder(f.name)[2] == "cp")

    def kernel_backends(self, framework: str) -> list[str]:
        """Kernels with counted single-GPU rows (default options) on this card."""
        return sorted({r["backend"] for r in self.rows if r.get("suite") == "kernel"
                       and r.get("framework") == framework and counted(r)
                       and default_options(r.get("options"))})

    def cp_backends(self, framework: str) -> list[CpBackend]:
        """CP strategies of `framework` with a counted row here that the model
        knows (lcab.model.strategies.STRATEGIES), each with its inner kernel."""
        found = {}
        for row in self.rows:
            if (row.get("suite") == "cp" and row.get("framework") == framework and counted(row)
                    and row.get("strategy") in STRATEGIES and inner_kernel(row)):
                found.setdefault(row["backend"], CpBackend(
                    framework, row["backend"], row["strategy"], inner_kernel(row)))
        return [found[name] for name in sorted(found)]

    def unmodelled_cp_backends(self, framework: str) -> dict[str, str]:
        """backend -> its strategy, for counted CP rows the model has no form of."""
        return {row["backend"]: str(row.get("strategy")) for row in self.rows
                if row.get("suite") == "cp" and row.get("framework") == framework
                and counted(row) and row.get("strategy") not in STRATEGIES}

    def family_rows(self, backend: str, mask: str) -> list[dict]:
        """Rows of `backend` (default options) on mask family `mask`, any status."""
        return [r for r in self.rows if r.get("backend") == backend and r.get("mask") == mask
                and default_options(own_options(r))]

    def family_problem(self, backend: str, mask: str) -> str:
        """Why `backend` cannot be modelled on family `mask` here: "" where it
        has counted rows of that family; else what its rows of it said."""
        rows = self.family_rows(backend, mask)
        if any(counted(r) for r in rows):
            return ""
        failed = next((r for r in rows if r.get("status") != Status.OK.value), None)
        said = (f"; its {mask} rows read {failed['status']}: "
                f"{failed.get('reason') or 'no reason recorded'}" if failed else "")
        return f"no counted {mask} rows of {backend} on {self.device} to model it from{said}"

    def curve(self, backend: str, head_dim: int, dtype: str) -> KernelCurve | None:
        """The kernel's measured curve on this card (None without rows)."""
        def build():
            try:
                return KernelCurve.from_rows(self.rows, backend, self.card(),
                                             head_dim=head_dim, dtype=dtype)
            except ValueError:
                return None
        return self._cached(("curve", backend, head_dim, dtype), build)

    def card(self) -> str | None:
        """The rows' full device name, e.g. "NVIDIA H100 80GB HBM3"."""
        names = sorted({str(r.get("device")) for r in self.rows if r.get("status") == "OK"
                        and self.device in str(r.get("device"))})
        return names[0] if names else None

    def network(self, framework: str, gpus_per_node: int, inter: AlphaBeta) -> Network:
        """Links inside a node fitted to the newest cp run's comm rows of
        `framework` on this card, `inter` between nodes."""
        return self.links(framework, gpus_per_node, inter)[0]

    def links(self, framework: str, gpus_per_node: int, inter: AlphaBeta):
        """(Network, calibration.Source) of network()."""
        if not self.cp_folders:
            raise NoEvidence(f"no canonical cp run on {self.device} to fit the links to")
        return self._cached(("links", framework, gpus_per_node, inter), lambda: (
            calibration.links(framework=framework, gpus_per_node=gpus_per_node, inter=inter,
                              paths=self.cp_folders[:1])))

    def curve_folders(self, backend: str, head_dim: int, dtype: str) -> list[str]:
        """The runs the kernel's curve rows came from."""
        return self._cached(("curve_folders", backend, head_dim, dtype), lambda: sorted(
            {shown(r.get("_source", "")) for r in curve_rows(
                self.rows, backend, self.card(), head_dim=head_dim, dtype=dtype)}))

    def published(self, gpus_per_node: int, inter: AlphaBeta, shape) -> pd.DataFrame:
        """The model on JAX's kernel against published CP figures
        (lcab.model.validation.against_published); empty without that kernel."""
        def build():
            kernels = {c.inner for c in self.cp_backends("jax")}
            curve = next((self.curve(k, shape.head_dim, shape.dtype) for k in sorted(kernels)),
                         None)
            if curve is None:
                return pd.DataFrame()
            return against_published(curve, self.network("jax", gpus_per_node, inter), shape,
                                     directions=("fwd",))
        return self._cached(("published", gpus_per_node, inter, shape), build)

    @functools.cached_property
    def validation(self) -> pd.DataFrame:
        """The model against every counted row on this card (lcab.model.validation;
        single-GPU rows left out of their own curve), links inside one node."""
        rows = [r for r in self.rows if counted(r)]
        return predicted_vs_measured(rows, networks_from_comm(
            [r for r in self.rows if r.get("suite") == results.COMM_SUITE or counted(r)],
            gpus_per_node=8, inter=INFINIBAND_NDR))

    def describe(self) -> str:
        """The runs read, one line each: folder, commits, dates, and how far an
        unfinished canonical run has got; then a line
        per later kernel change that rows read here predate (lcab.registry.
        Change): the figures built on them, measured or modelled, describe
        the code before it."""
        lines = []
        for folder in self.folders:
            mine = [r for r in self.rows if _inside(r, folder)]
            line = f"{calibration.where([folder])}: {calibration.about(mine)}"
            if unfinished := sources.progress_text(folder):
                line += (f"; unfinished ({unfinished}): the lengths and families it has not "
                         "reached yet are missing here")
            lines.append(line)
        timed = pd.DataFrame([r for r in self.rows if r.get("suite") in ("kernel", "cp")])
        for change, mine in (changes.predated(timed) if len(timed) else {}).items():
            lines.append(f"{len(mine)} {'/'.join(change.directions)} rows read here predate "
                         f"a later change, so the figures built on them describe the code "
                         f"before it: {changes.described(change)}")
        return "\n".join(lines)


def shown(folder: str | pathlib.Path) -> str:
    """A run's folder as the docs name it: results/<name>."""
    return f"results/{pathlib.Path(folder).name}"


def own_options(row: dict) -> dict:
    """A row's backend options less the CP size and dispatch every CP row
    carries (they have their own columns)."""
    return {key: value for key, value in json_field(row.get("options")).items()
            if key not in ("cp_size", "dispatch")}


def _inside(row: dict, folder: pathlib.Path) -> bool:
    return row.get("_source") == str(folder)


def device_label(name: str) -> str:
    """"h100", "H100", "NVIDIA H100 80GB HBM3" -> "H100"; ValueError otherwise."""
    for device in DEVICES:
        if device.lower() in name.lower():
            return device
    raise ValueError(f"--device={name}: LCAB has measured {', '.join(DEVICES)}")


@functools.cache
def load(device: str, root: pathlib.Path | None = None) -> Evidence:
    """The evidence of one card from the canonical runs under `root`
    (default: this checkout's results/)."""
    device = device_label(device)
    root = canonical.RESULTS if root is None else pathlib.Path(root)
    folders = [folder for sweep in canonical.SWEEPS for folder in canonical.folders(sweep, root)
               if canonical.parse_folder(folder.name)[1].startswith(device.lower())]
    if not folders:
        raise NoEvidence(f"no canonical run on {device} under {root}")
    rows = []
    for folder in folders:
        for row in results.read_rows(sources.result_files([folder])):
            row["_source"] = str(folder)
            rows.append(row)
    return Evidence(device, tuple(folders), results.newest_rows(rows), DEVICES[device])
