"""Comparison tables from result rows (the DataFrame of `lcab.results.load`).

Every table is a DataFrame of strings, ready for markdown or CSV: an OK row
shows its TFLOP/s rounded to an integer (two significant digits below 10),
or on a CPU its median milliseconds (lcab.report.measure), any other row the
short code of its status (`lcab.status.CODES`, explained by
lcab.report.legend), and a combination that was never measured an empty
string. Each table function
first keeps only the newest row of each measurement (`latest`) and expects
one setting group (`setting_groups`):
numbers from different shapes, dtypes or devices never share a table.
A mask family run with several settings of its sparsity parameters
(SWEPT_MASK_PARAMS: keep, block_size) names each setting in the mask column,
e.g. "block_sparse(keep=0.2, block=128)" (`label_mask_settings`), so rows of
one (mask, seqlen) at two keep values are two table rows, never one cell.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import pandas as pd

from lcab import results
from lcab.flops import TIMED_DIRECTIONS
from lcab.masks.factory import MASK_NAMES
from lcab.report import changes, legend, measure
from lcab.report.legend import FLAG_UNCHECKED, FLAG_UNSTEADY
from lcab.results import MEASUREMENT_KEY, inner_kernel
from lcab.runtime import SPREAD_LIMIT
from lcab.status import CODES, Status

DIRECTIONS = TIMED_DIRECTIONS
# Column order of every table: these frameworks first, in this order, then any
# other framework alphabetically; backends alphabetically inside a framework.
FRAMEWORK_ORDER = ("jax", "torch")
# Rows that may share one table. The device is a setting: an H100 and an
# H200 number side by side would read as a comparison of kernels.
SETTING_COLUMNS = ("batch", "heads_q", "heads_kv", "head_dim", "dtype", "device")
KERNEL_INDEX = ("mask", "seqlen")
CP_INDEX = ("mask", "seqlen", "direction", "cp_size")
CROSS_INDEX = ("mask", "seqlen", "direction")
CP_SHORT_INDEX = ("mask", "seqlen", "cp_size")
# Mask parameters a sweep may vary at one sequence length (the block-sparse
# families'), with their short names in a mask label.
SWEPT_MASK_PARAMS = {"keep": "keep", "block_size": "block"}


# ---------------------------------------------------------------- row selection


def _oldest_first(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by timestamp (stable, rows without a time first)."""
    times = pd.to_datetime(frame["timestamp"], utc=True, errors="coerce", format="ISO8601")
    order = times.reset_index(drop=True).sort_values(kind="stable", na_position="first").index
    return frame.iloc[order]


