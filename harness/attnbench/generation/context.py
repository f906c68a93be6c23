"""What a KV-cache method may read of the model around each self-attention layer (`attnbench.interface.PromptContext`):
the layer's index among the model's, the rotary embedding (ExpectedAttention un-rotates the prompt's queries and
averages the rotation over future positions), the layer's output projection (CriticalKV's ||W_o v||), how many of the
prompt's last tokens are the question (question-aware presses: Finch), and scores from a model-level pass of a
method's own (KVzip's "repeat the context", `attnbench.generation.repeat_pass`, run by the decoder for its rows).

Read from a Hugging Face decoder of the Llama family (SmolLM2; Qwen, Mistral, Gemma3 share the layout): its
decoder layers' `self_attn.o_proj` and the model's `rotary_emb`. A model without them gives None, and a method that
needs one says so when it builds its state.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import Tensor, nn

from attnbench.interface import PromptContext


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder's layers, in the order their self-attention is called."""
    inner = getattr(model, "model", model)
    return list(getattr(inner, "layers", []))


def rotary_of(model: nn.Module, layer: int = 0) -> Callable[[Tensor], tuple[Tensor, Tensor]] | None:
    """positions (n,) -> cos, sin (n, d) of the rotary embedding the model's `layer` uses (rotate-half convention),
    or None. A hybrid model's rotary embedding is one per layer type (Gemma 3: base 1e6 for its global layers, 1e4
    for its sliding ones), chosen by the config's `layer_types`."""
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    if rotary is None:
        return None
    probe = next(model.parameters())
    types = getattr(model.config, "layer_types", None)
    per_type = "layer_type" in inspect.signature(rotary.forward).parameters and bool(types)
    kind = {"layer_type": types[layer]} if per_type else {}

    def at(positions: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            cos, sin = rotary(probe.new_zeros(1), positions[None].to(probe.device), **kind)
        return cos[0], sin[0]

    return at


def layer_contexts(model: nn.Module, layers: int, question: int = 0,
                   pass_scores: list[Tensor] | None = None) -> list[PromptContext]:  # fmt: skip
    """One context per self-attention layer of the prompt just prefilled (`layers` of them)."""
    found = decoder_layers(model)
    contexts = []
    for layer in range(layers):
        rotary = rotary_of(model, layer)
        attention = getattr(found[layer], "self_attn", None) if layer < len(found) else None
        out_proj = getattr(getattr(attention, "o_proj", None), "weight", None)
        scores = pass_scores[layer] if pass_scores is not None else None
        contexts.append(PromptContext(layer, layers, rotary, out_proj, question, scores))
    return contexts
