"""Shared fixtures: registries with toy variants registered in this process, and a factory for real plugin packages
(a *.dist-info with entry_points.txt on sys.path) where discovery itself is under test."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest
from attnbench.registry import GROUP, Registry


def write_plugin(root: Path, dist: str, entries: dict[str, str], modules: dict[str, str]) -> Path:
    """Write an installed-looking distribution under `root`: modules plus `<dist>-0.1.dist-info`."""
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = [f"[{GROUP}]"] + [f"{name} = {target}" for name, target in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    return root


@pytest.fixture
def toy_registry() -> Callable[..., Registry]:
    """A fresh registry (the installed variants) with toy variant classes registered in this process."""

    def make(*classes: type) -> Registry:
        registry = Registry()
        for variant_class in classes:
            registry.register(variant_class)
        return registry

    return make


@pytest.fixture
def plugin_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Registry]:
    """Install plugin distributions on sys.path for this test and return a fresh registry that sees them."""

    def install(dist: str, entries: dict[str, str], modules: dict[str, str]) -> Registry:
        root = write_plugin(tmp_path / dist, dist, entries, modules)
        monkeypatch.syspath_prepend(str(root))
        return Registry()

    return install


TESTS = Path(__file__).parent
TEST_PLUGINS = ("example_plugin", "broken_plugin", "faulty_plugin")


@pytest.fixture(scope="session")
def installed_plugins(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The example, broken and faulty plugin packages pip-installed into a folder put on PYTHONPATH: the
    environment for attnbench subprocesses that see them as any user's installed plugins."""
    target = tmp_path_factory.mktemp("site")
    for package in TEST_PLUGINS:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
             "--target", str(target), str(TESTS / package)],
            check=True,
            capture_output=True,
        )  # fmt: skip
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
