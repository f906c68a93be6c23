"""Capturing a hybrid model's heads (`attnbench.model.capture`, `attnbench.model.heads`) on a tiny random Gemma 3
(no weights): a sliding-window layer recorded over a whole sequence is computed over its window (never an n x n mask)
and the model's output is what transformers' own SDPA gives; `keep` records the layers asked for alone; `heads` keeps
a hybrid model's global layers."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_gemma() -> torch.nn.Module:
    from transformers import AutoModel, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=8,
                              max_position_embeddings=256, query_pre_attn_scalar=16)  # fmt: skip
    torch.manual_seed(0)
    return AutoModel.from_config(config, attn_implementation="sdpa").eval()


def test_a_sliding_layer_is_recorded_over_its_window_exactly(tiny_gemma, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnbench.model import capture

    ids = torch.randint(64, (1, 40))  # five windows' length
    with torch.no_grad():
        reference = tiny_gemma(input_ids=ids).last_hidden_state  # transformers' SDPA with its sliding-window mask
    windowed, original = [], capture.windowed_attention

    def counted(query, key, value, window, scaling):
        windowed.append(window)
        return original(query, key, value, window, scaling)

    monkeypatch.setattr(capture, "windowed_attention", counted)
    seen = {}
    hook = tiny_gemma.register_forward_hook(lambda module, args, out: seen.update(out=out.last_hidden_state))
    try:
        record = capture.record_attention(tiny_gemma, ids, keep=[1, 5])
    finally:
        hook.remove()
    assert windowed == [8] * 5  # the five sliding layers, each over its own window
    torch.testing.assert_close(seen["out"], reference, atol=1e-5, rtol=1e-4)
    assert record.calls == 6 and len(record.q) == 2  # layers 1 and 5 alone kept
    assert record.q[0].shape == (1, 4, 40, 16) and record.k[0].shape == (1, 1, 40, 16)


def test_padding_keeps_transformers_mask() -> None:
    """Only a whole unpadded sequence skips the mask: with padding, transformers' own SDPA mask is built."""
    from attnbench.model.capture import _recording_mask

    padded = torch.tensor([[0, 1, 1, 1, 1, 1]])
    assert _recording_mask(1, 6, 6, attention_mask=padded, local_size=2) is not None
    assert _recording_mask(1, 6, 6, attention_mask=torch.ones(1, 6, dtype=torch.long), local_size=2) is None


@pytest.mark.parametrize("settings, kept, says", [
    ({"model_type": "gemma3_text", "num_hidden_layers": 18, "sliding_window": 512}, [5, 11, 17],
     "global layers only: 3 of 18"),
    ({"model_type": "llama", "num_hidden_layers": 30}, [1, 4, 7, 10, 13, 16, 19, 22, 25, 28], "every layer's"),
    ({"model_type": "mistral", "num_hidden_layers": 4, "sliding_window": 64}, [0, 1, 2, 3], "every layer slides"),
])  # fmt: skip
def test_heads_keep_a_hybrid_models_global_layers(settings: dict, kept: list[int], says: str) -> None:
    from transformers import AutoConfig

    from attnbench.model.heads import kept_layers

    layers, attention = kept_layers(AutoConfig.for_model(**settings))
    assert layers == kept and attention.startswith(says)
