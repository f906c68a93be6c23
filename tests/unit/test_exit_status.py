"""One exit-status table: the codes the commands return and the table --help prints come from `Exit` alone."""

from __future__ import annotations

import ast

from attnbench.cli import build_parser
from attnbench.exit_status import MEANING, Exit
from helpers import SOURCES


def test_help_prints_every_status_with_its_meaning() -> None:
    text = build_parser().format_help()
    for code, lines in MEANING.items():
        assert f"  {int(code):<5}{lines[0]}" in text
    assert set(MEANING) == set(Exit)


def test_no_command_returns_a_bare_number() -> None:
    """Every `return` of a command body names its status (Exit.USAGE, not 2), so the table stays the one list."""
    bare = []
    verbs = sorted((SOURCES["attnbench"] / "commands").glob("*.py"))  # each verb's `main`
    for path in [SOURCES["attnbench"] / "cli.py", *verbs, SOURCES["attnbench"] / "model" / "command.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in ("main", "dry_run", "model_command"):
                for ret in ast.walk(node):
                    numbers = [] if not isinstance(ret, ast.Return) or ret.value is None else [
                        n for n in ast.walk(ret.value) if isinstance(n, ast.Constant) and type(n.value) is int
                    ]
                    bare += [f"{path.name}:{ret.lineno}"] if numbers else []
    assert not bare, f"bare exit numbers: {bare}"
