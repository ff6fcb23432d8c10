"""The README's headline: the best kernel and CP strategy of each framework.

    from lcab.report import headline
    headline.markdown()      # tables of the current canonical rows
    headline.provenance()    # sweep -> Source(folder, commit, device, date, rows)
    headline.caption()       # that, as one line per sweep

From one run of each canonical sweep: the most complete of its current
runs (the newest on each card, lcab.canonical.current), and of runs
equally complete the one with fewer marked (†) rows; a line under the
tables names the other cards' current runs, whose tables are on the
results pages:

- kernels: per mask, at the longest length that every backend of the
  mask reached (a row of any status: an unfinished part's length, where
  only some have run, would crown whichever ran), the fastest backend of
  each framework in each direction;
- context parallel: per mask, at every global length a strategy ran
  (cp sizes run different lengths: tokens per GPU x cp), the fastest
  strategy of each framework and cp size in each direction (per-GPU
  TFLOP/s), beside the fastest single-GPU kernel of the same run at that
  length.

Only rows that count are ranked: status OK and a full-size check at that
very workload (check_err present); a failed, mismatched or unchecked row
never heads the table. Cells are "612 fa3": the figure, then the backend
without its framework's prefix (options appended where a backend ran with
several). A folder with CP rows heads the CP table, its kernel rows as the
"1 GPU" columns; block-sparse keep sweeps are left to their
page. Ties go to the alphabetically first line, so the text is
deterministic.
"""

from __future__ import annotations

import pandas as pd

from lcab import canonical
from lcab.report import changes, legend, measure, tables
from lcab.report import sources as loading
from lcab.status import Status
from lcab.workloads import format_seqlen


def counted(rows: pd.DataFrame, require_check: bool = True) -> pd.DataFrame:
    """The rows a headline may rank: OK, and (by default) checked at full size."""
    ok = rows["status"] == Status.OK.value
    if require_check:
        ok &= pd.to_numeric(rows["check_err"], errors="coerce").notna()
    return rows[ok]


def _short(line: str, framework: str) -> str:
    """"ring/jax.cp_ring [dispatch=x]" -> "cp_ring [dispatch=x]"; "jax.fa3" -> "fa3"."""
    return line.split("/", 1)[-1].removeprefix(f"{framework}.")


def _best(rows: pd.DataFrame, shown: measure.Measure, winners: list | None = None
          ) -> tuple[str, str] | None:
    """(figure, short line name) of the best row, the figure marked with the
    later changes to its kernel that can move it (changes.mark); None for no row. The
    best row is appended to `winners` when given."""
    if rows.empty:
        return None
    # Best first, then by line name: a tie has one answer.
    ranked = rows.assign(_value=rows[shown.column].astype(float)).sort_values(
        ["_value", "line"], ascending=[not shown.higher_is_better, True], kind="stable")
    best = ranked.iloc[0]
    if winners is not None:
        winners.append(best.drop("_value"))
    figure = measure.format_number(float(best["_value"])) + changes.mark(best)
    return figure, _short(best["line"], best["framework"])


def _cell(bests: list[tuple[str, str] | None]) -> str:
    """"350 / 500 fa3" where one line wins every direction, else
    "350 b / 500 a"; a direction without a counted row is blank."""
    if not any(bests):
        return ""
    names = {best[1] for best in bests if best}
    if len(names) == 1 and all(bests):
        return " / ".join(figure for figure, _ in bests) + f" {names.pop()}"
    return " / ".join(f"{best[0]} {best[1]}" if best else "" for best in bests).strip()


def frameworks_of(rows: pd.DataFrame) -> list[str]:
    """Frameworks in table order: tables.FRAMEWORK_ORDER, then others alphabetically."""
    present = set(rows["framework"])
    return ([f for f in tables.FRAMEWORK_ORDER if f in present]
            + sorted(present - set(tables.FRAMEWORK_ORDER)))


def reached_lengths(rows: pd.DataFrame) -> dict[str, int]:
    """Per mask, the longest length at which every line that ran the mask
    has a row of any status (its longest length where none has them all)."""
    reached = {}
    for mask, mine in rows.groupby("mask", sort=False):
        lines = set(mine["line"])
        whole = [length for length, here in mine.groupby("seqlen") if set(here["line"]) >= lines]
        reached[mask] = max(whole) if whole else mine["seqlen"].max()
    return reached


