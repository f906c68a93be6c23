"""The `heads` input: a model's captured heads drawn across depth at the model's own scaling; the cells it cannot
serve skipped with their reason; presets without captured heads run on `realistic` and say so; an explicitly named
model that is missing is the config's error."""

from __future__ import annotations

import math

import pytest
import torch
from attnbench.inputs.captured import read_tensors
from attnbench.inputs.catalogue import make_inputs, validate_input
from attnbench.inputs.heads import pool_indices
from attnbench.plan.config import ConfigError, load_config, parse_config
from attnbench.plan.fit import input_unfit
from helpers import tiny


def draw(seed: int = 0, heads: int = 8, n: int = 200, **params):
    return make_inputs("heads", params, batch=1, heads=heads, seq_len=n, head_dim=16, dtype=torch.float32,
                       device=torch.device("cpu"), seed=seed, causal=True)  # fmt: skip


def test_heads_spread_over_every_layer_with_their_own_key_heads_and_the_models_scaling(fake_heads):
    folder = fake_heads(layers=4, heads=6, kv_heads=2)
    data = read_tensors(folder / "prose.pt")
    inputs = draw(heads=8)
    assert inputs.q.shape == (1, 8, 200, 16)
    found = []
    for h in range(8):  # each cell head is one captured (layer, head), q at scaling * sqrt(d), k/v of its group
        match = [(layer, head) for layer in range(4) for head in range(6)
                 if torch.allclose(inputs.k[0, h], data["k"][layer, 0, head // 3, :200].float())
                 and torch.allclose(inputs.q[0, h], data["q"][layer, 0, head, :200].float() * 0.3 * 4)]  # fmt: skip
        assert len(match) == 1, h
        found.append(match[0])
    assert {layer for layer, _ in found} == {0, 1, 2, 3}  # across depth, not one layer's first heads
    assert len(set(found)) == 8


def test_full_attention_on_heads_is_the_models_own(fake_heads):
    folder = fake_heads()
    data = read_tensors(folder / "code.pt")
    inputs = draw(heads=1, text="code")
    layer, head = divmod(pool_indices(1, 4 * 6, 0.0)[0], 6)  # which captured head it is, whatever the shift
    layer, head = next((l, h) for l in range(4) for h in range(6)
                       if torch.allclose(inputs.v[0, 0], data["v"][l, 0, h // 3, :200].float())
                       and torch.allclose(inputs.q[0, 0], data["q"][l, 0, h, :200].float() * 1.2))  # fmt: skip
    q, k, v = (data[name][layer, 0, head // (3 if name != "q" else 1), :200].float() for name in "qkv")
    scores = (q @ k.T) * 0.3  # the model's own scaling, not the variants' 1/sqrt(16)
    scores.masked_fill_(torch.ones(200, 200).triu(1).bool(), -math.inf)
    ours = torch.nn.functional.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v, is_causal=True)[0, 0]
    assert torch.allclose(ours, torch.softmax(scores, -1) @ v, atol=1e-4)


def test_another_seed_draws_other_heads(fake_heads):
    fake_heads()
    assert not torch.equal(draw(seed=0).q, draw(seed=1).q)
    assert torch.equal(draw(seed=3).q, draw(seed=3).q)


def test_cells_the_heads_cannot_serve_are_skipped_with_the_reason(fake_heads):
    fake_heads(positions=300)
    config = parse_config({**tiny(), "seq_lens": [256, 512], "head_dim": 16, "causal": True, "mode": "decode", "decode_steps": 8,
                           "inputs": [{"name": "heads", "text": "code"}]})  # fmt: skip
    reasons = {cell.seq_len: input_unfit(cell, 8) for cell in config.plan().cells}
    assert reasons[256] is None
    assert "captured at 300 positions" in reasons[512] and "needs 520" in reasons[512]


def test_non_causal_cells_are_not_planned_for_heads_and_the_plan_says_so(fake_heads):
    fake_heads()
    config = parse_config({**tiny(), "seq_lens": [128], "head_dim": 16, "causal": [False, True],
                           "inputs": [{"name": "realistic"}, {"name": "heads"}]})  # fmt: skip
    plan = config.plan()
    assert not any(cell.input.name == "heads" and not cell.causal for cell in plan.cells)
    assert any(cell.input.name == "heads" and cell.causal for cell in plan.cells)
    assert any("causal cells only" in note for note in plan.notes)


def test_a_preset_without_captured_heads_runs_on_realistic_and_says_which_command_gets_them():
    config = load_config("decode")
    assert {spec.name for spec in config.axes["input"]} == {"realistic", "needles"}
    assert all(dict(spec.params).get("background") != "heads" for spec in config.axes["input"])
    assert len(config.notes) == 1 and "make model" in config.notes[0] and "synthetic" in config.notes[0]


def test_a_preset_with_captured_heads_lists_them_for_error_and_recall(fake_heads):
    fake_heads(positions=300)
    config = load_config("decode")
    labels = [spec.label() for spec in config.axes["input"]]
    assert sum(spec.name == "heads" for spec in config.axes["input"]) == 2
    assert any("background=heads" in label for label in labels) and not config.notes


def test_a_model_named_but_not_captured_is_an_error_naming_the_command(fake_heads):
    fake_heads(model="Other")
    with pytest.raises(ConfigError) as error:
        parse_config({**tiny(), "causal": True, "inputs": [{"name": "heads", "model": "Mine"}]})
    assert "no captured heads of 'Mine'" in str(error.value) and "attnbench heads" in str(error.value)
    assert "captured: Other" in str(error.value)
    assert validate_input("heads", {"model": "Other", "text": "poetry"})[0].startswith("input 'heads': text must be")


def test_pool_indices_spread_evenly():
    assert pool_indices(4, 40, 0.0) == [0, 10, 20, 30]
    assert pool_indices(4, 40, 0.5) == [5, 15, 25, 35]
    assert pool_indices(3, 2, 0.0) == [0, 0, 1]  # more heads asked than captured: repeated, never out of range


def test_a_non_causal_run_says_nothing_of_heads_it_would_never_draw(fake_heads, monkeypatch, tmp_path):
    assert load_config("choices").notes == []  # non-causal, no heads captured: not a word
    fake_heads()
    assert load_config("choices").plan().notes == []  # captured, still non-causal: nothing to skip aloud


def test_a_config_of_heads_alone_without_them_captured_says_how_to_capture_them():
    with pytest.raises(ConfigError) as error:
        parse_config({**tiny(), "causal": True, "inputs": [{"name": "heads"}, {"name": "heads", "text": "code"}]})
    assert "no captured heads of 'SmolLM2-135M'" in str(error.value) and "make model" in str(error.value)
    assert "empty list" not in str(error.value)
