"""Helpers the tests share (importable from every test folder: tests/ is on the path)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SOURCES = {"attnbench": ROOT / "harness" / "attnbench", "attnbench.variants": ROOT / "variants"}


def source_modules() -> dict[str, Path]:
    """Every module of the package in the checkout, by dotted name -> its file."""
    found = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            name = ".".join((package, *path.relative_to(folder).with_suffix("").parts))
            found[name.removesuffix(".__init__")] = path
    return found
