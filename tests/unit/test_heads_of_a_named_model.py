"""Heads of a model other than SmolLM2 (Gemma-3-270M's: head_dim 256, 32K positions): naming them in --inputs sets
the cells' head_dim to the model's, a config's own head_dim is kept and the cells it cannot serve say which key to
set; each text captured to its own length, and a cell drawn from a text no longer than that text's capture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from attnbench.inputs.captured import read_tensors
from attnbench.inputs.catalogue import make_inputs
from attnbench.plan.config import load_config, parse_config
from attnbench.plan.fit import input_unfit
from helpers import tiny


def test_heads_named_in_inputs_set_the_cells_head_dim_to_the_models(fake_heads):
    fake_heads(model="Big", head_dim=32, positions=300)
    config = load_config("decode", {"inputs": "heads(model=Big),needles(pairs=4, background=heads, model=Big)",
                                    "variants": "band(window=64, sinks=4)", "seq_lens": [256]})  # fmt: skip
    assert config.axes["head_dim"] == [32]  # the preset's 64 is for synthetic inputs
    assert any("head_dim 32 (was 64)" in note and "heads(model=Big)" in note for note in config.notes)
    cells = config.plan().cells
    assert cells and {cell.head_dim for cell in cells} == {32}
    assert all(input_unfit(cell, 16) is None for cell in cells)


def test_a_config_that_sets_no_head_dim_takes_the_models_and_one_that_does_keeps_its_own(fake_heads):
    fake_heads(model="Big", head_dim=32, positions=300)
    unset = {key: value for key, value in tiny().items() if key != "head_dim"}
    heads = [{"name": "heads", "model": "Big"}, {"name": "realistic"}]
    config = parse_config({**unset, "seq_lens": [128], "causal": True, "inputs": heads})
    assert config.axes["head_dim"] == [32]  # realistic drawn at it too
    kept = parse_config({**tiny(), "seq_lens": [128], "causal": True, "inputs": heads})
    assert kept.axes["head_dim"] == [8] and not kept.notes  # the file's own choice: the heads' cells skipped, said
    [why] = {input_unfit(cell, 0) for cell in kept.plan().cells if cell.input.name == "heads"}
    assert "head_dim 32, this cell asks 8: set head_dim = 32" in why


def test_heads_of_two_models_give_both_head_dims_each_drawn_at_its_own(fake_heads):
    fake_heads(model="Big", head_dim=32)
    fake_heads(model="Small", head_dim=16)
    config = load_config("decode", {"inputs": "heads(model=Big),heads(model=Small)", "variants": "full",
                                    "seq_lens": [128]})  # fmt: skip
    assert config.axes["head_dim"] == [16, 32]
    drawn = {(cell.input.label(), cell.head_dim) for cell in config.plan().cells if input_unfit(cell, 16) is None}
    assert drawn == {("heads(model=Big)", 32), ("heads(model=Small)", 16)}


def shorten(folder: Path, text: str, tokens: int) -> None:
    """Make one text of a fake capture shorter, as `attnbench heads` writes a text that ran out."""
    manifest = json.loads((folder / "heads.json").read_text())
    manifest["texts"][text].update(tokens=tokens, limited_by=f"the shipped {text}.txt gives {tokens} tokens")
    manifest["positions"], manifest["limited_by"] = tokens, f"the shipped {text}.txt gives {tokens} tokens"
    (folder / "heads.json").write_text(json.dumps(manifest))


def test_each_text_serves_cells_up_to_its_own_positions(fake_heads):
    shorten(fake_heads(model="Big", head_dim=16, positions=300), "code", 200)
    config = parse_config({**tiny(), "seq_lens": [150, 250], "head_dim": 16, "causal": True,
                           "inputs": [{"name": "heads", "model": "Big", "text": text} for text in ("prose", "code")]})  # fmt: skip
    why = {(cell.input.label(), cell.seq_len): input_unfit(cell, 0) for cell in config.plan().cells}
    assert why[("heads(model=Big, text=prose)", 250)] is None  # the prose went on to 300
    assert why[("heads(model=Big, text=code)", 150)] is None
    assert "on the code were captured at 200 positions (the shipped code.txt gives 200" in why[
        ("heads(model=Big, text=code)", 250)]  # fmt: skip
    draw = dict(batch=1, heads=2, seq_len=250, head_dim=16, dtype=torch.float32, device=torch.device("cpu"), seed=0,
                causal=True)  # fmt: skip
    assert make_inputs("heads", {"model": "Big"}, **draw).q.shape == (1, 2, 250, 16)
    with pytest.raises(ValueError, match="on the code: causal cells of N <= 200"):
        make_inputs("heads", {"model": "Big", "text": "code"}, **draw)


def tiny_decoder(folder: Path, positions: int) -> Path:
    """A 2-layer Llama of random weights trained (so says its config) on `positions`, with a byte-level tokenizer:
    a text gives one token a byte."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocabulary = {byte: i for i, byte in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocabulary, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(folder)
    config = LlamaConfig(vocab_size=len(vocabulary), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_a_capture_takes_each_text_to_its_own_length(tmp_path, monkeypatch):
    import attnbench.model.texts as texts
    from attnbench.model.heads import DECODE_HEADROOM, capture_heads

    monkeypatch.setenv("ATTNBENCH_HEADS", str(tmp_path / "heads"))
    (tmp_path / "long.txt").write_text("the long one " * 30)  # 390 bytes: past 128 + 64
    (tmp_path / "short.txt").write_text("short " * 25)  # 150 bytes: runs out
    monkeypatch.setattr(texts, "HEADS_TEXTS", {"prose": (tmp_path / "long.txt",), "code": (tmp_path / "short.txt",)})
    said: list[str] = []
    folder = capture_heads(tiny_decoder(tmp_path / "Tiny", positions=128), say=said.append)
    manifest = json.loads((folder / "heads.json").read_text())
    assert manifest["texts"]["prose"]["tokens"] == 128 + DECODE_HEADROOM and "limited_by" not in manifest["texts"]["prose"]
    assert manifest["texts"]["code"]["tokens"] == 150 and "short.txt gives 150" in manifest["texts"]["code"]["limited_by"]
    assert manifest["positions"] == 150 and "short.txt" in manifest["limited_by"]  # what every text serves
    assert read_tensors(folder / "prose.pt")["q"].shape[-2] == 128 + DECODE_HEADROOM
    assert any("the code is captured at 150" in line for line in said)


def test_the_heads_texts_continue_the_shipped_ones_which_the_tasks_read_unchanged():
    """`attnbench heads` reads each text with its continuation; the generation tasks and `calibrate` read the first
    file alone, as it first shipped, so their draws do not move when a continuation grows."""
    from attnbench.model import texts

    for name, (first, more) in texts.HEADS_TEXTS.items():
        whole = texts.heads_text(name)
        assert whole == first.read_text(encoding="utf-8") + more.read_text(encoding="utf-8")
        assert len(more.read_text(encoding="utf-8")) > 30_000
    assert (texts.TUTORIAL, texts.ARGPARSE) == tuple(paths[0] for paths in texts.HEADS_TEXTS.values())
