"""The README's "Adding a variant" is a working plugin: its class passes `attnbench check` (registered in this
process, as `registry.register` allows for tests), and its entry point names that class under the class's name."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import ModuleType

import pytest
from attnbench import AttentionVariant
from attnbench.cli import main
from attnbench.registry import registry
from helpers import ROOT


def section() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"^## Adding a variant\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert found, "the README has no '## Adding a variant' section"
    return found.group(1)


def block(language: str) -> str:
    found = re.search(rf"^```{language}\n(.*?)^```", section(), flags=re.S | re.M)
    assert found, f"the README's 'Adding a variant' has no {language} block"
    return found.group(1)


@pytest.fixture
def plugin() -> Iterator[type[AttentionVariant]]:
    """The README's class, defined from its text and registered in this process (forgotten afterwards)."""
    module = ModuleType("my_attention")
    exec(compile(block("python"), "README.md", "exec"), module.__dict__)
    classes = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, AttentionVariant)]
    [variant] = [c for c in classes if c is not AttentionVariant]
    registry.register(variant)
    try:
        yield variant
    finally:
        registry._clear()


def test_the_readme_plugin_passes_the_conformance_checks(plugin: type[AttentionVariant]) -> None:
    assert main(["check", plugin.name]) == 0


def test_its_entry_point_names_the_class_under_its_name(plugin: type[AttentionVariant]) -> None:
    entries = dict(re.findall(r"^([\w-]+) = \"[\w.]+:(\w+)\"", block("toml"), flags=re.M))
    assert entries == {plugin.name: plugin.__name__}
