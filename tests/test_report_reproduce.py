"""Your rows against ours (lcab.report.reproduce and `lcab.report --against`):
a rerun of committed rows is compared case by case, statuses that differ are
listed, and times outside the runs' noise are named with their backend."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from lcab import results
from lcab.canonical import ROOT
from lcab.report import reproduce

PART = ROOT / "results/2026-11-27-h100-blog/torch-32k-full+causal/kernel_torch.jsonl"


def committed():
    return results.read_rows([PART])


def rerun(rows, slower=None, factor=1.0, status=None, device=None):
    """The rows as a rerun would write them: `slower`'s times scaled by
    factor, the first OK forward row of torch.flex given `status`, another
    device; each row newer than the one it repeats."""
    changed, flipped = [], False
    for row in rows:
        row = dict(row, timestamp="2030-01-01T00:00:00+00:00")
        if device:
            row["device"] = device
        if row["backend"] == slower and row["status"] == "OK":
            for column in ("median_ms", "p20_ms", "p80_ms"):
                row[column] *= factor
        if (status and not flipped and row["backend"] == "torch.flex"
                and row["direction"] == "fwd" and row["status"] == "OK"):
            row.update(status=status, reason="differs from the reference by 0.5")
            flipped = True
        changed.append(row)
    return changed


def test_rows_against_themselves_all_reproduce():
    rows = committed()
    ok = [row for row in results.newest_rows(rows) if row["status"] == "OK"]
    text = reproduce.markdown(rerun(rows), rows)
    assert "Different devices" not in text and "Statuses that differ" not in text
    assert text.splitlines()[-1].startswith(f"{len(ok)} of {len(ok)} timed cases reproduce")
    assert all(case.ratio == pytest.approx(1.0) for case in reproduce.cases(rerun(rows), rows)
               if case.both_ok)


def test_a_slower_backend_a_changed_status_and_another_card_are_named():
    rows = committed()
    mine = rerun(rows, slower="torch.sdpa_cudnn", factor=1.3, status="MISMATCH",
                 device="NVIDIA H200")
    text = reproduce.markdown(mine, rows)
    lines = text.splitlines()
    assert lines[0].startswith("Different devices: yours NVIDIA H200, ours NVIDIA H100")
    cudnn = next(line for line in lines if line.startswith("| torch.sdpa_cudnn |"))
    cells = [cell.strip() for cell in cudnn.strip("|").split("|")]
    assert cells[2] == "1.300" and cells[3] == "1.300-1.300" and int(cells[4]) == int(cells[1])
    assert "| torch.flex full 32k fwd | MISMATCH | OK | differs from the reference by 0.5 |" in lines
    assert "torch.sdpa_cudnn (1.300)" in lines[-1] and "1 of" in lines[-1].split(";")[1]
    outside = lines.index(next(line for line in lines if line.startswith("Outside tolerance")))
    assert lines[outside + 4].startswith("| torch.sdpa_cudnn ")  # after a blank line and header


def test_a_case_reproduces_within_its_spreads_or_the_floor():
    ours = {"status": "OK", "median_ms": 1.0, "p20_ms": 0.99, "p80_ms": 1.01}
    steady = reproduce.Case(dict(ours, median_ms=1.04, p20_ms=1.03, p80_ms=1.05), ours)
    assert steady.tolerance == reproduce.FLOOR and steady.reproduces
    noisy = reproduce.Case(dict(ours, median_ms=1.12, p20_ms=1.0, p80_ms=1.2), ours)
    assert noisy.tolerance == pytest.approx(0.2 / 1.12 + 0.02) and noisy.reproduces
    off = reproduce.Case(dict(ours, median_ms=1.08, p20_ms=1.07, p80_ms=1.09), ours)
    assert not off.reproduces


def test_no_shared_measurement_says_so():
    rows = committed()
    other = [dict(row, workload_key="another workload") for row in rows]
    assert "No measurement is in both sets of rows" in reproduce.markdown(other, rows)


def test_the_cli_prints_and_writes_the_comparison(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    with (mine / "kernel_torch.jsonl").open("w") as out:
        out.writelines(json.dumps(row) + "\n"
                       for row in rerun(committed(), slower="torch.flex", factor=0.5))
    run = subprocess.run(
        [sys.executable, "-m", "lcab.report", f"--results={mine}", f"--against={PART}",
         f"--out={tmp_path / 'out'}"], capture_output=True, text=True, cwd=ROOT, timeout=300,
        check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "torch.flex (0.500)" in run.stdout
    frame = pd.read_csv(tmp_path / "out/reproduce.csv")
    flex = frame[(frame["backend"] == "torch.flex") & (frame["status_yours"] == "OK")]
    assert len(flex) and flex["ratio"].tolist() == pytest.approx([0.5] * len(flex))
    assert not flex["reproduces"].any()
    assert (tmp_path / "out/reproduce.md").read_text().startswith("# Your rows against ours")
    refused = subprocess.run([sys.executable, "-m", "lcab.report", f"--against={PART}"],
                             capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert refused.returncode != 0 and "--against needs --results" in refused.stderr
    assert "Traceback" not in refused.stderr
