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

b - batch, h - heads, n - query positions, m - key positions, d - head dim
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from einops import rearrange
from torch import Tensor, nn

from attnbench.interface import AttentionVariant, expand_kv_heads, query_group
from attnbench.registry import registry

IMPLEMENTATION = "attnbench"


class Router(Protocol):
    """What the registered implementation hands each attention call to: a study's `Routing`, or the in-model
    generation's per-layer states (`attnbench.generation.layers`)."""

    def attend(self, query: Tensor, key: Tensor, value: Tensor, *, causal: bool, padding: Tensor | None,
               cross: bool) -> Tensor:
        """query (b, h, n, d), key/value (b, g, m, d) (g divides h) -> the attention output (b, h, n, d)."""
        ...


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

    def attend(self, query: Tensor, key: Tensor, value: Tensor, *, causal: bool, padding: Tensor | None,
               cross: bool) -> Tensor:
        """The variant of this call's layer (exact for cross-attention), key/value heads repeated for grouped-query
        attention (a full-sequence call takes as many as query heads); a self-attention output is recorded."""
        group = query_group(query, key)
        key, value = expand_kv_heads(key, group), expand_kv_heads(value, group)
        variant = self.exact if cross else self.variant_for(len(self.outputs))
        output = variant(query, key, value, causal=causal, key_padding_mask=padding)  # (b, h, n, d)
        if not cross:
            self.outputs.append(rearrange(output, "b h n d -> b n h d").detach())
        return output


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
    output = ACTIVE.attend(query, key, value, causal=causal, padding=padding, cross=cross)  # (b, h, n, d)
    return rearrange(output, "b h n d -> b n h d").contiguous(), None


def register() -> None:
    """Make "attnbench" an attention implementation of transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, attnbench_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, padding_passthrough_mask)
