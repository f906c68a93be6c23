"""The README stays a front door (at most 300 lines) whose links all lead somewhere: every relative link in it
points at a file that exists, and every #anchor in the README's and the manual's relative links names a heading of
its target as GitHub spells heading anchors, so the links work on GitHub as well as on the built site (which checks
its own anchors in strict mode)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import ROOT

README = ROOT / "README.md"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target), images left out


def relative_links(page: Path) -> list[str]:
    """The relative link targets of a Markdown file, outside fenced code."""
    prose = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return [t for t in LINK.findall(prose) if not re.match(r"[a-z][a-z+.-]*:", t)]  # http:, mailto: left out


def github_anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: markup dropped, lower case, punctuation removed, spaces -> hyphens."""
    words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", words).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", prose, flags=re.M)}


def test_the_readme_is_at_most_300_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= 300, f"README.md has {lines} lines: move the detail into docs/ (the manual)"


def test_every_relative_link_in_the_readme_points_at_a_file() -> None:
    links = relative_links(README)
    assert links, "the README links nowhere: it should point into the manual (docs/)"
    missing = sorted(t for t in links if t.split("#")[0] and not (ROOT / t.split("#")[0]).exists())
    assert not missing, f"README.md links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_every_relative_link_in_the_manual_points_at_a_file(page: Path) -> None:
    """As on GitHub, where the only page the build adds (the CLI reference) does not exist."""
    generated = {"cli.md"}  # docs/hooks/cli_reference.py's PAGE
    targets = [t.split("#")[0] for t in relative_links(page)]
    missing = sorted(t for t in targets if t and t not in generated and not (page.parent / t).exists())
    assert not missing, f"{page.name} links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_anchor_names_a_heading_on_github(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path) if path else page
        if anchor and destination.suffix == ".md" and destination.is_file() and anchor not in anchors(destination):
            broken.append(target)
    assert not broken, f"{page.name}: anchors no heading of their target has: {broken}"


def test_github_anchors_are_spelt_as_github_spells_them() -> None:
    assert github_anchor("Calibration of `realistic`") == "calibration-of-realistic"
    assert github_anchor("Real heads as the evidence, and `--tune`") == "real-heads-as-the-evidence-and---tune"
