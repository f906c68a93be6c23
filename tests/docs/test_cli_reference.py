"""The command-line reference page is generated from attnbench's own parser (docs/hooks/cli_reference.py): every
verb and every flag is on it, and help text renders as written."""

from __future__ import annotations

import argparse
import importlib.util
from types import ModuleType

import pytest
from attnbench.cli import VERBS, build_parser
from helpers import ROOT


def hook() -> ModuleType:
    """The MkDocs hook, loaded from its file as MkDocs loads it (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "docs" / "hooks" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page() -> str:
    return hook().cli_markdown(build_parser())


def verb_parsers() -> dict[str, argparse.ArgumentParser]:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(commands.choices)


def test_every_verb_has_a_section(page: str) -> None:
    headings = {line for line in page.splitlines() if line.startswith("#")}
    missing = [verb for verb in VERBS if f"### `attnbench {verb}`" not in headings]
    assert not missing, f"verbs without a section: {missing}"


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_flag_of_a_verb_is_documented(page: str, verb: str) -> None:
    section = page.split(f"### `attnbench {verb}`", 1)[1].split("\n### ", 1)[0]
    flags = {flag for action in verb_parsers()[verb]._actions for flag in action.option_strings}
    missing = sorted(flag for flag in flags if f"`{flag}" not in section and f", {flag}" not in section)
    assert not missing, f"attnbench {verb}: flags missing from its section: {missing}"


def test_help_text_is_escaped_for_markdown() -> None:
    """`<run-id>` would be swallowed as an HTML tag, `|` would split a table row, `*` would start emphasis."""
    escape = hook().escape
    assert escape("results/<run-id> a|b *.toml") == r"results/&lt;run-id&gt; a\|b \*.toml"