def latest(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per measurement (MEASUREMENT_KEY): the one with the newest timestamp.

    The kept rows stay in their original order (the order of the files).
    """
    positions = pd.Series(range(len(frame)), index=frame.index)
    newest = _oldest_first(frame.assign(_position=positions.to_numpy()))
    newest = newest.drop_duplicates(subset=list(MEASUREMENT_KEY), keep="last")
    return newest.sort_values("_position", kind="stable").drop(columns="_position")


def suite_rows(frame: pd.DataFrame, suite: str) -> pd.DataFrame:
    """The newest rows of one suite ("kernel" or "cp"), masks labelled with
    their sparsity setting where a family ran with several."""
    # Labelled over every suite, so kernel and CP rows of one frame agree.
    labelled = label_mask_settings(frame)
    return latest(labelled[labelled["suite"] == suite])


def swept_params(mask_params) -> dict:
    """The SWEPT_MASK_PARAMS of a row's mask_params (JSON text or dict)."""
    params = results.json_field(mask_params)
    return {name: params[name] for name in SWEPT_MASK_PARAMS if name in params}


def _param_text(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def mask_setting_label(mask: str, params: Mapping) -> str:
    """E.g. "block_sparse(keep=0.2, block=128)"; the mask alone without params."""
    if not params:
        return str(mask)
    inner = ", ".join(f"{SWEPT_MASK_PARAMS[name]}={_param_text(params[name])}"
                      for name in SWEPT_MASK_PARAMS if name in params)
    return f"{mask}({inner})"


def swept_label(mask: str) -> bool:
    """Whether a mask column value carries its setting (mask_setting_label)."""
    return str(mask).endswith(")") and "(" in str(mask)


def label_mask_settings(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of a mask family that ran with several settings of
    SWEPT_MASK_PARAMS get theirs in the mask column (mask_setting_label).

    Tables key cells by (mask, seqlen): without this, two keep values of one
    seqlen would share a cell and only the newer would be shown. A family with
    one setting keeps its plain name; labelling twice changes nothing.
    """
    if frame.empty or "mask_params" not in frame:
        return frame
    params = frame["mask_params"].map(swept_params)
    settings = params.map(lambda p: tuple(sorted(p.items())))
    several = settings.groupby(frame["mask"], sort=False).nunique() > 1
    relabel = frame["mask"].isin(several.index[several])
    if not relabel.any():
        return frame
    masks = [mask_setting_label(mask, p) if r else mask
             for mask, p, r in zip(frame["mask"], params, relabel)]
    return frame.assign(mask=masks)


def _int_text(value) -> str:
    return str(int(value)) if pd.notna(value) else "?"


def setting_label(setting: dict) -> str:
    """E.g. "batch 1, heads 64:8, head_dim 128, bfloat16 on NVIDIA H200"."""
    return (
        f"batch {_int_text(setting['batch'])}, "
        f"heads {_int_text(setting['heads_q'])}:{_int_text(setting['heads_kv'])}, "
        f"head_dim {_int_text(setting['head_dim'])}, {setting['dtype']} on "
        f"{'an unknown device' if pd.isna(setting['device']) else setting['device']}"
    )


def setting_groups(frame: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    """(label, rows) for each setting (SETTING_COLUMNS), in order of first appearance."""
    if frame.empty:
        return
    groups = frame.groupby(list(SETTING_COLUMNS), sort=False, dropna=False)
    for values, group in groups:
        yield setting_label(dict(zip(SETTING_COLUMNS, values))), group


def single_setting(rows: pd.DataFrame, what: str) -> str:
    """The label of the one setting group of `rows`; several is an error."""
    labels = [label for label, _ in setting_groups(rows)]
    if len(labels) != 1:
        raise ValueError(
            f"{what} needs rows of exactly one setting, got {len(labels)}: {labels}; "
            "split them with lcab.report.setting_groups"
        )
    return labels[0]


# ---------------------------------------------------------------- ordering


def backend_order(frame: pd.DataFrame) -> list[str]:
    """Backends of the frame: FRAMEWORK_ORDER first, alphabetical inside."""
    pairs = frame[["framework", "backend"]].drop_duplicates()

    def rank(pair):
        framework, backend = pair
        if framework in FRAMEWORK_ORDER:
            return (FRAMEWORK_ORDER.index(framework), "", str(backend))
        return (len(FRAMEWORK_ORDER), str(framework), str(backend))

    return [backend for _, backend in sorted(pairs.itertuples(index=False), key=rank)]


def line_label(strategy, backend: str) -> str:
    """A CP line: "ring/jax.cp_ring" (the backend alone when no strategy)."""
    return f"{strategy}/{backend}" if pd.notna(strategy) and strategy != "" else str(backend)


def _options(value) -> dict:
    """A row's backend options as a dict ({} for none, also for old rows)."""
    return json.loads(results.options_key(value))


def varying_options(rows: pd.DataFrame) -> pd.Series:
    """Per row, " [key=value, ...]" of the options that differ between the
    rows of its backend (one dispatch against another, two inner kernels,
    two block sizes), "" where a backend ran with one set: what tells its
    lines or columns apart."""
    if "options" not in rows or rows.empty:
        return pd.Series("", index=rows.index, dtype=object)
    parsed = rows["options"].map(_options)
    suffixes = pd.Series("", index=rows.index, dtype=object)
    for _, group in parsed.groupby(rows["backend"]):
        # cp_size has its own column in every CP table.
        keys = sorted({k for options in group for k in options} - {"cp_size"})
        varying = [k for k in keys if len({str(o.get(k)) for o in group}) > 1]
        if varying:
            suffixes[group.index] = [
                " [" + ", ".join(f"{k}={o.get(k, '-')}" for k in varying) + "]" for o in group]
    return suffixes


def with_line(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with a "line" column naming their CP curve (see line_label),
    the options that tell a backend's runs apart appended."""
    suffixes = varying_options(rows)
    return rows.assign(line=[line_label(s, b) + x for s, b, x in
                             zip(rows["strategy"], rows["backend"], suffixes)])


def line_order(rows: pd.DataFrame) -> list[str]:
    """CP lines in backend order, then by strategy, then by options."""
    rows = rows if "line" in rows else with_line(rows)
    backends = backend_order(rows)
    triples = rows[["backend", "strategy", "line"]].drop_duplicates()
    ranked = sorted(
        triples.itertuples(index=False),
        key=lambda triple: (backends.index(triple[0]), str(triple[1]), triple[2]),
    )
    return list(dict.fromkeys(line for _, _, line in ranked))


def mask_order(masks: Iterable[str]) -> list[str]:
    """The masks (family names or mask_setting_label) in report order: by
    family in the order lcab.masks registers them (full, causal, ...), each
    family's settings and unknown names in order of first appearance.

    Not the order of the files: a canonical folder's parts sort by name,
    which would put causal before full.
    """
    unique = list(dict.fromkeys(masks))

    def family_rank(mask: str) -> int:
        family = str(mask).split("(", 1)[0]
        return MASK_NAMES.index(family) if family in MASK_NAMES else len(MASK_NAMES)
    return sorted(unique, key=family_rank)


def _sort_rank(column: pd.Series, masks: Sequence[str]) -> pd.Series:
    """Sort key of one index column: masks in mask_order, directions fwd first."""
    if column.name == "mask":
        return column.map({mask: i for i, mask in enumerate(masks)})
    if column.name == "direction":
        return column.map(lambda d: DIRECTIONS.index(d) if d in DIRECTIONS else len(DIRECTIONS))
    if column.name in ("seqlen", "cp_size"):
        return pd.to_numeric(column, errors="coerce")
    return column


def sorted_index(rows: pd.DataFrame, columns: Sequence[str]) -> pd.MultiIndex:
    """Every combination of `columns` present in rows, in report order."""
    masks = mask_order(rows["mask"])
    combos = rows[list(columns)].drop_duplicates().sort_values(
        by=list(columns), key=lambda column: _sort_rank(column, masks), kind="stable"
    )
    return pd.MultiIndex.from_frame(combos)


# ---------------------------------------------------------------- cells


def status_code(status: str) -> str:
    """The short code of a non-OK status (E, X, -, ERR, MM)."""
    try:
        return CODES[Status(status)]
    except (ValueError, KeyError):
        raise ValueError(
            f"status={status!r} has no table code; expected one of {[str(s) for s in CODES]}"
        ) from None


def format_cell(status: str, value: float, spread: float | None = None,
                checked: bool = True, changed: str = "") -> str:
    """"612" (or "0.041" below 10) for an OK row's value (TFLOP/s, or median
    ms on a CPU: format_row picks), its status code otherwise.

    An OK figure carries FLAG_UNSTEADY when its samples spread more than
    SPREAD_LIMIT (p80 / p20), FLAG_UNCHECKED when no full-size check
    (lcab.fullcheck) stands behind it and `changed`, the mark of the later
    changes to its kernel that can move it (changes.mark: "†5,11"), if any.
    """
    if status != Status.OK.value:
        return status_code(status)
    if pd.isna(value):
        raise ValueError("an OK row has no tflops value; the result file is corrupt")
    text = measure.format_number(value)
    if spread is not None and pd.notna(spread) and spread > SPREAD_LIMIT:
        text += FLAG_UNSTEADY
    if not checked:
        text += FLAG_UNCHECKED
    return text + changed


def format_row(row, mark_changes: bool = True) -> str:
    """format_cell of a result row (a Series or mapping with the schema's
    columns): its TFLOP/s, or its median ms where it ran on a CPU. A
    dated record of one version (docs/earlier_measurements.md) leaves
    later changes unmarked (`mark_changes=False`): its heading names the
    version."""
    check = row.get("check_err")
    shown = measure.of_device(row.get("device")).column
    return format_cell(row["status"], row.get(shown), row.get("spread"),
                       checked=check is not None and pd.notna(check),
                       changed=changes.mark(row) if mark_changes else "")


def _one_row_per_cell(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Drop rows that a newer row of the same table cell hides, saying so.

    This happens when two different workloads share a cell, e.g. the same
    mask family drawn with two seeds: the table can show only one.
    """
    newest_last = _oldest_first(rows)
    hidden = newest_last.duplicated(subset=keys, keep="last")
    if hidden.any():
        example = newest_last[hidden].iloc[0]
        warnings.warn(
            f"{int(hidden.sum())} row(s) share a table cell with a newer row and are not shown, "
            f"e.g. {example['backend']} on {example['workload_key']} ({example['direction']})"
        )
    return newest_last[~hidden]


def cell_table(
    rows: pd.DataFrame, index: Sequence[str], column: str, columns: Sequence[str],
    row_index: pd.MultiIndex, formatter: Callable[[pd.Series], str] = format_row,
) -> pd.DataFrame:
    """Pivot rows into `row_index` x `columns` cells, each `formatter(row)`
    (by default formatted TFLOP/s or the status code)."""
    index, keys = list(index), [*index, column]
    table = pd.DataFrame(index=row_index, columns=list(columns), dtype=object)
    if not rows.empty:
        rows = _one_row_per_cell(rows, keys)
        cells = pd.Series(
            [formatter(row) for _, row in rows.iterrows()],
            index=pd.MultiIndex.from_frame(rows[keys]),
            dtype=object,
        )
        table = cells.unstack(column).reindex(index=row_index, columns=list(columns))
    table.columns.name = None
    return table.astype(object).fillna("")


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} is not one of {DIRECTIONS}")


# ---------------------------------------------------------------- tables


def kernel_table(frame: pd.DataFrame, direction: str) -> pd.DataFrame:
    """TFLOP/s of every kernel backend: index (mask, seqlen), one column per
    backend, or per option set where a backend ran with several
    ("jax.pallas_flex [fused_backward=true]").

    Rows and columns cover every direction, so the fwd and bwd tables line up.
    """
    _check_direction(direction)
    rows = suite_rows(frame, "kernel")
    if not rows.empty:
        single_setting(rows, "kernel_table")
    rows = with_line(rows)  # kernels have no strategy: the backend, options appended
    return cell_table(
        rows[rows["direction"] == direction], KERNEL_INDEX, "line", line_order(rows),
        sorted_index(rows, KERNEL_INDEX),
    )


def paired_kernel_table(frame: pd.DataFrame) -> pd.DataFrame:
    """kernel_table's cells as "fwd / bwd", without the backends that were
    unavailable on every row (packages not installed there).

    A side that did not run stays empty ("612 /" when only the forward ran).
    """
    fwd, bwd = kernel_table(frame, "fwd"), kernel_table(frame, "bwd")
    paired = fwd.combine(bwd, lambda f, b: f.str.cat(b, sep=" / ").str.strip().replace("/", ""))
    unavailable = status_code(Status.UNAVAILABLE.value)
    absent = [c for c in paired.columns
              if ((fwd[c] == unavailable) | (fwd[c] == "")).all()
              and ((bwd[c] == unavailable) | (bwd[c] == "")).all()]
    return paired.drop(columns=absent)


def _best(ok_rows: pd.DataFrame, framework: str) -> pd.Series | None:
    """The framework's fastest OK row (the most TFLOP/s: one cell is one workload)."""
    mine = ok_rows[ok_rows["framework"] == framework]
    if mine.empty:
        return None
    return mine.loc[mine["tflops"].idxmax()]


def cross_framework_table(
    frame: pd.DataFrame, frameworks: Sequence[str] = FRAMEWORK_ORDER, suite: str = "kernel"
) -> pd.DataFrame:
    """Best backend of each framework per (mask, seqlen, direction[, cp_size]),
    and their ratio.

    Only OK rows of the suite count (for "cp", per-GPU TFLOP/s at each cp
    size). The ratio is first / second framework (jax/torch) of unrounded
    TFLOP/s, to 2 decimals: above 1, the first is faster. Rows run on a CPU
    show median ms (measure.of_rows), the ratio is still one of speeds.
    Cells are empty where a framework has no OK row.
    """
    first, second = frameworks
    keys = CP_INDEX if suite == "cp" else CROSS_INDEX
    rows = suite_rows(frame, suite)
    ok = rows[rows["status"] == Status.OK.value]
    if not ok.empty:
        single_setting(ok, "cross_framework_table")
    index = sorted_index(ok, keys)
    unit = measure.of_rows(ok).name
    columns = [f"best {first}", f"{first} {unit}", f"best {second}", f"{second} {unit}",
               f"{first}/{second}"]
    by_cell = {
        key: _cross_record(_best(cell, first), _best(cell, second))
        for key, cell in ok.groupby(list(keys), sort=False)
    }
    records = [by_cell[key] for key in index]
    return pd.DataFrame(records, index=index, columns=columns, dtype=object)


def _cross_record(first: pd.Series | None, second: pd.Series | None) -> list[str]:
    def side(best):
        if best is None:
            return ["", ""]
        return [best["backend"], format_cell(Status.OK.value, measure.of_device(
            best.get("device")).value(best), changed=changes.mark(best))]

    ratio = (f"{first['tflops'] / second['tflops']:.2f}"
             if first is not None and second is not None and second["tflops"] > 0 else "")
    return [*side(first), *side(second), ratio]


def cp_table(frame: pd.DataFrame, suite: str = "cp") -> pd.DataFrame:
    """Per-GPU TFLOP/s of CP rows (or of jax.module's, suite="module").

    Index (mask, seqlen, direction, cp_size); one column per strategy/backend.
    """
    rows = suite_rows(frame, suite)
    if not rows.empty:
        single_setting(rows, "cp_table")
    rows = with_line(rows)
    return cell_table(rows, CP_INDEX, "line", line_order(rows), sorted_index(rows, CP_INDEX))


def inner_options(row: Mapping) -> dict:
    """The options a CP row ran its inner kernel with: its `inner_options`
    column; for rows written before it, the row's own options (a strategy
    hands its kernel options through)."""
    inner = row.get("inner")
    if isinstance(inner, str) and inner:
        return _options(row.get("inner_options"))
    return _options(row.get("options"))


def _inner_baseline(singles: Sequence[tuple[dict, pd.Series]], ran_with: dict) -> pd.Series | None:
    """The single-GPU row a CP row is compared with: its inner kernel run
    with options the CP row's inner kernel also ran with (inner_options; a
    kernel row with an option the CP run lacked, e.g. fused_backward=true,
    measured a different kernel). Where several match, the one that set the
    most options, then the newest."""
    best, best_size = None, -1
    for options, row in singles:  # oldest first: a tie goes to the newer
        if options.items() <= ran_with.items() and len(options) >= best_size:
            best, best_size = row, len(options)
    return best


def _flagged_tflops(row: Mapping) -> str:
    """A row's TFLOP/s with the mark of the later changes to its kernel
    (changes.mark): a ratio of two figures may then compare two versions of
    one kernel."""
    return measure.format_number(row["tflops"]) + changes.mark(row)


def cp_vs_single_table(frame: pd.DataFrame) -> pd.DataFrame:
    """CP per-GPU TFLOP/s over the single-GPU TFLOP/s of its own inner kernel
    on the same workload and device (same workload_key and direction).

    Index (mask, seqlen, direction, cp_size); one column per strategy line;
    cells "cp / single = ratio" (each figure marked with the later changes
    to its kernel it predates, changes.mark), empty where either row is missing or
    not OK.
    """
    cp = with_line(suite_rows(frame, "cp"))
    cp = cp[cp["status"] == Status.OK.value]
    kernel = suite_rows(frame, "kernel")
    singles = {}  # (backend, workload_key, direction, device) -> [(options, row)], oldest first
    for _, row in _oldest_first(kernel[kernel["status"] == Status.OK.value]).iterrows():
        key = (row["backend"], row["workload_key"], row["direction"], row["device"])
        singles.setdefault(key, []).append((_options(row.get("options")), row))
    if not cp.empty:
        single_setting(cp, "cp_vs_single_table")
    records = {}
    for _, row in cp.iterrows():
        key = (inner_kernel(row), row["workload_key"], row["direction"], row["device"])
        baseline = _inner_baseline(singles.get(key, ()), inner_options(row))
        if baseline is not None:
            records[tuple(row[c] for c in CP_INDEX), row["line"]] = (
                f"{_flagged_tflops(row)} / {_flagged_tflops(baseline)}"
                f" = {row['tflops'] / float(baseline['tflops']):.2f}")
    index = sorted_index(cp, CP_INDEX)
    columns = line_order(cp)
    cells = [[records.get((key, line), "") for line in columns] for key in index]
    table = pd.DataFrame(cells, index=index, columns=columns, dtype=object)
    filled = table != ""
    return table.loc[filled.any(axis=1), filled.any(axis=0)]


def cp_beside_single_table(frame: pd.DataFrame, framework: str) -> pd.DataFrame:
    """One framework's CP lines beside the single-GPU kernels they run inside.

    Index (mask, seqlen, cp_size); cells "fwd / bwd" per-GPU TFLOP/s (status
    codes for rows that are not OK, empty where never measured). First a
    "1 GPU NAME" column per inner kernel: its rows without backend options
    on the same workload (what a strategy runs inside by default), then one
    column per CP line.
    """
    cp = with_line(suite_rows(frame, "cp"))
    cp = cp[cp["framework"] == framework]
    if cp.empty:
        return pd.DataFrame()
    single_setting(cp, "cp_beside_single_table")
    inners = sorted({name for _, row in cp.iterrows() if (name := inner_kernel(row))})
    kernel = suite_rows(frame, "kernel")
    kernel = kernel[kernel["backend"].isin(inners)
                    & kernel["workload_key"].isin(set(cp["workload_key"]))
                    & kernel["options"].map(results.default_options)]
    row_index = sorted_index(cp, CP_SHORT_INDEX)
    single_index = pd.MultiIndex.from_tuples(
        sorted({key[:2] for key in row_index}), names=list(KERNEL_INDEX))
    lines = line_order(cp)

    def one_direction(direction: str) -> pd.DataFrame:
        singles = cell_table(kernel[kernel["direction"] == direction], KERNEL_INDEX, "backend",
                             inners, single_index)
        beside = pd.DataFrame([singles.loc[key[:2]].tolist() for key in row_index],
                              index=row_index, columns=[f"1 GPU {name}" for name in inners])
        strategies = cell_table(cp[cp["direction"] == direction], CP_SHORT_INDEX, "line",
                                lines, row_index)
        return pd.concat([beside, strategies], axis=1)

    joined = joined_directions(map(one_direction, DIRECTIONS))
    filled = joined != ""
    return joined.loc[filled.any(axis=1), filled.any(axis=0)]


def _size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def comm_table(rows: Sequence[dict]) -> pd.DataFrame:
    """The comm suite: bus bandwidth (GB/s) per collective, rank count and
    message size (the newest row of each), with the alpha-beta fit over the
    sizes (alpha in microseconds, beta as algorithmic GB/s)."""
    from lcab.comm import fit_alpha_beta

    comm = [r for r in rows if r.get("suite") == "comm"]
    if not comm:
        return pd.DataFrame()
    frame = _oldest_first(pd.DataFrame(comm)).drop_duplicates(
        ["framework", "device", "op", "ranks", "bytes"], keep="last")
    sizes = sorted(frame["bytes"].unique())
    records, index = [], []
    for (framework, device, op, ranks), group in frame.groupby(
            ["framework", "device", "op", "ranks"], sort=True):
        by_size = group.set_index("bytes")
        cells = [
            (f"{by_size.loc[n, 'busbw_gbps']:.1f}" if by_size.loc[n, "status"] == Status.OK.value
             else status_code(by_size.loc[n, "status"])) if n in by_size.index else ""
            for n in sizes]
        ok = group[group["status"] == Status.OK.value]
        try:
            fit = fit_alpha_beta(ok["bytes"], ok["median_ms"] * 1e-3)
            cells += [f"{fit.alpha_s * 1e6:.1f}", f"{fit.beta_bytes_per_s / 1e9:.1f}"]
        except ValueError:
            cells += ["", ""]
        records.append(cells)
        index.append((framework, device, op, int(ranks)))
    columns = [_size_text(int(n)) for n in sizes] + ["alpha us", "beta GB/s"]
    return pd.DataFrame(records, columns=columns, index=pd.MultiIndex.from_tuples(
        index, names=["framework", "device", "op", "ranks"]))


# ---------------------------------------------------------------- markdown


def _markdown_cell(value) -> str:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    # A pipe would end the cell; a newline would end the row.
    return re.sub(r"\s*\n\s*", " ", str(value)).replace("|", "\\|")


def to_markdown(df: pd.DataFrame) -> str:
    """A pipe table; named index levels become the leading (left-aligned) columns."""
    named_index = any(name is not None for name in df.index.names)
    flat = df.reset_index() if named_index else df
    n_index = df.index.nlevels if named_index else 0
    header = [_markdown_cell(c) for c in flat.columns]
    body = [[_markdown_cell(v) for v in row] for row in flat.itertuples(index=False)]
    if not header:
        return "_(no rows)_"
    widths = [max(3, len(h), *(len(row[i]) for row in body)) for i, h in enumerate(header)]

    def line(cells, right):
        padded = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)]
        return "| " + " | ".join(padded) + " |"

    # Numbers and status codes (all upper case) align right; index columns and
    # text such as backend names (lower case) align left.
    right = [i >= n_index and not any(re.search("[a-z]", row[i]) for row in body)
             for i in range(len(header))]
    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else (":" + "-" * (w + 1))
                          for w, r in zip(widths, right)) + "|"
    head = line(header, [False] * len(header))
    return "\n".join([head, rule, *(line(row, right) for row in body)])


# ---------------------------------------------------------------- summaries


def devices(frame: pd.DataFrame) -> list[str]:
    """Device names in order of first appearance."""
    return [str(d) for d in pd.unique(frame["device"].dropna())]


def date_range(frame: pd.DataFrame) -> str:
    """"2026-01-05" or "2026-01-04 to 2026-01-05" (UTC dates of the rows)."""
    times = pd.to_datetime(frame["timestamp"], utc=True, errors="coerce", format="ISO8601").dropna()
    if times.empty:
        return "unknown dates"
    first, last = (t.strftime("%Y-%m-%d") for t in (times.min(), times.max()))
    return first if first == last else f"{first} to {last}"


def joined_directions(tables: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Cells "fwd / bwd" from one table per direction; a side never measured is blank."""
    tables = list(tables)
    joined = tables[0]
    for table in tables[1:]:
        joined = joined + " / " + table
    return joined.map(lambda text: text.strip() if text.replace("/", "").strip() else "")


def _by_direction(rows: pd.DataFrame, index: Sequence[str], column: str, columns: Sequence[str]):
    """(directions present, joined table) for rows with both directions."""
    present = [d for d in DIRECTIONS if (rows["direction"] == d).any()]
    row_index = sorted_index(rows, index)
    tables = [cell_table(rows[rows["direction"] == d], index, column, columns, row_index)
              for d in present]
    return present, joined_directions(tables)


def short_table(frame: pd.DataFrame) -> str:
    """A compact markdown summary: per setting group, TFLOP/s "fwd / bwd" per backend
    (median ms where the rows ran on a CPU, the title says which).

    Kernel rows get index (mask, seqlen); CP rows, if any, a second table
    with index (mask, seqlen, cp_size) and per-GPU TFLOP/s. Ends with the
    legend of the codes and the device names.
    """
    newest = label_mask_settings(latest(frame))
    parts = []
    for label, group in setting_groups(newest):
        shown = measure.of_rows(group)
        unit = shown.name
        per_gpu = f"per-GPU {unit}" if shown.higher_is_better else unit  # a time is not per GPU
        kernel = group[group["suite"] == "kernel"]
        if not kernel.empty:
            present, table = _by_direction(kernel, KERNEL_INDEX, "backend", backend_order(kernel))
            title = f"**Kernels, {unit} {' / '.join(present)}: {label}**"
            parts += [title, "", to_markdown(table), ""]
        for suite, what in (("cp", "Context parallel"),
                            ("module", "Attention module (projections + attention)")):
            rows = with_line(group[group["suite"] == suite])
            if not rows.empty:
                present, table = _by_direction(rows, CP_SHORT_INDEX, "line", line_order(rows))
                title = f"**{what}, {per_gpu} {' / '.join(present)}: {label}**"
                parts += [title, "", to_markdown(table), ""]
    if not parts:
        parts = ["_(no result rows)_", ""]
    parts += [f"Legend: {legend.one_line()}", f"Device: {', '.join(devices(newest)) or 'unknown'}"]
    return "\n".join(parts)
