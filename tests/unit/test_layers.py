"""The house's floors, enforced: attnbench's import graph (every import, at module level or inside a function) has
no cycle, between modules or between rooms, and each room imports only what its floor allows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import source_modules

# room -> rooms it must never import (a room is a sub-package, or a top-level module)
FORBIDDEN = {
    "attnbench.measure": {"attnbench.run", "attnbench.report", "attnbench.model", "attnbench.conformance",
                          "attnbench.cli", "attnbench.variants"},
    "attnbench.report": {"attnbench.measure", "attnbench.run", "attnbench.model", "attnbench.variants",
                         "attnbench.cli"},
    "attnbench.runfolder": {"attnbench.measure", "attnbench.run", "attnbench.report", "attnbench.model",
                            "attnbench.variants", "attnbench.cli"},
    "attnbench.plan": {"attnbench.measure", "attnbench.run", "attnbench.report", "attnbench.runfolder",
                       "attnbench.model", "attnbench.variants", "attnbench.cli"},
    "attnbench.inputs": {"attnbench.plan", "attnbench.measure", "attnbench.run", "attnbench.report",
                         "attnbench.runfolder", "attnbench.model", "attnbench.variants", "attnbench.cli"},
    "attnbench.run": {"attnbench.model", "attnbench.cli", "attnbench.variants"},
    "attnbench.model": {"attnbench.run", "attnbench.cli", "attnbench.variants"},
}  # fmt: skip
PUBLIC = {"attnbench", "attnbench.interface", "attnbench.ops"}  # what a variant (built-in or plugin) may import


def imports(found: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, imported) over every `import attnbench...` and `from attnbench... import ...` in the tree."""
    arrows = set()
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "attnbench":
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in found else node.module
                           for a in node.names]  # fmt: skip
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "attnbench"]
            for target in targets:
                while target not in found and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    arrows.add((name, target))
    return arrows


def room(module: str) -> str:
    """attnbench.report.verdict -> attnbench.report; attnbench.cli -> attnbench.cli; attnbench -> attnbench."""
    return ".".join(module.split(".")[:2])


def cycle(arrows: set[tuple[str, str]]) -> list[str] | None:
    """One cycle of the graph, as a path, or None."""
    graph: dict[str, set[str]] = {}
    for a, b in arrows:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


FOUND = source_modules()
ARROWS = imports(FOUND)


def test_the_tree_is_what_the_layout_says() -> None:
    rooms = {room(m) for m in FOUND}
    for sub in ("plan", "inputs", "measure", "runfolder", "run", "report", "model", "variants"):
        assert f"attnbench.{sub}" in rooms
    for top in ("interface", "ops", "registry", "conformance", "stats", "cli"):
        assert f"attnbench.{top}" in FOUND


def test_no_module_imports_itself_round_a_cycle() -> None:
    assert cycle(ARROWS) is None


def test_no_room_imports_itself_round_a_cycle() -> None:
    between_rooms = {(room(a), room(b)) for a, b in ARROWS if room(a) != room(b)}
    assert cycle(between_rooms) is None


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({("a", "b"), ("b", "c"), ("c", "a")}) is not None and cycle({("a", "b"), ("b", "c")}) is None


@pytest.mark.parametrize("importer", sorted(FORBIDDEN))
def test_each_floor_imports_only_what_it_may(importer: str) -> None:
    wrong = sorted((a, b) for a, b in ARROWS if room(a) == importer and room(b) in FORBIDDEN[importer])
    assert not wrong, f"{importer} must not import {sorted(FORBIDDEN[importer])}: {wrong}"


def test_variants_import_only_the_public_surface() -> None:
    """What a built-in variant may import is exactly what a plugin may: the interface, ops, and each other."""
    wrong = sorted(
        (a, b) for a, b in ARROWS
        if room(a) == "attnbench.variants" and room(b) != "attnbench.variants" and b not in PUBLIC
    )  # fmt: skip
    assert not wrong
