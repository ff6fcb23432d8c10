"""jax.cp_usp: Ulysses all_to_all inside groups of `ulysses_size` ranks,
ring attention across the groups, on a (ring, ulysses) mesh
(jax_backends/cp/ring.py runs both)."""

from __future__ import annotations

from jax_backends.cp.ring import RingBackend


class UspBackend(RingBackend):
    name = "jax.cp_usp"
    strategy = "usp"
    description = ("USP: Ulysses all_to_all inside groups of ulysses_size ranks, ring attention "
                   "across the groups, on a (ring, ulysses) mesh (inner kernel with a "
                   "log-sum-exp inside)")
    grouped = True
    options = {**RingBackend.options, "ulysses_size": int}

    def __init__(self, ulysses_size: int = 2, **options):
        super().__init__(**options)
        self.ulysses_size = ulysses_size

    def probe_heads_kv(self, workload):
        return min(workload.heads_kv, self.ulysses_size)

    def case_notes(self, workload) -> str:
        # The row says its layout: the model and the advice read it back.
        return f"{super().case_notes(workload)}; ulysses_size={self.ulysses_size}"
