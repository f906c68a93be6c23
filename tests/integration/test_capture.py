"""`attnbench capture` on a tiny randomly initialized model built here (no download)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attnbench.cli import main
from attnbench.inputs.catalogue import make_inputs

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


TOKENS = [1, 5, 9, 13, 17, 21, 25, 29]


def projections_and_output(model, layer_index: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's q/k/v projections (pre-rotary, (b, heads, n, d)) and its attention output before o_proj."""
    seen = {}
    layer = model.layers[layer_index].self_attn
    handle = layer.o_proj.register_forward_pre_hook(lambda module, args: seen.setdefault("out", args[0]))
    with torch.no_grad():
        model(input_ids=torch.tensor([TOKENS]))
        hidden = model.layers[0].input_layernorm(model.embed_tokens(torch.tensor([TOKENS])))
    handle.remove()
    q = layer.q_proj(hidden).view(1, 8, 4, 8).transpose(1, 2)
    k = layer.k_proj(hidden).view(1, 8, 2, 8).transpose(1, 2)
    v = layer.v_proj(hidden).view(1, 8, 2, 8).transpose(1, 2)
    return q.detach(), k.detach(), v.detach(), seen["out"].view(1, 8, 4, 8).transpose(1, 2)


def load(path: Path, layer=0, heads: int = 4):
    return make_inputs("captured", {"path": str(path), "layer": layer}, batch=1, heads=heads, seq_len=8, head_dim=8,
                       dtype=torch.float32, device=torch.device("cpu"), seed=0)  # fmt: skip


@pytest.mark.parametrize("suffix", [".pt", ".safetensors", ".npz"])
def test_capture_writes_what_attention_sees_after_the_rotary_embedding(tiny_llama, tmp_path: Path, suffix: str) -> None:
    """Issue 35: q/k after the model's rotary embedding, recorded at the attention function; exact causal attention
    on them reproduces the model's attention output; the file says what it holds."""
    from attnbench.inputs.captured import capture_meta, read_tensors
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    folder, model = tiny_llama
    out = tmp_path / f"qkv{suffix}"
    assert main(["capture", str(folder), "--token-ids", ",".join(map(str, TOKENS)), "--out", str(out)]) == 0
    inputs = load(out)
    q, k, v, output = projections_and_output(model)
    cos, sin = model.rotary_emb(q, torch.arange(8)[None])
    q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(inputs.q, q_rot)
    torch.testing.assert_close(inputs.k, k_rot.repeat_interleave(2, dim=1))  # grouped-query heads repeated
    torch.testing.assert_close(inputs.v, v.repeat_interleave(2, dim=1))
    again = torch.nn.functional.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v, is_causal=True)
    torch.testing.assert_close(again, output, rtol=1e-5, atol=1e-6)
    meta = capture_meta(read_tensors(out))
    assert meta["post_rotary"] and meta["rotary"] and meta["causal"] and meta["positions"] == 8
    assert meta["recorded_at"] == "attention (post-rotary)" and meta["scaling"] == [8**-0.5] * 2
    assert read_tensors(out)["k"].shape == (2, 1, 2, 8, 8)  # key/value heads kept as the model's


def test_pre_rotary_on_request_and_a_warning_when_such_a_file_is_read(tiny_llama, tmp_path: Path) -> None:
    from attnbench.inputs.captured import write_tensors

    folder, model = tiny_llama
    out = tmp_path / "pre.pt"
    assert main(["capture", str(folder), "--token-ids", ",".join(map(str, TOKENS)), "--out", str(out), "--pre-rotary"]) == 0
    with pytest.warns(UserWarning, match="before llama's rotary embedding"):
        inputs = load(out)
    q, k, _, _ = projections_and_output(model)
    torch.testing.assert_close(inputs.q, q)
    old = tmp_path / "old.pt"  # what the capture before issue 35 wrote: no description
    data = torch.load(out)
    write_tensors(old, {name: data[name] for name in ("q", "k", "v")})
    with pytest.warns(UserWarning, match="does not say what it holds"):
        load(old)


def test_a_captured_input_takes_several_layers_side_by_side(tiny_llama, tmp_path: Path) -> None:
    folder, _ = tiny_llama
    out = tmp_path / "qkv.pt"
    assert main(["capture", str(folder), "--random-tokens", "8", "--out", str(out)]) == 0
    both = load(out, layer=[1, 0], heads=8)
    torch.testing.assert_close(both.q[:, :4], load(out, layer=1).q)
    torch.testing.assert_close(both.q[:, 4:], load(out, layer=0).q)
    from attnbench.inputs.catalogue import validate_input

    assert "layer must be an integer >= 0 or a non-empty list" in validate_input("captured", {"path": str(out), "layer": []})[0]
    assert "layer 2 is out of range" in validate_input("captured", {"path": str(out), "layer": [0, 2]})[0]


def test_capture_random_tokens_and_every_layer(tiny_llama, tmp_path: Path) -> None:
    folder, _ = tiny_llama
    out = tmp_path / "qkv.pt"
    assert main(["capture", str(folder), "--random-tokens", "24", "--out", str(out)]) == 0
    data = torch.load(out)
    assert data["q"].shape == (2, 1, 4, 24, 8) and data["k"].shape == (2, 1, 2, 24, 8)
    assert main(["capture", str(folder), "--random-tokens", "24", "--seq-len", "10", "--out", str(out)]) == 0
    assert torch.load(out)["q"].shape == (2, 1, 4, 10, 8)


