"""Exact softmax attention over query chunks: memory O(chunk * N) instead of O(N^2), same result.

Which keys a query sees comes from `attnbench.ops.allowed_keys`, the rule the reference and `check` use.

b - batch, h - heads, i - query, j - key, d - head dim, e - value dim
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from attnbench import AttentionVariant, Hyperparameter
from attnbench.ops import allowed_keys
from torch import Tensor


class ChunkedAttention(AttentionVariant):
    name = "chunked"
    family = "exact"
    exact = True
    hyperparameters = {"chunk": Hyperparameter(256, "queries per chunk", minimum=1)}

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        n_q, n_k = q.shape[-2], k.shape[-2]
        outputs = []
        for start in range(0, n_q, self.chunk):
            chunk = q[:, :, start : start + self.chunk]  # (b, h, i, d)
            allowed = allowed_keys(  # (b | 1, 1, i, j)
                chunk.shape[-2],
                n_k,
                causal=causal,
                key_padding_mask=key_padding_mask,
                device=q.device,
                query_offset=start,
            )
            sees = allowed.any(-1, keepdim=True)  # a query with no key outputs zeros
            out = F.scaled_dot_product_attention(chunk, k, v, attn_mask=allowed | ~sees)
            outputs.append(out.masked_fill(~sees, 0.0))
        return torch.cat(outputs, dim=2)

    def support_mask(self, n_q: int, n_k: int, causal: bool) -> Tensor:
        return allowed_keys(n_q, n_k, causal=causal, key_padding_mask=None)[0, 0]  # (i, j)
