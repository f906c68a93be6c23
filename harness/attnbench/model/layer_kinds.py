"""Which layers of a causal decoder attend globally and which through a sliding window, and which architectures
attnbench routes its methods through, read from the model's config alone (no weights, no torch).

One rule, transformers' own, for every place that needs it (the in-model routing, generation's preflight and memory
estimate, `attnbench heads`): a layer is a sliding-window layer when its config's `layer_types` entry is
"sliding_attention" and the config's effective `sliding_window` is set; Mistral (no `layer_types`) slides in every
layer when it has a `sliding_window`; Qwen2/Qwen3 slide only with `use_sliding_window`, from `max_window_layers` on;
Gemma 3 writes `layer_types` (older configs: every `sliding_window_pattern`-th layer global); Llama never slides.
The window is transformers' count: a query sees the last `sliding_window` keys, its own included
(`kv > q - sliding_window`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# the decoders whose attention goes through transformers' attention interface with q/k/v and a sliding window
# attnbench reads (`attnbench.model.attention`); gemma3 is the multimodal wrapper, read through its text config
ROUTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gemma3")
SLIDING = "sliding_attention"
GEMMA3_WINDOW, GEMMA3_PATTERN = 4096, 6  # transformers' Gemma3TextConfig defaults, for a config that omits them


def settings(config: Any) -> dict[str, Any]:
    """The config as a dict (config.json read as JSON, or a transformers config), the text model's for a
    multimodal wrapper (Gemma 3's `text_config`)."""
    values = dict(config) if isinstance(config, dict) else config.to_dict()
    text = values.get("text_config")
    return {**text, "model_type": text.get("model_type", "gemma3_text")} if isinstance(text, dict) else values


def layer_windows(config: Any) -> list[int | None]:
    """Per layer, its sliding window (keys a query sees, its own included) or None for a global layer."""
    values = settings(config)
    kind, layers = values.get("model_type"), int(values.get("num_hidden_layers") or 0)
    window = values.get("sliding_window")
    if kind == "mistral":  # no layer types: every layer slides when the window is set
        return [window] * layers
    if kind in ("qwen2", "qwen3"):
        window = window if values.get("use_sliding_window") else None
        first = values.get("max_window_layers", 28)
        default = [SLIDING if window is not None and i >= first else "full_attention" for i in range(layers)]
    elif kind == "gemma3_text":
        window = window if "sliding_window" in values else GEMMA3_WINDOW
        pattern = values.get("sliding_window_pattern") or values.get("_sliding_window_pattern") or GEMMA3_PATTERN
        default = [SLIDING if (i + 1) % pattern else "full_attention" for i in range(layers)]
    else:
        default = ["full_attention"] * layers
    types = values.get("layer_types") or default
    return [int(window) if kind_of == SLIDING and window is not None else None for kind_of in types]


def global_layers(config: Any) -> list[int]:
    """The layers whose attention is global (every layer of a model without sliding windows)."""
    return [i for i, window in enumerate(layer_windows(config)) if window is None]


def unrouted_reason(config: Any) -> str | None:
    """Why attnbench cannot put its methods inside this model's attention (None when it can): a model type outside
    ROUTED_MODEL_TYPES, named."""
    kind = (dict(config) if isinstance(config, dict) else config.to_dict()).get("model_type")
    if kind in ROUTED_MODEL_TYPES:
        return None
    return (f"its model type is {kind or 'not given'!r}: attnbench routes its methods through the attention of "
            f"{', '.join(ROUTED_MODEL_TYPES)} decoders only")  # fmt: skip


@dataclass(frozen=True)
class HybridLayout:
    """A model's mix of sliding-window and global layers, as the commands say it."""

    layers: int  # every self-attention layer
    sliding: int  # those that keep a window
    sizes: str  # their window sizes, "512" (or "512/1024")
    places: tuple[int, ...]  # the global layers' indices


def hybrid_layout(config: Any) -> HybridLayout | None:
    """The model's layout, None for a model without sliding-window layers."""
    windows = layer_windows(config)
    sliding = [w for w in windows if w is not None]
    if not sliding:
        return None
    sizes = "/".join(str(w) for w in sorted(set(sliding)))
    return HybridLayout(len(windows), len(sliding), sizes, tuple(global_layers(config)))


def layout_text(config: Any) -> str | None:
    """A hybrid model's layers as a generation run says them (None for a model without sliding windows): how many
    keep a window of how many positions, which are global, and where a method goes."""
    if (layout := hybrid_layout(config)) is None:
        return None
    places = ", ".join(map(str, layout.places))
    return (f"{layout.sliding} of its {layout.layers} layers attend through a sliding window of {layout.sizes} "
            f"positions, kept as the model's own cache in every row (never a method's, never counted as compressed); "
            f"a method goes into its {len(layout.places)} global layers ({places}), and into every layer only where "
            "its label says \"every layer\" (hybrid_layers = \"all\")")
