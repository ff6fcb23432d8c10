"""The work balance of the dispatches a page's CP rows ran on: how much
more the most loaded rank holds than the mean, in visible pairs and in the
128 x 128 tiles its queries touch. A block-sparse kernel's time follows
its tiles, so a strategy's per-GPU figure falls about as far as the tile
column stands over 1; the page sets it beside the ratios to one GPU.

Recomputed exactly from each row's mask (rebuilt from its parameters) and
the dispatch its notes name, so rows written before the notes carried
`tile_imbalance` are covered too."""

from __future__ import annotations

import pandas as pd

from lcab.cp import cached_dispatch, imbalance, tile_imbalance
from lcab.model.validation import dispatch_chunks_of, dispatch_of, mask_of
from lcab.report.tables import sorted_index, suite_rows
from lcab.status import Status

# Strategies whose ranks do not each hold the dispatch's tokens over all
# heads: Ulysses splits heads (every rank sees the whole sequence), USP
# deals tokens over its ring of groups only.
_NOT_TOKEN_SPLIT = ("ulysses", "usp")
INDEX = ["mask", "seqlen", "cp_size", "dispatch"]


def balance_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Index (mask, seqlen, cp_size, dispatch); columns area and tiles (the
    largest rank over the mean, 1.000 even), one line per dispatch the
    page's token-splitting CP rows ran on (a dispatch_chunks=N setting
    reads "balanced/N"). Empty without such rows."""
    cp = suite_rows(frame, "cp")
    cp = cp[(cp["status"] == Status.OK.value) & ~cp["strategy"].isin(_NOT_TOKEN_SPLIT)]
    records, masks = {}, {}
    for _, row in cp.iterrows():
        notes = str(row.get("notes") or "")
        name, chunks = dispatch_of(notes), dispatch_chunks_of(notes)
        label = name if chunks is None else f"{name}/{chunks}"
        key = (row["mask"], int(row["seqlen"]), int(row["cp_size"]), label)
        if key in records:
            continue
        try:
            if row["workload_key"] not in masks:  # one rebuild per workload
                masks[row["workload_key"]] = mask_of(row)
            mask = masks[row["workload_key"]]
            dispatch = cached_dispatch(name, mask, int(row["cp_size"]), chunks)
        except (ValueError, KeyError, TypeError):
            continue  # a mask or dispatch that cannot be rebuilt here: left out
        records[key] = (f"{imbalance(mask, dispatch):.3f}",
                        f"{tile_imbalance(mask, dispatch):.3f}")
    if not records:
        return pd.DataFrame(columns=["area", "tiles"])
    table = pd.DataFrame.from_dict(records, orient="index", columns=["area", "tiles"])
    table.index = pd.MultiIndex.from_tuples(table.index, names=INDEX)
    return table.loc[sorted_index(table.reset_index(), INDEX)]
