"""Every path and module the README names exists: `attnbench/...py` files (under harness/), test files and
folders, and dotted names (`attnbench.interface.kept_between_calls`: a module, or an attribute of one)."""

from __future__ import annotations

import importlib
import re

import pytest
from helpers import ROOT, TESTS

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


@pytest.mark.parametrize("dotted", sorted(set(re.findall(r"`(attnbench(?:\.\w+)+)(?:\(\))?`", README))))
def test_every_dotted_name_it_names_resolves(dotted: str) -> None:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            assert hasattr(obj, attribute), f"{dotted}: {obj.__name__} has no {attribute}"
            obj = getattr(obj, attribute)
        return
    pytest.fail(f"{dotted} is not importable")