def test_capture_says_so_when_the_text_is_longer_than_the_models_positions(tiny_llama, tmp_path: Path, capsys) -> None:
    """A BERT-style model has learned positions for max_position_embeddings tokens: a longer text is a message and
    exit 2, not a traceback from inside the model; a rotary model would run on past its positions (holding GBs for
    a long text), so it is refused alike, before it runs (review of issue 35)."""
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=100,
        max_position_embeddings=16,
    )  # fmt: skip
    folder = tmp_path / "tiny-bert"
    transformers.BertModel(config).save_pretrained(folder)
    out = tmp_path / "qkv.pt"
    assert main(["capture", str(folder), "--random-tokens", "17", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "17 tokens, beyond the model's 16 positions" in err and "Traceback" not in err
    assert not out.exists()
    assert main(["capture", str(folder), "--random-tokens", "16", "--out", str(out)]) == 0
    llama, _ = tiny_llama  # max_position_embeddings 64, rotary
    assert main(["capture", str(llama), "--random-tokens", "80", "--out", str(out)]) == 2
    assert "give --seq-len 64 or fewer" in capsys.readouterr().err
    assert main(["capture", str(llama), "--random-tokens", "80", "--seq-len", "64", "--out", str(out)]) == 0


def test_capture_refuses_what_it_cannot_read(tmp_path: Path, capsys) -> None:
    assert main(["capture", str(tmp_path), "--random-tokens", "4", "--out", str(tmp_path / "x.pt")]) == 2
    assert "not a local model folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    "config_json, says",
    [
        ("{not json", "is not a valid JSON file"),
        ('{"hidden_size": 32}', "Should have a `model_type` key"),
        ('{"model_type": "martian"}', "model type `martian`"),
    ],
    ids=["not-json", "no-model-type", "unknown-model-type"],
)
@pytest.mark.parametrize("command", ["capture", "model"])
def test_a_config_json_transformers_cannot_use_is_a_message_and_exit_2(
    command: str, config_json: str, says: str, tmp_path: Path, capsys
) -> None:
    """Issue 22, item 12: a damaged or foreign config.json is named with transformers' reason, never a traceback."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(config_json)
    out = ["--out", str(tmp_path / "qkv.pt")] if command == "capture" else ["--out", str(tmp_path / "o"), "--variants", "band"]
    assert main([command, str(folder), "--random-tokens", "8", *out]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'config.json'} cannot be used" in err and says in err


def test_capture_writes_npz_the_captured_input_reads_and_refuses_other_suffixes(tiny_llama, tmp_path: Path, capsys) -> None:
    """Issue 22, item 12: `--out x.npz` was a torch archive under an .npz name that the captured input refused."""
    folder, _ = tiny_llama
    archive = tmp_path / "qkv.npz"
    assert main(["capture", str(folder), "--random-tokens", "8", "--out", str(archive)]) == 0
    inputs = make_inputs("captured", {"path": str(archive), "layer": 1}, batch=1, heads=4, seq_len=8, head_dim=8,
                         dtype=torch.float32, device=torch.device("cpu"), seed=0)  # fmt: skip
    reference = tmp_path / "qkv.pt"
    assert main(["capture", str(folder), "--random-tokens", "8", "--out", str(reference)]) == 0
    torch.testing.assert_close(inputs.q, torch.load(reference)["q"][1], rtol=0, atol=0)  # the same tensors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qkv.npz", "qkv.pt"]  # no temporary file left
    capsys.readouterr()
    assert main(["capture", str(folder), "--random-tokens", "8", "--out", str(tmp_path / "qkv.npy")]) == 2
    assert "unknown format '.npy' (use .pt, .safetensors, .npz)" in capsys.readouterr().err


def test_model_refuses_a_model_without_layers(tmp_path: Path, capsys) -> None:
    """Review of issue 22: num_hidden_layers = 0 was an IndexError traceback."""
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=0, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=64,
                                      architectures=["LlamaForCausalLM"])  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "empty")
    argv = ["model", str(tmp_path / "empty"), "--variants", "band", "--random-tokens", "8", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "has num_hidden_layers = 0: no attention layer to swap" in capsys.readouterr().err


def test_capture_writes_a_file_whose_name_is_as_long_as_the_file_system_allows(tiny_llama, tmp_path: Path) -> None:
    """Review of issue 22: the temporary file's added '.tmp' pushed a legal 252–255-byte name over the limit."""
    folder, _ = tiny_llama
    out = tmp_path / ("q" * 252 + ".pt")  # 255 bytes
    assert main(["capture", str(folder), "--random-tokens", "8", "--out", str(out)]) == 0
    assert torch.load(out)["q"].shape == (2, 1, 4, 8, 8) and [p.name for p in tmp_path.iterdir()] == [out.name]


def test_a_run_takes_a_list_of_layers_and_resumes(tiny_llama, tmp_path: Path, capsys) -> None:
    """Review of issue 35: `layer = [0, 1]` passed validation, then cells could not be hashed (a TypeError)."""
    folder, _ = tiny_llama
    out = tmp_path / "qkv.pt"
    assert main(["capture", str(folder), "--random-tokens", "16", "--out", str(out)]) == 0
    config = tmp_path / "c.toml"
    config.write_text(f'seq_lens = [16]\nheads = 8\nhead_dim = 8\ncausal = true\nmin_run_time = 0.01\n'
                      f'[[inputs]]\nname = "captured"\npath = "{out}"\nlayer = [0, 1]\n'
                      '[[variants]]\nname = "full"\n[[variants]]\nname = "band"\nwindow = 4\n')  # fmt: skip
    assert main(["run", str(config), "--dry-run"]) == 0
    assert main(["run", str(config), "--out", str(tmp_path / "runs"), "--no-progress"]) == 0
    run = next((tmp_path / "runs").iterdir())
    assert "layer=(0, 1)" in (run / "results.csv").read_text()
    assert main(["run", "--resume", str(run)]) == 0
    assert "0 cells" in capsys.readouterr().err  # both found again: the keys read back from the folder match
