"""`attnbench calibrate` on a tiny randomly initialized decoder built here, and its argument checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attnbench.cli import main
from attnbench.inputs.calibration import targets_from
from attnbench.inputs.statistics import STATISTICS

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama with the GPT-2-free tokenizer of the tokenizers package: a word-level vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(95)]
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path_factory.mktemp("tiny-decoder")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(folder)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=256)  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    (folder / "text.txt").write_text(" ".join(words[i % 95] for i in range(400)))
    return folder


def test_calibrate_writes_per_length_statistics_with_their_provenance(tiny_decoder: Path, tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    argv = ["calibrate", str(tiny_decoder), "--out", str(out), "--seq-lens", "32", "128", "--windows", "2",
            "--text-file", str(tiny_decoder / "text.txt")]  # fmt: skip
    assert main(argv) == 0
    table = json.loads(out.read_text())
    assert table["layers"] == 3 and table["kv_heads"] == 2 and table["text"] == "text.txt"
    assert sorted(table["lengths"]) == ["128", "32"] and table["lengths"]["128"]["windows"] == 2
    for n in (32, 128):
        targets = targets_from(table, n)
        assert set(targets) == set(STATISTICS)
        assert all(0 <= t.mean <= 1 and t.spread >= 0 for t in targets.values())
        statistics = table["lengths"][str(n)]["statistics"]
        assert all(len(s["per_head"]) == 12 and set(s["by_depth"]) == {"early", "middle", "late"}
                   for s in statistics.values())  # fmt: skip


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--seq-lens", "1"], "--seq-lens: 1 must be >= 2"),
        (["--seq-lens", "512"], "beyond the model's 256 positions"),
        (["--windows", "0"], "--windows must be >= 1"),
        (["--seq-lens", "200", "--windows", "1"], "the text gives"),
    ],
)
def test_calibrate_refuses_bad_arguments_before_the_model_runs(tiny_decoder: Path, tmp_path: Path, capsys,
                                                                extra: list[str], says: str) -> None:  # fmt: skip
    out = tmp_path / "table.json"
    text = tmp_path / "short.txt"
    text.write_text("w1 w2 w3 " * 30)
    assert main(["calibrate", str(tiny_decoder), "--out", str(out), "--text-file", str(text), *extra]) == 2
    assert says in capsys.readouterr().err and not out.exists()
