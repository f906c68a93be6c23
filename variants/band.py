"""Band (sliding-window) attention: exact softmax over the keys within `window` positions of each query.

Convention: `window` w is one-sided. Bidirectional: query i sees keys j with |i - j| <= w (2w + 1 keys,
Longformer's "window 2w+1"). Causal: 0 <= i - j <= w (w + 1 keys; xformers' causal window W is our w).
FlexAttention examples that speak of a window of W mean W + 1 keys, i.e. our w = W.

Block-wise: queries in blocks of `block_size`; each block attends to the contiguous window of keys it can
reach (a strided view, no copy) under a small (block, window) pattern, through PyTorch's fused SDPA kernel.
O(N * (block + 2w) * D) time, O(N * (block + 2w)) memory for the pattern; never N x N.

b - batch, h - heads, n - sequence, i - query in block, j - key in window, d - head dim, e - value dim
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from attnbench.interface import (
    AttentionVariant,
    Capabilities,
    Cost,
    Hyperparameter,
    Shape,
    kept_between_calls,
    softmax_attention_flops,
)
from attnbench.variants.blocks import Pattern, key_validity_windows, key_windows, query_blocks, window_positions
from attnbench.variants.flex import BACKEND, FLEX_BACKEND, FlexBackend, flex_attention_call
from einops import rearrange
from torch import Tensor


@kept_between_calls(maxsize=64)
def band_pattern(n: int, block: int, window: int, causal: bool, device: torch.device) -> Pattern:
    """(1, blocks, block, span): which windowed keys each query of each block sees (cached, reused every call)."""
    after = 0 if causal else window
    queries, keys = window_positions(n, block, window, window + block + after, device)
    offset = queries - keys  # i - j
    allowed = (offset <= window) & (offset >= (0 if causal else -window)) & (keys >= 0) & (keys < n)
    return Pattern(allowed[None])


def default_block_size(window: int) -> int:
    """Small blocks waste little of the window; too small and the kernel's per-block cost dominates."""
    return min(32, max(16, window))


def band_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    causal: bool,
    key_padding_mask: Tensor | None,
    block_size: int | None = None,
) -> Tensor:
    """Exact sliding-window attention, q, k (b, h, n, d), v (b, h, n, e) -> (b, h, n, e)."""
    b, h, n, _ = q.shape
    window = min(window, n - 1)  # a window wider than the sequence is the whole sequence
    block = block_size or default_block_size(window)
    after = 0 if causal else window
    valid_keys = key_validity_windows(key_padding_mask, n, block, window, after)  # (b, blocks, 1, span)
    pattern = band_pattern(n, block, window, causal, q.device).restricted_to(valid_keys, h)
    out = F.scaled_dot_product_attention(
        query_blocks(q, block),
        key_windows(k, block, window, after),
        key_windows(v, block, window, after),
        attn_mask=pattern.bias(q.dtype),
    )
    if valid_keys is not None:  # without padding only padding queries past n can see nothing; they are cropped
        out = out.masked_fill(~pattern.has_key[..., None], 0.0)
    return rearrange(out, "(b h) n i e -> b h (n i) e", b=b)[:, :, :n]


def band_support(n_q: int, n_k: int, window: int, causal: bool) -> Tensor:
    offset = torch.arange(n_q)[:, None] - torch.arange(n_k)[None, :]
    return (offset <= window) & (offset >= (0 if causal else -window))


class BandAttention(FlexBackend, AttentionVariant):
    """Sliding-window attention, computed block-wise at O(N * w) cost."""

    name = "band"
    family = "band"
    exact = True
    supports = Capabilities(
        cross_attention=False,
        subquadratic_memory=True,
        notes={"cross_attention": "a window is defined on the positions of one sequence; use Nq == Nk"},
    )
    hyperparameters = {
        "window": Hyperparameter(256, "one-sided window w: |i - j| <= w (causal: 0 <= i - j <= w)", minimum=0),
        "block_size": Hyperparameter(
            None, "queries per block (default: min(32, max(16, w)))", minimum=1, optional=True
        ),
        "backend": BACKEND,
    }

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        if self.backend == FLEX_BACKEND:
            window = self.window

            def band_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                offset = q_idx - kv_idx
                return (offset <= window) & (offset >= (0 if causal else -window))

            return flex_attention_call(q, k, v, band_mod, key=("band", window, causal))
        return band_attention(
            q, k, v, window=self.window, causal=causal, key_padding_mask=key_padding_mask, block_size=self.block_size
        )

    def support_mask(self, n_q: int, n_k: int, causal: bool) -> Tensor:
        return band_support(n_q, n_k, self.window, causal)

    def cost(self, shape: Shape) -> Cost:
        window = min(self.window, shape.n_k - 1)
        block = self.block_size or default_block_size(window)
        span = block + window + (0 if shape.causal else window)
        padded = -(-shape.n_q // block) * block  # the last block is computed whole
        computed = shape.batch * shape.heads * padded * span  # scores computed, masked ones included
        matmul, other = softmax_attention_flops(computed, shape)
        io = (
            shape.batch
            * shape.heads
            * (shape.n_q * shape.head_dim + shape.n_k * (shape.head_dim + 2 * shape.value_dim))
        )
        padded_keys = shape.batch * shape.heads * shape.n_k * (shape.head_dim + shape.value_dim) * shape.dtype_bytes
        # the bool pattern and the additive mask SDPA makes of it, and one padded copy of k and v
        working = shape.n_q * span * (1 + shape.dtype_bytes) + padded_keys
        return Cost(
            flops=matmul + other,
            bytes_moved=io * shape.dtype_bytes,
            working_bytes=working,
            matmul_flops=matmul,
            # autograd keeps each block's weights and its gathered key and value windows for the backward
            backward_working_bytes=working
            + computed * shape.dtype_bytes * (1 + (shape.head_dim + shape.value_dim) / block),
        )