def best_table(rows: pd.DataFrame, frameworks: list[str], by_cp_size: bool = False,
               winners: list | None = None, lengths: dict[str, int] | None = None
               ) -> pd.DataFrame:
    """Per mask (tables.mask_order), at its length in `lengths`
    (reached_lengths; its longest counted one where not given; for CP rows,
    at every length a strategy ran), the best line of each framework (and
    cp size, for CP rows; cp size 1 is the kernel alone), "fwd / bwd".

    rows: counted rows of one setting with "line" (tables.with_line);
    winners: a list that receives the row behind every figure shown.
    Columns: "jax", "torch", ... or "jax, cp 2", "torch, cp 2", "jax, cp 4", ...
    """
    shown = measure.of_rows(rows)
    directions = [d for d in tables.DIRECTIONS if (rows["direction"] == d).any()]
    sizes = sorted(int(s) for s in pd.unique(rows["cp_size"])) if by_cp_size else [None]
    # CP: each framework's one-GPU kernel, then its strategies by cp size.
    columns = [(framework, size) for framework in frameworks for size in sizes]
    records, index = [], []
    for mask in tables.mask_order(rows["mask"]):
        mine = rows[rows["mask"] == mask]
        if by_cp_size:  # every length a strategy ran at: cp sizes run different lengths
            shown_lengths = sorted(pd.unique(mine.loc[mine["cp_size"] > 1, "seqlen"]))
        else:
            shown_lengths = [(lengths or {}).get(mask, mine["seqlen"].max())]
        for length in shown_lengths:
            here = mine[mine["seqlen"] == length]
            records.append([_cell([_best(here[
                (here["framework"] == framework) & (here["direction"] == direction)
                & ((here["cp_size"] == size) if size else True)], shown, winners)
                for direction in directions]) for framework, size in columns])
            index.append((mask, format_seqlen(int(length))))
    names = [framework if size is None else f"{framework}, 1 GPU" if size == 1
             else f"{framework}, cp {size}" for framework, size in columns]
    return pd.DataFrame(records, columns=names, index=pd.MultiIndex.from_tuples(
        index, names=["mask", "length"]) if index else None)


def _other_cards(chosen: dict) -> list[str]:
    """A link per current run the headline leaves out: "[cp on h100](folder)
    (5 of 76 parts done)"."""
    shown = set(chosen.values())
    found = []
    for folder in loading.current_folders().values():
        if folder in shown:
            continue
        _, device, sweep = canonical.parse_folder(folder.name)
        path = loading.shown_path(folder)
        progress = loading.progress_text(folder)
        found.append(f"[{sweep} on {device}]({path})" + (f" ({progress})" if progress else ""))
    return found


def provenance(folders: loading.Folders = None) -> dict[str, loading.Source]:
    """sweep -> the Source its headline rows came from (folder, commit,
    device, date, rows)."""
    chosen = loading.headline_folders() if folders is None else folders
    return {sweep: source for sweep, (source, _) in loading.load_sweeps(chosen).items()}


def caption(folders: loading.Folders = None) -> str:
    """One line per sweep: "blog: results/..., commit abc1234, NVIDIA H100, 2026-11-28 (...)"."""
    return "\n".join(source.caption() for source in provenance(folders).values())


def _sections(sweep: str, source: loading.Source, frame: pd.DataFrame, require_check: bool):
    """(title, table or None, the rows behind its figures) per setting of
    one sweep: its CP table, or else its kernel table; None where it has
    candidates but none counted."""
    has_cp = (frame["suite"] == "cp").any()
    rows = tables.suite_rows(frame, "cp" if has_cp else "kernel")
    if has_cp:  # beside the strategies, the kernel they run inside, on one GPU
        single = tables.suite_rows(frame, "kernel")
        rows = pd.concat([single.assign(cp_size=1), rows], ignore_index=True)
    else:  # a keep sweep's settings would each be a row: its page has them
        rows = rows[~rows["mask"].map(tables.swept_label)]
    what = ("best CP strategy (per-GPU) and the best kernel on one GPU" if has_cp
            else "best kernel")
    for label, group in tables.setting_groups(tables.with_line(rows)):
        unit = measure.of_rows(group).name
        directions = " / ".join(d for d in tables.DIRECTIONS if (group["direction"] == d).any())
        where = "at each length" if has_cp else "at each mask's longest length run by all"
        title = (f"**{sweep}**: {what} of each framework, {unit} {directions}, {where}; "
                 f"{label.rsplit(' on ', 1)[0]}; rows "
                 f"[{source.folder}]({source.folder}) at {source.commit}, {source.device}, "
                 f"{source.date}"
                 + (f"; **unfinished: {source.progress}**" if source.progress else ""))
        reached = None if has_cp else reached_lengths(group)
        group, winners = counted(group, require_check), []
        table = (best_table(group, frameworks_of(group), by_cp_size=has_cp, winners=winners,
                            lengths=reached) if len(group) else None)
        yield title, table, pd.DataFrame(winners)


def markdown(folders: loading.Folders = None, *, require_check: bool = True) -> str:
    """The headline tables of the current canonical rows (or of `folders`:
    a mapping sweep -> folder, or folder paths)."""
    parts = []
    chosen = loading.headline_folders() if folders is None else folders
    shown_rows = []
    for sweep, (source, frame) in loading.load_sweeps(chosen).items():
        for title, table, winners in _sections(sweep, source, frame, require_check):
            shown = tables.to_markdown(table) if table is not None else (
                "_(no OK row with the full-size check)_")
            parts += [title, "", shown, ""]
            shown_rows.append(winners)
    # The changes the figures shown predate, each once: exactly those
    # behind the marks.
    if any(legend.FLAG_CHANGED in part for part in parts):
        parts += [*changes.markdown(pd.concat(shown_rows, ignore_index=True), count=False), ""]
    if not parts:
        parts = ["_(no canonical sweep has committed rows yet)_", ""]
    if folders is None and (others := _other_cards(chosen)):
        parts += ["Current runs on other cards (tables on the results pages): "
                  + "; ".join(others) + ".", ""]
    return "\n".join(parts).rstrip("\n") + "\n"
