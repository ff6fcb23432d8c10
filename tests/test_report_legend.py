"""lcab.report.legend: one legend of the cell codes, used everywhere."""

import pathlib

from lcab.report import legend, tables
from lcab.status import CODES
from tests.test_report_rows import loaded, row

REPORT = pathlib.Path(__file__).resolve().parent.parent / "lcab" / "report"


def test_the_markdown_names_every_status_code_and_mark():
    text = legend.markdown()
    lines = text.splitlines()
    assert lines[0] == "| Cell | Status | Meaning |"
    for status, code in CODES.items():
        assert f"| `{code}` | {status.value} |" in text
    for mark in (legend.FLAG_UNSTEADY, legend.FLAG_UNCHECKED, "X¹"):
        assert f"| `{mark}` |" in text
    assert legend.markdown() == text  # pasted into the README: must not change between calls


def test_a_mismatch_names_both_references():
    # The probe compares with float64, the full-size check with float32 at the timed size.
    mismatch = next(entry for entry in legend.ENTRIES if entry.status == "MISMATCH")
    assert "float64 on the probe" in mismatch.meaning
    assert "float32 at the timed size" in mismatch.meaning


def test_the_tables_print_the_same_legend(tmp_path):
    summary = tables.short_table(loaded(tmp_path, [row("jax.a")]))
    assert f"Legend: {legend.one_line()}" in summary
    assert tables.FLAG_UNCHECKED == legend.FLAG_UNCHECKED


def test_no_other_report_module_writes_a_legend_of_its_own():
    for path in REPORT.glob("*.py"):
        if path.name != "legend.py":
            text = path.read_text()
            assert "= out of" not in text and "LEGEND" not in text, path.name


def test_footnote_marks_are_superscript_numbers():
    assert legend.superscript(12) == "¹²"
