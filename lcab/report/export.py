"""The tidy export: every measurement as one CSV row, one number per column.

Tables print display strings ("402 / 322", "X"); this file holds the
numbers behind them, for anyone's own analysis:

    frame = pandas.read_csv("docs/results/results.csv")

One row per measurement (the newest row of each, as the tables show);
numeric columns hold numbers only, empty where a row has none (a failed
row has no time). A Parquet copy is written beside it when pyarrow is
installed. COLUMNS documents every column; columns_markdown() renders that
as a page.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib

import pandas as pd

from lcab import registry, results
from lcab.report import tables
from lcab.status import Status

# column -> meaning, in file order.
COLUMNS: dict[str, str] = {
    "sweep": "the page the row is on: a canonical sweep and its card (cp-h200), else the "
             "results folder's name",
    "framework": "jax, torch (numpy for host-only plugins)",
    "backend": "registered backend name, e.g. jax.cudnn",
    "options": "the backend's constructor options, compact JSON ({} for its defaults)",
    "suite": "kernel (one device), cp (context parallel) or module",
    "strategy": "CP strategy (empty for kernels)",
    "inner": "the kernel a CP strategy runs inside, where the row names it",
    "mask": "mask family",
    "mask_setting": "the swept mask parameters, e.g. keep=0.2, block=128 (empty for other masks)",
    "keep": "block-sparse masks: kept fraction of kv blocks per q block",
    "block_size": "block-sparse masks: block size in tokens",
    "density": "visible (q, k) pairs / (seqlen * seqlen_k)",
    "mask_params": "every resolved mask parameter, JSON",
    "seqlen": "query tokens (for CP, the whole sequence)",
    "seqlen_k": "key tokens",
    "batch": "batch size",
    "heads_q": "query heads",
    "heads_kv": "key/value heads",
    "head_dim": "head dimension",
    "dtype": "bfloat16, float16 or float32",
    "direction": "fwd, or bwd (time of fwd+bwd minus fwd)",
    "cp_size": "devices the sequence is split over (1 for kernels)",
    "status": "OK, OOM, UNSUPPORTED, UNAVAILABLE, ERROR or MISMATCH",
    "reason": "why the status is not OK (empty when OK)",
    "median_ms": "median of the timed repeats, milliseconds",
    "p20_ms": "20th percentile of the timed repeats, milliseconds",
    "p80_ms": "80th percentile of the timed repeats, milliseconds",
    "tflops": "FLOPs / median time / 1e12 (per device for CP rows)",
    "tflops_at_p20_ms": "TFLOP/s at the p20 time (the upper end of the p20-p80 range)",
    "tflops_at_p80_ms": "TFLOP/s at the p80 time (the lower end)",
    "flops": "exact FLOPs of this direction (lcab.flops)",
    "peak_mem_bytes": "peak device memory of the case, bytes (empty where unknown)",
    "check_err": "normalised max error of the full-size check at this workload "
                 "(empty: not checked)",
    "max_err": "normalised max error of the small float64 correctness probe",
    "sm_mhz": "median SM clock of the GPUs while its samples ran, MHz (empty where not "
              "polled; rows before 2026-12-02 were not)",
    "power_w": "median board power over the same polls, W",
    "device": "device name, e.g. NVIDIA H100 80GB HBM3, or cpu",
    "date": "UTC date the row was written, YYYY-MM-DD",
    "timestamp": "UTC time the row was written, ISO 8601",
    "commit": "git commit of the LCAB checkout that measured it",
    "changed_since": "commits of later changes to its kernel that can move this OK row's "
                     "figure (lcab.registry.Change; empty: none), the tables' †",
    "run_id": "the run that wrote the row",
    "source": "the committed JSONL file the row was read from, relative to the repository",
}
NUMBER_COLUMNS = (
    "keep", "block_size", "density", "seqlen", "seqlen_k", "batch", "heads_q", "heads_kv",
    "head_dim", "cp_size", "median_ms", "p20_ms", "p80_ms", "tflops", "tflops_at_p20_ms",
    "tflops_at_p80_ms", "flops", "peak_mem_bytes", "check_err", "max_err", "sm_mhz", "power_w",
)
TEXT_COLUMNS = tuple(c for c in COLUMNS if c not in NUMBER_COLUMNS)
# The columns a row is sorted by, so a regenerated file diffs line by line.
_ORDER = ("sweep", "suite", "framework", "backend", "strategy", "options", "mask", "keep",
          "block_size", "seqlen", "cp_size", "direction")


def _numbers(frame: pd.DataFrame, column: str) -> pd.Series:
    if column not in frame:
        return pd.Series(float("nan"), index=frame.index)
    return pd.to_numeric(frame[column], errors="coerce")


def _clock(frame: pd.DataFrame, key: str) -> pd.Series:
    """One figure of the rows' `clocks` (lcab.gpu_poll.summarise), NaN where absent."""
    if "clocks" not in frame:
        return pd.Series(float("nan"), index=frame.index)
    return frame["clocks"].map(lambda c: results.json_field(c).get(key, float("nan")))


