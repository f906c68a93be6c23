"""Which model a generation grid runs on, and what preflight asks of it before any weight loads (no weights here): a
known model by name (`--model gemma`, or the grid's `model` key), an architecture attnbench does not route refused
by name, and the memory estimate's parts (a tied vocabulary matrix once, sliding-window layers holding their window,
the last position's logits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attnbench.generation.grid import parse_grid
from attnbench.generation.preflight import PreflightError, check, estimated_bytes
from attnbench.plan.config import ConfigError

GRID = {"name": "t", "tasks": ["passkey"], "seq_lens": [1024], "samples": 1, "methods": ["h2o"]}
GEMMA = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 18,
         "hidden_size": 640, "intermediate_size": 2048, "num_attention_heads": 4, "num_key_value_heads": 1,
         "head_dim": 256, "vocab_size": 262144, "tie_word_embeddings": True, "sliding_window": 512,
         "max_position_embeddings": 32768,
         "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3}  # fmt: skip


def test_the_grid_names_its_model() -> None:
    assert parse_grid({**GRID, "model": "Gemma-3-270M"}).model == "Gemma-3-270M"
    assert parse_grid(dict(GRID)).model is None
    for bad in (3, "", ["gemma"]):
        with pytest.raises(ConfigError, match="model: expected a known model's name"):
            parse_grid({**GRID, "model": bad})


@pytest.mark.parametrize("kind", ["gpt2", "phi3"])
def test_an_unrouted_architecture_is_refused_by_name_before_any_weight(tmp_path: Path, kind: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": kind, "architectures": ["SomethingForCausalLM"]}))
    said = f"its model type is '{kind}': attnbench routes .* llama, mistral"
    with pytest.raises(PreflightError, match=said) as error:
        check(parse_grid(dict(GRID)), tmp_path)  # the folder holds no weights and no tokenizer: never asked
    assert "weights" not in str(error.value) and "tokenizer" not in str(error.value)


def test_the_estimate_counts_windows_tied_embeddings_and_one_position_of_logits() -> None:
    n, methods = 32768, 8
    hybrid = estimated_bytes(GEMMA, n, methods)
    every_layer_global = estimated_bytes({**GEMMA, "layer_types": ["full_attention"] * 18}, n, methods)
    cache_saved = methods * 15 * 2 * 256 * (n - 512) * 4  # 15 sliding layers hold 512 positions, not n
    assert every_layer_global - hybrid == pytest.approx(1.5 * cache_saved)  # SLACK on what the states hold
    untied = estimated_bytes({**GEMMA, "tie_word_embeddings": False}, n, methods)
    assert untied - hybrid == 4 * 262144 * 640  # the vocabulary matrix once more
    weights = 4 * (262144 * 640 + 18 * (640 * 256 * 2 * (4 + 1) + 3 * 640 * 2048))
    assert weights == pytest.approx(1.07e9, rel=0.01)  # the converted folder's 1.07 GB
    at_short = estimated_bytes(GEMMA, 512, methods)
    assert at_short == estimated_bytes({**GEMMA, "layer_types": ["full_attention"] * 18}, 512, methods)
    assert at_short > weights + 4 * 262144  # the last position's logits counted


def test_a_known_name_resolves_to_its_cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """`--model gemma`, or a grid's `model = "gemma"`, is the cache's Gemma-3-270M folder; when absent the refusal
    names the make command that writes it; an unknown bare name is a usage error listing the known ones."""
    from attnbench.cli import main

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path / "cache"))
    toml = tmp_path / "g.toml"
    toml.write_text('tasks = ["passkey"]\nseq_lens = [1024]\nsamples = 1\nmethods = ["h2o"]\nmodel = "gemma"\n')
    out = tmp_path / "out"
    for argv in ([str(toml)], [str(toml), "--model", "Gemma-3-270M"]):
        assert main(["generate", *argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert str(tmp_path / "cache" / "Gemma-3-270M") in err and "make model MODEL=gemma-3-270m" in err
    with pytest.raises(SystemExit) as stopped:
        main(["generate", str(toml), "--model", "gemma4", "--out", str(out)])
    assert stopped.value.code == 2 and "known: SmolLM2-135M (smollm2); Gemma-3-270M" in capsys.readouterr().err
    assert not out.exists()
