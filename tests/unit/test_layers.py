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
                          "attnbench.cli", "attnbench.commands", "attnbench.variants", "attnbench.reproduce"},
    "attnbench.report": {"attnbench.measure", "attnbench.run", "attnbench.model", "attnbench.variants",
                         "attnbench.cli", "attnbench.commands", "attnbench.reproduce", "attnbench.recall"},
    "attnbench.runfolder": {"attnbench.measure", "attnbench.run", "attnbench.report", "attnbench.model",
                            "attnbench.variants", "attnbench.cli", "attnbench.commands", "attnbench.reproduce"},
    "attnbench.plan": {"attnbench.measure", "attnbench.run", "attnbench.report", "attnbench.runfolder",
                       "attnbench.model", "attnbench.variants", "attnbench.cli", "attnbench.commands",
                       "attnbench.reproduce"},
    "attnbench.inputs": {"attnbench.plan", "attnbench.measure", "attnbench.run", "attnbench.report",
                         "attnbench.runfolder", "attnbench.model", "attnbench.variants", "attnbench.cli",
                         "attnbench.commands", "attnbench.reproduce"},
    "attnbench.run": {"attnbench.model", "attnbench.cli", "attnbench.commands", "attnbench.variants",
                      "attnbench.reproduce"},
    "attnbench.model": {"attnbench.run", "attnbench.cli", "attnbench.commands", "attnbench.variants",
                        "attnbench.reproduce"},
    # MQAR trained: the task, the model, the trainings and where they run; read and reported by report/
    "attnbench.recall": {"attnbench.measure", "attnbench.report", "attnbench.model", "attnbench.cli",
                         "attnbench.commands", "attnbench.reproduce"},
    # the real model generating with each method: its own wing beside model/ (whose attention routing it shares),
    # its rows reported by report/ (the machine's facts it reads from measure/, as the guard does)
    "attnbench.generation": {"attnbench.report", "attnbench.recall", "attnbench.variants",
                             "attnbench.cli", "attnbench.commands", "attnbench.reproduce"},
    # the published claims sit on the pipeline's top: they plan, run and read runs, never measure or report
    "attnbench.reproduce": {"attnbench.measure", "attnbench.report", "attnbench.model", "attnbench.variants",
                            "attnbench.cli", "attnbench.commands"},
    # the fused decode steps: C calls on tensors, below everything (the interface's ops call them)
    "attnbench.kernels": {"attnbench.interface", "attnbench.ops", "attnbench.measure", "attnbench.run",
                          "attnbench.report", "attnbench.model", "attnbench.variants", "attnbench.generation",
                          "attnbench.cli", "attnbench.commands", "attnbench.reproduce", "attnbench.plan"},
}  # fmt: skip
# what a variant (built-in or plugin) may import: the interface, ops and the fused decode steps (attnbench.kernels)
PUBLIC = {"attnbench", "attnbench.interface", "attnbench.ops", "attnbench.kernels", "attnbench.kernels.steps",
          "attnbench.kernels.recurrent_steps"}


def imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The attnbench modules (or module.attribute) one node imports: `import`, `from ... import` (relative ones
    resolved against `module`), and a string given to importlib.import_module or __import__."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # from .x import y / from .. import z: relative to this module's package
            package = module.split(".") if is_package else module.split(".")[:-1]
            base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
        return [f"{base}.{a.name}" for a in node.names]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
            return [node.args[0].value]
    return []


def imports(found: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, imported module) over every import of an attnbench module in the tree, at any depth."""
    arrows = set()
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text())):
            for target in imported_names(node, name, path.name == "__init__.py"):
                if target.split(".")[0] != "attnbench":
                    continue
                while target not in found and "." in target:  # module.attribute -> module
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
    for sub in ("plan", "inputs", "measure", "runfolder", "run", "report", "model", "reproduce", "variants",
                "commands", "recall"):
        assert f"attnbench.{sub}" in rooms
    for top in ("interface", "ops", "registry", "conformance", "stats", "cli"):
        assert f"attnbench.{top}" in FOUND


def test_no_module_imports_itself_round_a_cycle() -> None:
    assert cycle(ARROWS) is None


def test_no_room_imports_itself_round_a_cycle() -> None:
    between_rooms = {(room(a), room(b)) for a, b in ARROWS if room(a) != room(b)}
    assert cycle(between_rooms) is None


def test_the_import_finder_sees_relative_and_string_imports() -> None:
    source = "from ..run import sweep\nimport importlib\nimportlib.import_module('attnbench.report.verdict')\n"
    nodes = list(ast.walk(ast.parse(source)))
    seen = [t for n in nodes for t in imported_names(n, "attnbench.measure.timing", is_package=False)]
    assert "attnbench.run.sweep" in seen and "attnbench.report.verdict" in seen


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({("a", "b"), ("b", "c"), ("c", "a")}) is not None and cycle({("a", "b"), ("b", "c")}) is None


@pytest.mark.parametrize("importer", sorted(FORBIDDEN))
def test_each_floor_imports_only_what_it_may(importer: str) -> None:
    wrong = sorted((a, b) for a, b in ARROWS if room(a) == importer and room(b) in FORBIDDEN[importer])
    assert not wrong, f"{importer} must not import {sorted(FORBIDDEN[importer])}: {wrong}"


def test_variants_import_only_the_public_surface() -> None:
    """What a built-in variant may import is exactly what a plugin may: the interface, ops, the fused steps, and each
    other."""
    wrong = sorted(
        (a, b) for a, b in ARROWS
        if room(a) == "attnbench.variants" and room(b) != "attnbench.variants" and b not in PUBLIC
    )  # fmt: skip
    assert not wrong
