"""Every file, test and module the manual (docs/*.md) cites exists, as tests/unit/test_readme.py holds the README
to: a claim keeps the test or the code it points at, and a rename that orphans a citation fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import DOTTED, ROOT, TESTS, resolves

PAGES = sorted((ROOT / "docs").glob("*.md"))


def text(page: Path) -> str:
    return page.read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_module_path_it_names_is_a_file(page: Path) -> None:
    paths = set(re.findall(r"\battnbench/[\w/]+\.py\b", text(page)))
    missing = sorted(p for p in paths if not (ROOT / "harness" / p).is_file())
    assert not missing, f"{page.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_test_it_names_exists(page: Path) -> None:
    named = set(re.findall(r"\btests/[\w/]+(?:\.py|/)", text(page)))
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"{page.name} names test paths that do not exist: {missing}"
    bare = set(re.findall(r"(?<![\w/])(test_\w+\.py)\b", text(page)))  # `test_ray.py`, named without its folder
    missing = sorted(name for name in bare if not list(TESTS.rglob(name)))
    assert not missing, f"{page.name} names test files that do not exist: {missing}"


@pytest.mark.parametrize(
    "page, dotted",
    [(p, d) for p in PAGES for d in sorted(set(re.findall(rf"`({DOTTED})(?:\(\))?`", text(p))))],
    ids=lambda x: x.name if isinstance(x, Path) else x,
)
def test_every_dotted_name_it_names_resolves(page: Path, dotted: str) -> None:
    assert resolves(dotted), f"{page.name} names {dotted}, which does not exist"


def test_the_manual_cites_its_evidence() -> None:
    """The patterns above still match how the pages cite (a change of style would make them pass vacuously)."""
    every = "".join(text(page) for page in PAGES)
    assert re.search(r"\battnbench/[\w/]+\.py\b", every) and re.search(r"\btests/[\w/]+\.py", every)
