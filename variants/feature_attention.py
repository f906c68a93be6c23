"""Attention through feature maps: out_i = sum_j (phi(q_i) . phi(k_j)) v_j / sum_j phi(q_i) . phi(k_j).

The shared core of `linear` (elu + 1) and `performer` (FAVOR+). Non-causal: two small products,
O(N * M * E). Causal: chunked — exact masked attention inside each chunk plus a state (M x E) carried
from earlier chunks (their prefix sum, `decayed_exclusive_prefix` under a stabilizer) — never a cumulative sum
of N outer products. Everything accumulates in float32
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


GROUP = 8  # chunks per group of the decayed prefix sum: a matmul inside the groups, then one across them


def decayed_exclusive_prefix(sums: Tensor, levels: Tensor) -> Tensor:
    """state_t = sum over u < t of sums[u] exp(levels[u + 1] - levels[t]): sums (b, h, c, m, e), each relative to
    exp(levels[u + 1]); levels (b, h, c + 1) non-decreasing, so every weight is <= 1 (no overflow at any range).
    Returns every state_t (b, h, c, m, e), relative to exp(levels[t]).

    In two levels of matmuls by lower-triangular matrices of decays: inside groups of GROUP chunks (every group at
    once), then across the groups' totals, added to each chunk. A dozen kernel calls at any N, where a step per
    chunk takes one per chunk (and as many waits for a busy thread)."""
    b, h, c, m, e = sums.shape
    groups = -(-c // GROUP)
    extra = groups * GROUP - c  # zero sums past the end, their levels the last one's (a decay of 1)
    flat = pad_sequence(sums.reshape(b, h, c, m * e), 0, extra).view(b, h, groups, GROUP, m * e)
    levels = torch.cat([levels, levels[..., -1:].expand(b, h, extra)], dim=-1)
    start = levels[..., :-1].view(b, h, groups, GROUP)  # state t's level
    stop = levels[..., 1:].view(b, h, groups, GROUP)  # sums[u]'s level
    earlier = torch.ones(GROUP, GROUP, dtype=torch.bool, device=sums.device).tril(-1)  # (t, u): u < t
    inside = (stop[..., None, :] - start[..., :, None]).masked_fill(~earlier, float("-inf")).exp()  # (.., t, u)
    states = torch.matmul(inside, flat)  # (b, h, groups, t, m e): from the group's own earlier chunks
    edges = levels[..., ::GROUP]  # (b, h, groups + 1): each group's first level, then the last level
    totals = torch.matmul((stop - edges[..., 1:, None]).exp()[..., None, :], flat)[..., 0, :]  # relative to its end
    earlier = torch.ones(groups, groups, dtype=torch.bool, device=sums.device).tril(-1)
    across = (edges[..., None, 1:] - edges[..., :-1, None]).masked_fill(~earlier, float("-inf")).exp()
    before = torch.matmul(across, totals)  # (b, h, groups, m e): the state before each group, at its first level
    states.addcmul_(before[:, :, :, None], (edges[..., :-1, None] - start).exp()[..., None])  # in place: one pass
    return states.view(b, h, groups * GROUP, m, e)[:, :, :c]


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
        chunk_end = g[..., -1]  # (b, h, c): each chunk's sum is taken relative to exp(g at its end)
        # weighting the values (e + 1 wide) rather than the features (m wide): the same sums, fewer products
        weighted = v_c * (g - chunk_end[..., None]).exp()[..., None]
        chunk_sums = einsum(k_c, weighted, "b h c j m, b h c j e -> b h c m e")
        # the state before chunk c is relative to exp(g at the end of chunk c - 1) (chunk 0's: its first position)
        levels = torch.cat([g[..., :1, 0], chunk_end], dim=-1)  # (b, h, c + 1)
        state = decayed_exclusive_prefix(chunk_sums, levels)
        from_state = einsum(q_c, state, "b h c i m, b h c m e -> b h c i e")
        from_state = from_state * (levels[..., :-1, None] - g).exp()[..., None]
    total = from_state + einsum(scores, v_c, "b h c i j, b h c j e -> b h c i e")
    return rearrange(normalized(total), "b h c i e -> b h (c i) e")[:, :, :n].to(v.dtype)
