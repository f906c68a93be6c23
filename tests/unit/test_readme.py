"""Every path and module the README names exists: `attnbench/...py` files (under harness/), test files and
folders, and dotted names (`attnbench.interface.kept_between_calls`: a module, or an attribute of one)."""

from __future__ import annotations

import re

import pytest
from helpers import DOTTED, ROOT, TESTS, resolves, source_modules

README = (ROOT / "README.md").read_text()


def test_every_module_path_it_names_is_a_file() -> None:
    paths = set(re.findall(r"\battnbench/[\w/]+\.py\b", README))
    assert paths, "the README names no module path: the pattern no longer matches its style"
    missing = sorted(p for p in paths if not (ROOT / "harness" / p).is_file())
    assert not missing, f"README names files that do not exist: {missing}"


def test_every_test_file_it_names_exists() -> None:
    named = set(re.findall(r"\btests/[\w/]+(?:\.py|/)", README))
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"README names test paths that do not exist: {missing}"
    bare = set(re.findall(r"(?<![\w/])(test_\w+\.py)\b", README))  # `test_ray.py`, named without its folder
    missing = sorted(name for name in bare if not list(TESTS.rglob(name)))
    assert not missing, f"README names test files that do not exist: {missing}"


@pytest.mark.parametrize("dotted", sorted(set(re.findall(rf"`({DOTTED})(?:\(\))?`", README))))
def test_every_dotted_name_it_names_resolves(dotted: str) -> None:
    assert resolves(dotted), f"the README names {dotted}, which does not exist"


def test_every_dotted_name_in_the_packages_own_words_resolves() -> None:
    """Docstrings and comments name modules as readers follow them: a name left from an older layout fails."""
    stale = [
        f"{path.relative_to(ROOT)}:{number}: {name}"
        for path in source_modules().values()
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        for name in re.findall(DOTTED, line)
        if not resolves(name)
    ]
    assert not stale, stale
