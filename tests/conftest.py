"""Shared fixtures: registries with toy variants registered in this process, and a factory for real plugin packages
(a *.dist-info with entry_points.txt on sys.path) where discovery itself is under test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from attnbench.registry import Registry
from helpers import TESTS, write_plugin


REAL_HEADS = Path(os.environ.get("ATTNBENCH_HEADS") or Path.home() / ".cache" / "attnbench" / "heads")  # `make model`'s


@pytest.fixture(autouse=True, scope="session")
def no_captured_heads(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The suite sees no real model's captured heads unless a test asks for them (`real_heads`, `fake_heads`):
    presets list the `heads` input, and a run with or without them must not depend on what this machine holds.
    Subprocesses inherit it."""
    os.environ["ATTNBENCH_HEADS"] = str(tmp_path_factory.mktemp("no-heads"))


@pytest.fixture
def real_heads(monkeypatch: pytest.MonkeyPatch) -> Path:
    """SmolLM2-135M's heads as `make model` captured them (skipped where they are not)."""
    if not (REAL_HEADS / "SmolLM2-135M" / "heads.json").is_file():
        pytest.skip(f"no captured heads in {REAL_HEADS} (`make model`)")
    monkeypatch.setenv("ATTNBENCH_HEADS", str(REAL_HEADS))
    return REAL_HEADS


@pytest.fixture
def fake_heads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """A heads cache in a temporary folder (`helpers.write_fake_heads`), made the one runs see."""
    from helpers import write_fake_heads

    root = tmp_path / "heads"
    monkeypatch.setenv("ATTNBENCH_HEADS", str(root))

    def make(**kwargs) -> Path:
        return write_fake_heads(root, **kwargs)

    return make


SIGNAL_HANDLERS = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}  # at start


@pytest.fixture(autouse=True)
def signal_handlers_as_the_session_found_them():
    """In-process Ray (the Ray executor's tests) installs a SIGTERM handler of its own and leaves it after
    `ray.shutdown()`: `timeout`'s SIGTERM then failed one test and the suite ran on. Each test ends with the
    handlers the session started with, so a SIGTERM or Ctrl-C stops the suite."""
    yield
    for number, handler in SIGNAL_HANDLERS.items():
        if signal.getsignal(number) is not handler:
            signal.signal(number, handler)


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


def real_model_dir() -> Path:
    """The local SmolLM2-135M folder the tests marked `model` use: $ATTNBENCH_MODEL_DIR, else where `make model`
    writes it."""
    from attnbench.model.convert import DEFAULT_DIR

    return Path(os.environ.get("ATTNBENCH_MODEL_DIR") or DEFAULT_DIR)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `model` is skipped, saying why, where the real model's folder is absent."""
    if item.get_closest_marker("model") is not None and not (real_model_dir() / "config.json").is_file():
        pytest.skip(f"no local model at {real_model_dir()} (`make model`, or set ATTNBENCH_MODEL_DIR)")
    if item.get_closest_marker("gemma") is not None and not (real_gemma_dir() / "config.json").is_file():
        pytest.skip(f"no local Gemma-3-270M at {real_gemma_dir()} (`make model MODEL=gemma-3-270m`, or set "
                    "ATTNBENCH_GEMMA_DIR)")


def real_gemma_dir() -> Path:
    """Gemma-3-270M's folder, where `make model MODEL=gemma-3-270m` writes it."""
    default = Path.home() / ".cache" / "attnbench" / "Gemma-3-270M"
    return Path(os.environ.get("ATTNBENCH_GEMMA_DIR") or default)


@pytest.fixture(scope="session")
def gemma_dir() -> Path:
    """The real hybrid decoder's folder (tests using it are marked `gemma`)."""
    return real_gemma_dir()


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The real decoder's folder (tests using it are marked `model`)."""
    return real_model_dir()