def _texts(values: pd.Series) -> pd.Series:
    return values.map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v))
                      else str(v))


def tidy(frame: pd.DataFrame, sweep: str = "") -> pd.DataFrame:
    """One row per measurement of `frame` (tables.latest), COLUMNS in order.

    A frame from lcab.report.sources.load carries "source"; without it the
    column is empty. Numeric columns are float or int, text columns str.
    """
    rows = tables.latest(frame)
    params = rows["mask_params"].map(tables.swept_params) if len(rows) else pd.Series(
        [], dtype=object)
    median, p20, p80 = (_numbers(rows, c) for c in ("median_ms", "p20_ms", "p80_ms"))
    tflops = _numbers(rows, "tflops")
    times = pd.to_datetime(rows["timestamp"], utc=True, errors="coerce", format="ISO8601")
    out = pd.DataFrame({
        "sweep": sweep,
        **{c: rows[c] for c in ("framework", "backend", "options", "suite", "strategy", "inner",
                                "mask")},
        "mask_setting": params.map(lambda p: tables.mask_setting_label("", p).strip("()")),
        "keep": params.map(lambda p: p.get("keep")),
        "block_size": params.map(lambda p: p.get("block_size")),
        **{c: rows[c] for c in ("density", "mask_params", "seqlen", "seqlen_k", "batch",
                                "heads_q", "heads_kv", "head_dim", "dtype", "direction",
                                "cp_size", "status", "reason")},
        "median_ms": median, "p20_ms": p20, "p80_ms": p80, "tflops": tflops,
        # The same FLOPs over a shorter time: more TFLOP/s at the p20 time.
        "tflops_at_p20_ms": tflops * median / p20,
        "tflops_at_p80_ms": tflops * median / p80,
        **{c: rows[c] for c in ("flops", "peak_mem_bytes", "check_err", "max_err")},
        **{key: _clock(rows, key) for key in ("sm_mhz", "power_w")},
        "device": rows["device"],
        "date": times.dt.strftime("%Y-%m-%d"),
        "timestamp": rows["timestamp"],
        "commit": rows["git_commit"],
        "changed_since": [" ".join(change.commit for change in registry.changes_since(row))
                          if row["status"] == Status.OK.value else ""  # no figure to move
                          for _, row in rows.iterrows()],
        "run_id": rows["run_id"],
        "source": rows.get("source", ""),
    }, index=rows.index, columns=list(COLUMNS))
    for column in NUMBER_COLUMNS:
        out[column] = pd.to_numeric(out[column], errors="coerce")
    for column in TEXT_COLUMNS:
        out[column] = _texts(out[column]).astype(object)
    out["options"] = out["options"].map(results.options_key)
    return out.sort_values(list(_ORDER), kind="stable", na_position="first").reset_index(drop=True)


def parquet_available() -> bool:
    return importlib.util.find_spec("pyarrow") is not None


def write(frame: pd.DataFrame, folder: str | pathlib.Path, stem: str = "results"
          ) -> list[pathlib.Path]:
    """stem.csv of a tidy frame, and stem.parquet where pyarrow is installed."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / f"{stem}.csv"]
    frame.to_csv(written[0], index=False)
    if parquet_available():
        written.append(folder / f"{stem}.parquet")
        frame.to_parquet(written[1], index=False)
    return written


def columns_markdown(csv_name: str = "results.csv") -> str:
    """A page documenting the export's columns."""
    parquet = csv_name.removesuffix(".csv") + ".parquet"
    lines = [
        f"# The tidy export: {csv_name}",
        "",
        ("Every measurement behind the result pages, one row each (the newest row of each "
         "measurement, as the tables show), one number per numeric column: no display strings, "
         "no status codes in number columns. A column a row has no value for is empty (a "
         "failed row has no time; read as NaN)."),
        "",
        "```python",
        "import pandas",
        f'frame = pandas.read_csv("{csv_name}")',
        "```",
        "",
        f"`{parquet}` holds the same rows where it was generated with pyarrow installed.",
        "",
        "| Column | Meaning |",
        "|:-------|:--------|",
        *(f"| `{column}` | {meaning} |" for column, meaning in COLUMNS.items()),
        "",
    ]
    return "\n".join(lines)
