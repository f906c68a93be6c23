"""How much memory `attnbench model` holds at once for a sequence length, estimated before any forward pass, so a
length that would not fit is refused up front (the guard `attnbench run` applies to its cells, in the same
spirit and against the same limit, `attnbench.measure.group.memory_limit`).

What is held at the peak of a study at N tokens (float32, one sequence):
- what the process holds once the model is loaded: its resident memory (torch, the tokenizer) and the weights
  (counted whole: they are paged in from their file as the first forward pass reads them);
- the exact model's hidden state after each layer and its head input, kept for every variant's comparison,
  and the hidden states transformers returns from the forward pass in flight (one per layer and the embedding);
- attention outputs: those the routing keeps (every layer's for the exact model with single-layer swaps);
- one layer's working set: q, k, v, keys and values repeated for grouped-query heads, the MLP's three
  intermediate tensors, the residual and normalized copies; plus the widest attention variant's own working
  set (its `cost().working_bytes`);
- the vocabulary projection (`attnbench.model.head`): the loss's slice of logits and its log-softmax, or the
  comparison's float64 head inputs, or the head check's logits built whole by transformers over its few
  positions and their log-softmax, whichever is largest.
What comes on top of the loaded model is multiplied by SLACK for what the tally leaves out (the allocator's
fragmentation, small temporaries); measured on SmolLM2-135M it errs high, never low (README).

b - batch, n - tokens, e - hidden size, h - heads, d - head dim, f - MLP width
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from torch import nn

from attnbench.interface import AttentionVariant, Shape
from attnbench.model.head import SLICE_BYTES

FLOAT32 = 4
SLACK = 1.25  # what the tally misses: fragmentation, small temporaries
SLICE_COPIES = 2  # a slice of float32 logits and its log-softmax (the loss)
COMPARISON_COPIES = 4  # the logits' comparison: both head inputs in float64, each times the Gram matrix


def resident_bytes() -> int:
    """This process's resident memory now (Linux's /proc/self/statm; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a model the estimate needs, read from its config and its parameters."""

    loaded_bytes: int  # the process with the model loaded: its resident memory and the weights
    vocabulary: int
    layers: int
    hidden: int  # e
    heads: int  # h
    head_dim: int  # d
    mlp: int  # f

    @classmethod
    def of(cls, model: nn.Module) -> ModelShape:
        config = model.config
        hidden = config.hidden_size
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        mlp = getattr(config, "intermediate_size", None) or 4 * hidden
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        vocabulary = getattr(config, "vocab_size", None) or 0
        return cls(resident_bytes() + weights, vocabulary, config.num_hidden_layers, hidden, heads, head_dim, mlp)


def estimated_peak_bytes(
    shape: ModelShape,
    n: int,
    variants: list[AttentionVariant],
    *,
    causal: bool,
    single_layers: bool,
    head_check_tokens: int = 0,
) -> float:
    """The estimate of what a study at `n` tokens holds at once (module docstring), in bytes."""
    s = shape
    per_token = FLOAT32 * n
    hidden_states = (2 * s.layers + 2) * s.hidden * per_token  # the exact model's kept, the pass in flight's
    attention = s.heads * s.head_dim * per_token
    kept_attention = (s.layers + 1 if single_layers else 0) * attention
    layer = 7 * attention + 3 * s.mlp * per_token + 3 * s.hidden * per_token
    call = Shape(1, s.heads, n, n, s.head_dim, s.head_dim, causal=causal, dtype_bytes=FLOAT32)
    variant = max((v.cost(call).working_bytes for v in variants), default=0.0)
    comparison = COMPARISON_COPIES * 8 * n * (s.hidden + 1)
    head = max(SLICE_COPIES * SLICE_BYTES, comparison, 2 * FLOAT32 * min(n, head_check_tokens) * s.vocabulary)
    return s.loaded_bytes + SLACK * (hidden_states + kept_attention + layer + variant + head)
