"""Exact softmax attention: the baselines every other variant is measured against.

b - batch, h - heads, i - query position, j - key position, d - head dim, e - value dim
"""

from __future__ import annotations

import functools
from typing import Any
from dataclasses import replace

import torch
import torch.nn.functional as F
from attnbench.interface import (
    AttentionVariant,
    Capabilities,
    Cost,
    DecodeState,
    Hyperparameter,
    Shape,
    UnsupportedOptionError,
    dense_attention_cost,
    expand_kv_heads,
    query_group,
)
from attnbench.ops import KVCache, allowed_keys, dense_masked_attention, rows_with_visible_key
from einops import rearrange
from torch import Tensor


def _all_allowed(n_q: int, n_k: int, causal: bool) -> Tensor:
    return allowed_keys(n_q, n_k, causal=causal, key_padding_mask=None)[0, 0]


class FullAttention(AttentionVariant):
    """`F.scaled_dot_product_attention`: the fused exact kernel a user would pick. Decodes against a KV cache, or
    with `kv_cache=False` by recomputing the whole causal attention of the prefix every step (generation without a
    cache: the baseline of Katharopoulos et al. 2020's RNN claim and of StreamingLLM's re-computation)."""

    name = "full"
    family = "exact"
    exact = True
    supports = Capabilities(grouped_kv=True)
    hyperparameters = {
        "kv_cache": Hyperparameter(
            True, "decode against a KV cache; false: recompute the prefix's attention every step (decode only)",
            kind=bool,
        ),
    }  # fmt: skip

    def unsupported_reason(self, **options: Any) -> str | None:
        if not self.kv_cache and not options.get("decode"):
            return "full(kv_cache=false) differs from full only in decode (--mode decode)"
        return super().unsupported_reason(**options)

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """Exact causal attention over the prompt; the cache holds its keys and values, one per key/value head."""
        group = query_group(q, k)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=group > 1)
        if self.kv_cache:
            return out, KVCache.of(k, v, room)
        # no cache: the prefix itself is what is kept (its q and k side by side in the key buffer, one per query head)
        k, v = expand_kv_heads(k, group), expand_kv_heads(v, group)
        return out, KVCache.of(torch.cat([q, k], dim=-1), v, room)

    def prefill_state(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> DecodeState:
        return KVCache.of(k, v, room) if self.kv_cache else self.prefill(q, k, v, room=room)[1]

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        if not isinstance(state, KVCache):
            raise UnsupportedOptionError(f"full cannot step from a {type(state).__name__}")
        if self.kv_cache:
            return state.step(q, k, v), state
        group = q.shape[1] // k.shape[1]
        state.append(torch.cat([q, expand_kv_heads(k, group)], dim=-1), expand_kv_heads(v, group))
        prefix_q, prefix_k = state.k.split(q.shape[-1], dim=-1)
        return F.scaled_dot_product_attention(prefix_q, prefix_k, state.v, is_causal=True)[..., -1:, :], state

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        if key_padding_mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        # SDPA takes no is_causal together with a mask, so causal + padding needs the (i, j) pattern.
        allowed = allowed_keys(
            q.shape[-2], k.shape[-2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
        )
        visible = rows_with_visible_key(
            q.shape[0], q.shape[-2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
        )
        if visible is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        # Rows that see nothing attend everywhere (no NaN, in forward or backward), then are zeroed.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~visible)
        return out.masked_fill(~visible, 0.0)

    def support_mask(self, n_q: int, n_k: int, causal: bool) -> Tensor:
        return _all_allowed(n_q, n_k, causal)

    def cost(self, shape: Shape) -> Cost:
        # A causal fused kernel skips the masked scores; the CPU has none for value_dim != head_dim, and
        # PyTorch's math fallback computes every score before masking.
        every_score = shape.causal and shape.head_dim != shape.value_dim
        dense = dense_attention_cost(replace(shape, causal=False) if every_score else shape)
        if every_score:  # the math fallback holds the score matrix
            return dense
        # the fused kernel works in tiles: what it holds beyond its output is its private scratch
        output = shape.batch * shape.heads * shape.n_q * shape.value_dim * shape.dtype_bytes
        return replace(dense, working_bytes=output)


class FullMathAttention(AttentionVariant):
    """softmax(QK^T / sqrt(d)) V written out: materializes the N x N matrix (the quadratic-memory reference)."""

    name = "full-math"
    family = "exact"
    exact = True

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        if not causal and key_padding_mask is None:
            return dense_masked_attention(q, k, v)
        allowed = allowed_keys(
            q.shape[-2], k.shape[-2], causal=causal, key_padding_mask=key_padding_mask, device=q.device
        )
        return dense_masked_attention(q, k, v, allowed)

    def support_mask(self, n_q: int, n_k: int, causal: bool) -> Tensor:
        return _all_allowed(n_q, n_k, causal)

    def cost(self, shape: Shape) -> Cost:
        dense = dense_attention_cost(replace(shape, causal=False))  # every score, causal ones masked after
        scores = shape.batch * shape.heads * shape.n_q * shape.n_k * shape.dtype_bytes
        # scores and weights are each written once and read once; causal holds masked scores besides
        return Cost(
            flops=dense.flops,
            bytes_moved=dense.bytes_moved + 4 * scores,
            working_bytes=(3 if shape.causal else 2) * scores,
            matmul_flops=dense.matmul_flops,
        )


@functools.cache
def _xformers_unavailable() -> str | None:
    try:
        import xformers.ops  # noqa: F401
    except Exception as error:  # any import failure means: not usable here
        return (
            f"xformers is not importable ({type(error).__name__}: {error}); "
            "install the extra: pip install 'attnbench[xformers]'"
        )
    return None


class FullXformersAttention(AttentionVariant):
    """`xformers.ops.memory_efficient_attention`: the exact CUDA kernel. xformers has no CPU kernels."""

    name = "full-xformers"
    family = "exact"
    exact = True
    supports = Capabilities(
        key_padding_mask=False,
        devices=("cuda",),
        dtypes=("float32", "float16", "bfloat16"),
        subquadratic_memory=True,
        notes={
            "device": "xformers has no CPU kernels; it is the exact CUDA backend",
            "key_padding_mask": "a padding mask needs a dense (Nq, Nk) bias in xformers, defeating its purpose",
        },
    )

    def unsupported_reason(self, **options: object) -> str | None:
        return super().unsupported_reason(**options) or _xformers_unavailable()

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        import xformers.ops as xops

        bias = xops.LowerTriangularMask() if causal else None
        q, k, v = (rearrange(t, "b h n d -> b n h d") for t in (q, k, v))
        out = xops.memory_efficient_attention(q, k, v, attn_bias=bias)
        return rearrange(out, "b n h e -> b h n e")

    def support_mask(self, n_q: int, n_k: int, causal: bool) -> Tensor:
        return _all_allowed(n_q, n_k, causal)
