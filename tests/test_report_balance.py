"""lcab.report.balance: the dispatches' work balance, recomputed from the
rows' masks, on the CP pages."""

from lcab.cp import make_dispatch, tile_imbalance
from lcab.cp.dispatch import default_chunk
from lcab.masks import make_mask
from lcab.report import balance, pages
from tests.test_report_rows import loaded, row


def _cp_row(strategy, notes, cp=2, **more):
    mask = make_mask("causal_document", 1024, seed=0)
    return row(f"jax.cp_{strategy}", suite="cp", cp_size=cp, strategy=strategy,
               mask="causal_document", seqlen=1024, notes=notes,
               workload_key="causal_document/q1024", mask_fingerprint=mask.fingerprint(),
               **more)


def test_each_dispatch_on_the_page_gets_its_exact_area_and_tile_balance(tmp_path):
    """One line per (mask, length, cp, dispatch), the same for every
    token-splitting strategy on it; Ulysses and USP left out (heads split,
    or tokens dealt over the ring only); dispatch_chunks=N a line of its
    own; the figures those of lcab.cp on the row's own mask."""
    frame = loaded(tmp_path, [
        _cp_row("allgather", "allgather; dispatch=balanced; imbalance=1.0"),
        _cp_row("ring", "ring; dispatch=balanced; imbalance=1.0"),
        _cp_row("ulysses", "ulysses; dispatch=balanced; imbalance=1.000"),
        _cp_row("groupcast", "groupcast; dispatch=balanced; dispatch_chunks=8; imbalance=1.0",
                options={"dispatch_chunks": "8"}),
        _cp_row("ring", "ring; dispatch=zigzag; imbalance=1.0", options={"dispatch": "z"}),
    ])
    table = balance.balance_table(frame)
    mask = make_mask("causal_document", 1024, seed=0)
    assert list(table.index) == [("causal_document", 1024, 2, "balanced"),
                                 ("causal_document", 1024, 2, "balanced/8"),
                                 ("causal_document", 1024, 2, "zigzag")]
    for dispatch, label in ((make_dispatch("balanced", mask, 2), "balanced"),
                            (make_dispatch("balanced", mask, 2,
                                           chunk=default_chunk(1024, 2, 8)), "balanced/8"),
                            (make_dispatch("zigzag", mask, 2), "zigzag")):
        assert table.loc[("causal_document", 1024, 2, label), "tiles"] == (
            f"{tile_imbalance(mask, dispatch):.3f}")
    assert balance.balance_table(loaded(tmp_path / "none", [row("jax.xla")])).empty


def test_a_cp_page_sets_the_balance_beside_the_ratios(tmp_path):
    """Where CP rows stand, their page has the balance table (and a page
    without CP rows has none)."""
    loaded(tmp_path / "cp", [_cp_row("allgather", "allgather; dispatch=balanced"),
                             _cp_row("allgather", "allgather; dispatch=balanced",
                                     direction="bwd")])
    page = pages.write_pages([tmp_path / "cp"], tmp_path / "out")[0].read_text()
    assert "### Work balance of the dispatches" in page
    assert "| causal_document | 1024   | 2       | balanced |" in page
    loaded(tmp_path / "kernel", [row("jax.xla"), row("jax.xla", direction="bwd")])
    page = pages.write_pages([tmp_path / "kernel"], tmp_path / "out2")[0].read_text()
    assert "Work balance" not in page
