"""Attention through feature maps: out_i = sum_j (phi(q_i) . phi(k_j)) v_j / sum_j phi(q_i) . phi(k_j).

The shared core of `linear` (elu + 1) and `performer` (FAVOR+). Non-causal: two small products,
O(N * M * E). Causal: chunked — exact masked attention inside each chunk plus a state (M x E) carried
from earlier chunks — never a cumulative sum of N outer products. Everything accumulates in float32
(float64 for float64 inputs). Only an exactly-zero denominator is guarded (a query that sees no key, or
whose every feature product underflowed): it outputs zeros. Tiny positive denominators are legitimate
(stabilized features at large |q| |k|) and are divided as they are.

`key_log_scale` g (non-decreasing along n, per position) supports numerically stabilized features:
key j's true feature is phi(k_j) * exp(g_j). Query i then works relative to exp(g_i), so no quantity is
ever scaled by a key later than the query (a stabilizer taken over the whole sequence would leak the
future through underflow).

b - batch, h - heads, n - position, c - chunk, i - query in chunk, j - key in chunk, m - feature, e - value dim
"""

from __future__ import annotations

import torch
from attnbench.ops import causal_allows
from attnbench.variants.blocks import pad_sequence
from einops import einsum, rearrange
from torch import Tensor


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def with_ones(v: Tensor, dtype: torch.dtype) -> Tensor:
    """(..., e) -> (..., e + 1): the last column carries the normalizer through the same products."""
    return torch.cat([v.to(dtype), torch.ones(*v.shape[:-1], 1, dtype=dtype, device=v.device)], dim=-1)


def normalized(total: Tensor) -> Tensor:
    """(..., e + 1) numerators and denominator -> (..., e): their ratio, zeros where the denominator is 0.

    The zero rows get no gradient either (a floor such as clamp(min=eps) would give them 1/eps).
    """
    numerator, denominator = total[..., :-1], total[..., -1:]
    seen = denominator != 0  # positive features give >= 0; trigonometric ones may give < 0, divided as they are
    ratio = numerator / torch.where(seen, denominator, torch.ones_like(denominator))
    return torch.where(seen, ratio, 0.0)


def feature_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor) -> Tensor:
    """Non-causal: phi_q (b, h, n, m), phi_k (b, h, n', m) (padded keys already zero), v (b, h, n', e).

    The numerators phi(Q) (phi(K)^T V) and the denominators phi(Q) sum_j phi(k_j) as two products, so V is never
    copied beside a column of ones and the (n, e) output is touched once more, to scale it: on the CPU this path
    is bound by memory traffic, not by its matmuls."""
    state = einsum(phi_k, v.to(phi_k.dtype), "b h n m, b h n e -> b h m e")  # (b, h, m, e)
    key_sum = phi_k.sum(dim=-2)  # (b, h, m)
    numerator = einsum(phi_q, state, "b h n m, b h m e -> b h n e")
    denominator = einsum(phi_q, key_sum, "b h n m, b h m -> b h n")
    return (numerator * reciprocal_or_zero(denominator)[..., None]).to(v.dtype)


def key_state(phi_k: Tensor, v: Tensor) -> Tensor:
    """sum_j phi(k_j) [v_j 1]: phi_k (b, h, n, m), v (b, h, n, e) -> (b, h, m, e + 1), the state an RNN form carries
    (the normalizer in the last column)."""
    return einsum(phi_k, with_ones(v, phi_k.dtype), "b h n m, b h n e -> b h m e")


def reciprocal_or_zero(denominator: Tensor) -> Tensor:
    """1 / denominator, 0 where it is exactly 0 (a query that sees no key outputs zeros, and gets no gradient)."""
    seen = denominator != 0
    return torch.where(seen, 1 / torch.where(seen, denominator, torch.ones_like(denominator)), 0.0)


def exclusive_cumsum(x: Tensor, dim: int) -> Tensor:
    """Sum over the strictly earlier entries along `dim`, as a shifted cumulative sum.

    Not cumsum(x) - x: that cancels (a large running sum minus a term), so an entry with nothing before it
    is not exactly 0, and its rounding depends on later terms.
    """
    shifted = x.narrow(dim, 0, x.shape[dim] - 1).cumsum(dim=dim)
    return torch.cat([torch.zeros_like(x.narrow(dim, 0, 1)), shifted], dim=dim)


def causal_feature_attention(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, *, chunk: int, key_log_scale: Tensor | None = None
) -> Tensor:
    """Causal, chunked. phi_q, phi_k (b, h, n, m) (>= 0 but for trigonometric ones); v (b, h, n, e); key_log_scale g
    (b, h, n) or None."""
    b, h, n, _ = phi_q.shape
    pad = -n % chunk
    as_chunks = lambda t: rearrange(pad_sequence(t, 0, pad), "b h (c i) z -> b h c i z", i=chunk)  # noqa: E731
    q_c, k_c = as_chunks(phi_q), as_chunks(phi_k)
    v_c = as_chunks(with_ones(v, phi_k.dtype))  # (b, h, c, j, e + 1)

    positions = torch.arange(chunk, device=v.device)
    causal = causal_allows(positions[:, None], positions[None, :])  # (i, j) within a chunk
    scores = einsum(q_c, k_c, "b h c i m, b h c j m -> b h c i j")
    if key_log_scale is None:
        scores = scores.masked_fill(~causal, 0.0)
        chunk_sums = einsum(k_c, v_c, "b h c j m, b h c j e -> b h c m e")
        state = exclusive_cumsum(chunk_sums, dim=2)  # sum over earlier chunks: (b, h, c, m, e+1)
        from_state = einsum(q_c, state, "b h c i m, b h c m e -> b h c i e")
    else:
        g = rearrange(pad_sequence(key_log_scale[..., None], 0, pad), "b h (c i) 1 -> b h c i", i=chunk)
        if pad:  # padding positions repeat the last real scale so g stays non-decreasing
            g = torch.where(
                torch.arange(g.shape[2] * chunk, device=v.device).view(-1, chunk) < n, g, key_log_scale[..., -1:, None]
            )
        decay = (g[..., None, :] - g[..., :, None]).masked_fill(~causal, float("-inf"))  # g_j - g_i, j <= i
        scores = scores * decay.exp()
        chunk_end = g[..., -1]  # (b, h, c)
        chunk_sums = einsum(k_c * (g - chunk_end[..., None]).exp()[..., None], v_c, "b h c j m, b h c j e -> b h c m e")
        states, carried = [], torch.zeros_like(chunk_sums[:, :, 0])
        for index in range(chunk_sums.shape[2]):  # state before chunk c, relative to exp(g at end of c - 1)
            states.append(carried)
            previous_end = chunk_end[:, :, index - 1] if index else chunk_end[:, :, 0]
            carried = carried * (previous_end - chunk_end[:, :, index]).exp()[..., None, None] + chunk_sums[:, :, index]
        state = torch.stack(states, dim=2)
        previous_end = torch.cat([chunk_end[:, :, :1], chunk_end[:, :, :-1]], dim=2)  # (b, h, c)
        from_state = einsum(q_c, state, "b h c i m, b h c m e -> b h c i e")
        from_state = from_state * (previous_end[..., None] - g).exp()[..., None]
    total = from_state + einsum(scores, v_c, "b h c i j, b h c j e -> b h c i e")
    return rearrange(normalized(total), "b h c i e -> b h (c i) e")[:, :, :n].to(v.dtype)
