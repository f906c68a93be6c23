"""Exact softmax attention over query chunks: memory O(chunk * N) instead of O(N^2), same result.

b - batch, h - heads, i - query, j - key, d - head dim, e - value dim
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from attnbench import AttentionVariant, Hyperparameter
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
            rows = torch.arange(start, min(n_q, start + self.chunk), device=q.device)[:, None]  # (i, 1)
            allowed = torch.ones(rows.shape[0], n_k, dtype=torch.bool, device=q.device)[None, None]  # (1, 1, i, j)
            if causal:
                allowed = allowed & (torch.arange(n_k, device=q.device)[None, :] <= rows)
            if key_padding_mask is not None:
                allowed = allowed & ~key_padding_mask[:, None, None, :]
            sees = allowed.any(-1, keepdim=True)  # a query with no key outputs zeros
            out = F.scaled_dot_product_attention(q[:, :, start : start + self.chunk], k, v, attn_mask=allowed | ~sees)
            outputs.append(out.masked_fill(~sees, 0.0))
        return torch.cat(outputs, dim=2)

    def support_mask(self, n_q: int, n_k: int, causal: bool) -> Tensor:
        everything = torch.ones(n_q, n_k, dtype=torch.bool)
        return everything.tril() if causal else everything
