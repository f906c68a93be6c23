"""attnbench variants as an attention implementation of Hugging Face transformers (its attention interface).

One implementation, "attnbench", is registered with transformers' `AttentionInterface` and its mask
function with `AttentionMaskInterface`. Each call routes the module's attention to the variant chosen for
that module in a `Routing` (exact `full` where none is chosen), and records its output, so a study can swap
every layer, or one layer at a time, and compare attention outputs layer by layer. The mask function hands
the attention the 2-D padding mask unchanged: causality comes from the module (`is_causal`), padding
becomes the variant's key padding mask. Cross-attention (queries and keys of different sequences) always
runs exact: the variants here are about self-attention. What a call is handed to is a `Router`: a study's
`Routing`, or the in-model generation's per-layer states (`attnbench.generation`), which keep key/value heads as
the model has them.

A hybrid model's sliding-window layers (Gemma 3: five of each six) reach the implementation with the model's
`sliding_window` (transformers' count of keys, the query's own included); the router is handed it as `window`, our
band's one-sided w (`band_window`), and keeps such a layer's window as the model does: a method goes into a global
layer, and into a sliding one only where it asks to (`attnbench.generation.layers`).

b - batch, h - heads, n - query positions, m - key positions, d - head dim
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from einops import rearrange
from torch import Tensor, nn

from attnbench.interface import AttentionVariant, expand_kv_heads, query_group
from attnbench.registry import registry

IMPLEMENTATION = "attnbench"


def band_window(sliding_window: int | None) -> int | None:
    """transformers' `sliding_window` (a query sees that many keys, its own included: `kv > q - sliding_window`) as
    the one-sided window w of `band` (0 <= q - kv <= w); None (a global layer) stays None."""
    return None if sliding_window is None else int(sliding_window) - 1


class Router(Protocol):
    """What the registered implementation hands each attention call to: a study's `Routing`, or the in-model
    generation's per-layer states (`attnbench.generation.layers`)."""

    def attend(self, query: Tensor, key: Tensor, value: Tensor, *, causal: bool, padding: Tensor | None,
               cross: bool, window: int | None = None) -> Tensor:
        """query (b, h, n, d), key/value (b, g, m, d) (g divides h) -> the attention output (b, h, n, d); `window`:
        the layer's own sliding window, one-sided (`band_window`), None for a global layer."""
        ...


@dataclass
class Routing:
    """Which variant each attention module runs (by call order within a forward pass), and what it output."""

    everywhere: AttentionVariant | None = None  # every global self-attention layer (a sliding one keeps its window)
    only_layer: int | None = None  # with `everywhere`: swap this layer alone, the others exact
    exact: AttentionVariant = field(default_factory=lambda: registry.create("full"))
    outputs: list[Tensor] = field(default_factory=list)  # attention output (b, n, h, d) of each self-attention call

    def variant_for(self, layer: int) -> AttentionVariant:
        if self.everywhere is None or (self.only_layer is not None and layer != self.only_layer):
            return self.exact
        return self.everywhere

    def attend(self, query: Tensor, key: Tensor, value: Tensor, *, causal: bool, padding: Tensor | None,
               cross: bool, window: int | None = None) -> Tensor:
        """The variant of this call's layer (exact for cross-attention; a sliding-window layer its own window,
        exact), key/value heads repeated for grouped-query attention (a full-sequence call takes as many as query
        heads); a self-attention output is recorded."""
        group = query_group(query, key)
        key, value = expand_kv_heads(key, group), expand_kv_heads(value, group)
        if window is not None and not cross:
            variant = model_window(window)
        else:
            variant = self.exact if cross else self.variant_for(len(self.outputs))
        output = variant(query, key, value, causal=causal, key_padding_mask=padding)  # (b, h, n, d)
        if not cross:
            self.outputs.append(rearrange(output, "b h n d -> b n h d").detach())
        return output


@functools.lru_cache(maxsize=None)
def model_window(window: int) -> AttentionVariant:
    """A sliding-window layer's own attention: exact softmax over the last `window` keys and the query's own
    (`band`, block-wise, never n x n; its decode form keeps those window + 1 positions, evicting as it steps)."""
    return registry.create("band", window=window)


ACTIVE: Router = Routing()  # what the registered implementation calls; a study or a generation sets it


def padding_passthrough_mask(
    batch_size: int, q_length: int, kv_length: int, attention_mask: Tensor | None = None, **kwargs: Any
) -> Tensor | None:
    """The mask function of the implementation: the 2-D padding mask (b, m), True = a real token, or None."""
    if attention_mask is None or attention_mask.dim() != 2:
        return None
    keep = attention_mask.bool()[:, -kv_length:]
    return None if bool(keep.all()) else keep


def attnbench_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """query (b, h, n, d), key/value (b, h_kv, m, d) -> ((b, n, h, d), None), as transformers expects."""
    if scaling is not None and not math.isclose(scaling, query.shape[-1] ** -0.5):
        query = query * (scaling * query.shape[-1] ** 0.5)  # the variants scale by 1/sqrt(d)
    cross = query.shape[2] != key.shape[2] or getattr(module, "is_cross_attention", False)
    causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", False))) and not cross
    padding = None
    if attention_mask is not None and attention_mask.dim() == 2:
        padding = ~attention_mask.bool()
    elif attention_mask is not None:
        raise ValueError("the attnbench attention implementation expects its own 2-D padding mask")
    window = band_window(kwargs.get("sliding_window")) if causal else None
    output = ACTIVE.attend(query, key, value, causal=causal, padding=padding, cross=cross, window=window)  # (b, h, n, d)
    return rearrange(output, "b h n d -> b n h d").contiguous(), None


def register() -> None:
    """Make "attnbench" an attention implementation of transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, attnbench_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, padding_passthrough_mask)
