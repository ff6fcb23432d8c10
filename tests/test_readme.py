"""The README is the user's guide: short, for users, and its generated
blocks (the headline table, the legend) agree with the committed rows."""

import pathlib
import re

from lcab.report import readme

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_headline_table_and_legend_match_the_committed_rows():
    assert readme.refreshed(README) == README, (
        "the README's generated blocks are stale: run "
        "python -m lcab.report --update_readme=README.md")


def test_it_is_a_guide_not_a_notebook():
    assert len(README.splitlines()) < 300
    for word in (r"issue #?\d", r"#\d{1,3}\b", r"device time", r"\blent\b", r"device tool",
                 r"\bv\d+b?\b"):
        assert not re.search(word, README, re.I), word


def test_every_link_stays_in_the_repository_and_exists():
    links = re.findall(r"\]\(([^)#]+)", README)
    assert links
    for link in links:
        assert not link.startswith(("..", "/")), link
        assert (ROOT / link).exists(), link


def test_a_missing_block_is_named():
    try:
        readme.refreshed("no blocks here")
    except ValueError as error:
        assert "no headline block" in str(error)
    else:
        raise AssertionError("a README without blocks was accepted")
