"""`attnbench capture` on a tiny randomly initialized model built here (no download)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attnbench.cli import main
from attnbench.inputs import make_inputs

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaModel(config).eval()
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    return folder, model


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_capture_writes_what_the_model_computes(tiny_llama, tmp_path: Path, suffix: str) -> None:
    folder, model = tiny_llama
    out = tmp_path / f"qkv{suffix}"
    assert main(["capture", str(folder), "--token-ids", "1,5,9,13,17,21,25,29", "--out", str(out)]) == 0
    inputs = make_inputs(
        "captured",
        {"path": str(out), "layer": 0},
        batch=1,
        heads=4,
        seq_len=8,
        head_dim=8,
        dtype=torch.float32,
        device=torch.device("cpu"),
        seed=0,
    )
    with torch.no_grad():
        layer = model.layers[0]
        hidden = layer.input_layernorm(model.embed_tokens(torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])))
        q = layer.self_attn.q_proj(hidden).view(1, 8, 4, 8).transpose(1, 2)
        k = layer.self_attn.k_proj(hidden).view(1, 8, 2, 8).transpose(1, 2)
    torch.testing.assert_close(inputs.q, q)
    torch.testing.assert_close(inputs.k, k.repeat_interleave(2, dim=1))  # grouped-query heads repeated


def test_capture_random_tokens_and_every_layer(tiny_llama, tmp_path: Path) -> None:
    folder, _ = tiny_llama
    out = tmp_path / "qkv.pt"
    assert main(["capture", str(folder), "--random-tokens", "24", "--out", str(out)]) == 0
    data = torch.load(out)
    assert data["q"].shape == (2, 1, 4, 24, 8) and data["k"].shape == (2, 1, 2, 24, 8)


def test_capture_refuses_what_it_cannot_read(tmp_path: Path, capsys) -> None:
    assert main(["capture", str(tmp_path), "--random-tokens", "4", "--out", str(tmp_path / "x.pt")]) == 2
    assert "not a local model folder" in capsys.readouterr().err
