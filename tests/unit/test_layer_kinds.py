"""Which layers attend globally and which through a sliding window (`attnbench.model.layer_kinds`), from a config
alone: transformers' own rule, checked against transformers' config classes on tiny configs; and the architectures
attnbench routes its methods through, an unrouted one named."""

from __future__ import annotations

import pytest
from attnbench.model.layer_kinds import ROUTED_MODEL_TYPES, global_layers, layer_windows, unrouted_reason

GEMMA = {"model_type": "gemma3_text", "num_hidden_layers": 12, "sliding_window": 512,
         "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"]}
CASES = {  # config -> what each layer sees (None: global)
    "gemma3_text": (GEMMA, [512] * 5 + [None] + [512] * 5 + [None]),
    "gemma3_text, no layer_types (its pattern of 6)": ({**GEMMA, "layer_types": None, "num_hidden_layers": 7},
                                                       [512] * 5 + [None, 512]),
    "gemma3 (multimodal: its text config)": ({"model_type": "gemma3", "text_config": GEMMA},
                                             [512] * 5 + [None] + [512] * 5 + [None]),
    "qwen2 without sliding window": ({"model_type": "qwen2", "num_hidden_layers": 4, "sliding_window": 4096,
                                      "use_sliding_window": False, "max_window_layers": 2}, [None] * 4),
    "qwen2 with sliding window": ({"model_type": "qwen2", "num_hidden_layers": 4, "sliding_window": 64,
                                   "use_sliding_window": True, "max_window_layers": 2}, [None, None, 64, 64]),
    "qwen3 with sliding window": ({"model_type": "qwen3", "num_hidden_layers": 3, "sliding_window": 32,
                                   "use_sliding_window": True, "max_window_layers": 1}, [None, 32, 32]),
    "mistral": ({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 128}, [128, 128]),
    "mistral without a window": ({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": None}, [None] * 2),
    "llama": ({"model_type": "llama", "num_hidden_layers": 3}, [None] * 3),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_layer_windows_from_a_config(case: str) -> None:
    config, expected = CASES[case]
    assert layer_windows(config) == expected
    assert global_layers(config) == [i for i, w in enumerate(expected) if w is None]


SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
         "vocab_size": 64}  # fmt: skip


@pytest.mark.parametrize("case", [c for c in CASES if "multimodal" not in c])
def test_the_rule_is_transformers_own(case: str) -> None:
    """The same answer from transformers' config class (its __post_init__ fills layer_types its own way)."""
    from transformers import AutoConfig

    config, expected = CASES[case]
    given = {key: value for key, value in config.items() if key != "model_type"}
    built = AutoConfig.for_model(config["model_type"], **SMALL, **given)
    assert layer_windows(built) == expected
    kinds = getattr(built, "layer_types", None)
    if kinds is not None and config["model_type"] != "mistral":  # mistral ignores layer types
        windows = getattr(built, "sliding_window", None)
        assert [windows if kind == "sliding_attention" and windows else None for kind in kinds] == expected


@pytest.mark.parametrize("kind", ["gpt2", "phi3", None])
def test_an_unrouted_architecture_is_named(kind: str | None) -> None:
    reason = unrouted_reason({"model_type": kind} if kind else {})
    assert reason is not None and repr(kind or "not given") in reason
    assert all(routed in reason for routed in ROUTED_MODEL_TYPES)


@pytest.mark.parametrize("kind", ROUTED_MODEL_TYPES)
def test_routed_architectures_pass(kind: str) -> None:
    assert unrouted_reason({"model_type": kind}) is None
