"""attnbench variants as an attention implementation of Hugging Face transformers (its attention interface).

One implementation, "attnbench", is registered with transformers' `AttentionInterface` and its mask
function with `AttentionMaskInterface`. Each call routes the module's attention to the variant chosen for
that module in a `Routing` (exact `full` where none is chosen), and records its output, so a study can swap
every layer, or one layer at a time, and compare attention outputs layer by layer. The mask function hands
the attention the 2-D padding mask unchanged: causality comes from the module (`is_causal`), padding
becomes the variant's key padding mask. Cross-attention (queries and keys of different sequences) always
runs exact: the variants here are about self-attention.

b - batch, h - heads, n - query positions, m - key positions, d - head dim
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from einops import rearrange, repeat
from torch import Tensor, nn

from attnbench.interface import AttentionVariant
from attnbench.registry import registry

IMPLEMENTATION = "attnbench"


@dataclass
class Routing:
    """Which variant each attention module runs (by call order within a forward pass), and what it output."""

    everywhere: AttentionVariant | None = None  # every self-attention layer
    only_layer: int | None = None  # with `everywhere`: swap this layer alone, the others exact
    exact: AttentionVariant = field(default_factory=lambda: registry.create("full"))
    outputs: list[Tensor] = field(default_factory=list)  # attention output (b, n, h, d) of each self-attention call

    def variant_for(self, layer: int) -> AttentionVariant:
        if self.everywhere is None or (self.only_layer is not None and layer != self.only_layer):
            return self.exact
        return self.everywhere


ACTIVE = Routing()  # the routing the registered implementation reads; a study sets it around each forward


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
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != heads:  # grouped-query attention: each key/value head serves heads / kv_heads query heads
        key = repeat(key, "b g m d -> b (g r) m d", r=heads // kv_heads)
        value = repeat(value, "b g m d -> b (g r) m d", r=heads // kv_heads)
    if scaling is not None and not math.isclose(scaling, query.shape[-1] ** -0.5):
        query = query * (scaling * query.shape[-1] ** 0.5)  # the variants scale by 1/sqrt(d)
    cross = query.shape[2] != key.shape[2] or getattr(module, "is_cross_attention", False)
    causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", False))) and not cross
    padding = None
    if attention_mask is not None and attention_mask.dim() == 2:
        padding = ~attention_mask.bool()
    elif attention_mask is not None:
        raise ValueError("the attnbench attention implementation expects its own 2-D padding mask")
    routing = ACTIVE
    variant = routing.exact if cross else routing.variant_for(len(routing.outputs))
    output = variant(query, key, value, causal=causal, key_padding_mask=padding)  # (b, h, n, d)
    output = rearrange(output, "b h n d -> b n h d").contiguous()
    if not cross:
        routing.outputs.append(output.detach())
    return output, None


def register() -> None:
    """Make "attnbench" an attention implementation of transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, attnbench_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, padding_passthrough_mask)
