"""Block top-k with the selection shared by a block of queries: `topk(select_for="block")`.

MoBA (the default, `select_for="query"`) lets every query rank the key blocks; here each query block ranks them
once, by the mean of its queries, and all its queries read the blocks it chose, as XAttention (Xu et al., 2025,
antidiagonal block scores), SeerAttention (Gao et al., 2024, pooled queries and keys through a learned gate) and
NSA's compressed branch (Yuan et al., 2025, §3.3.2: the selection shared by a GQA group's queries) do. Scores and
kept blocks are the per-query method's: `score` (MoBA's mean key or Quest's bound) of the pooled query, the first
block and the own block kept besides the `top_k` (causal: the own block causally inside, only earlier blocks
chosen; a block with no real key never chosen).

What it buys: a query block's keys are one set, so the chosen blocks are gathered once per query block and read
by one fused attention over (top_k + 2) blocks (no per-query (query, block) pairs to sort, chunk and merge); the
scores are (n / block)² instead of n² / block. What it costs: a query whose best block differs from its block's
mean query's misses it (the error, recall and real-heads figures in the README measure how much). Without an
N x N tensor: SHARED_AT_ONCE query blocks at a time hold their gathered keys, values and pattern.

b - batch, h - heads, x - (b h), c - query block, l - block read (slot), i - query in block, j - key in block,
d - head dim, e - value dim
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from attnbench.ops import causal_allows
from attnbench.variants.block_scores import block_summaries, score_blocks
from attnbench.variants.blocks import Pattern, pattern_attention, query_blocks, real_key_blocks
from einops import rearrange
from torch import Tensor

SHARED_AT_ONCE = 4  # query blocks attended at once: their gathered keys stay near the core
# (16K causal, one call: 4 took 249 ms, 16 took 284, 32 took 439)


def shared_selection(
    q: Tensor,
    k: Tensor,
    *,
    size: int,
    top_k: int,
    score: str,
    causal: bool,
    key_padding_mask: Tensor | None,
    keep_first: bool,
) -> tuple[Tensor, Tensor]:
    """The key blocks each query block reads: ids (b, h, c, l) and whether slot l holds one (b, h, c, l). The
    `top_k` scored choices of the block's mean query first (causal: earlier blocks only; never its own, nor a
    block with no real key), then the kept first block (with `keep_first`; empty in the first query block), the own
    block last."""
    b, h, n, _ = q.shape
    real = real_key_blocks(b, k.shape[-2], size, key_padding_mask, q.device)  # (b, c, j)
    blocks = real.shape[1]
    work = torch.promote_types(q.dtype, torch.float32)  # ranked in float32 at least, as the per-query selection
    rows = torch.full((blocks,), float(size), dtype=work, device=q.device)
    rows[-1] = n - (blocks - 1) * size  # the last query block's real rows
    pooled = rearrange(query_blocks(q.to(work), size).sum(dim=2) / rows[:, None], "(b h) c d -> b h c d", b=b)
    scores = score_blocks(pooled, block_summaries(k.to(work), real, size, score))  # (b, h, c, c)
    scores.nan_to_num_(nan=float("inf"))  # a NaN key: its block is chosen, so the NaN shows
    own = torch.arange(blocks, device=q.device)
    later = own[None, :] >= own[:, None] if causal else own[None, :] == own[:, None]  # (c, c): not chosen
    scores.masked_fill_(later | ~real.any(dim=-1)[:, None, None, :], float("-inf"))
    keep_first = keep_first and blocks > 1
    if keep_first:
        scores[..., 0] = float("-inf")  # kept, so not among the scored
    slots = min(top_k, blocks - 1)
    values, ids = scores.topk(slots, dim=-1) if slots else (scores[..., :0], scores[..., :0].long())
    parts, used = [ids], [values > float("-inf")]
    if keep_first:
        first_real = real[:, 0].any(dim=-1)[:, None, None, None]  # (b, 1, 1, 1)
        parts.append(own.new_zeros(b, h, blocks, 1))
        used.append(((own >= 1)[None, None, :, None] & first_real).expand(b, h, blocks, 1))
    parts.append(own[None, None, :, None].expand(b, h, blocks, 1))
    used.append(torch.ones(b, h, blocks, 1, dtype=torch.bool, device=q.device))
    return torch.cat(parts, dim=-1), torch.cat(used, dim=-1)


def shared_attention(
    q: Tensor, k: Tensor, v: Tensor, ids: Tensor, used: Tensor, real: Tensor, *, causal: bool
) -> Tensor:
    """Each query block against the key blocks it reads (`shared_selection`), by one softmax: q (b, h, n, d),
    k, v (b, h, n, d|e), real (b, c, j) the real keys -> (b, h, n, e). The blocks are gathered SHARED_AT_ONCE query
    blocks at a time (one index_select each for keys and values); a query with no key gets zeros."""
    b, h, n, _ = q.shape
    size, blocks, slots = real.shape[-1], real.shape[1], ids.shape[-1]
    queries = query_blocks(q, size)  # (x, c, i, d)
    keys, values = (rearrange(query_blocks(x, size), "x c j d -> (x c) (j d)") for x in (k, v))  # a row per block
    first_row = torch.arange(b * h, device=q.device)[:, None, None] * blocks  # (x, 1, 1): each head's first block
    rows = rearrange(ids, "b h c l -> (b h) c l") + first_row  # (x, c, l)
    batch = torch.arange(b, device=q.device)[:, None, None, None]
    readable = (real[batch, ids] & used[..., None])[:, :, :, None]  # (b, h, c, 1, l, j)
    inside = torch.ones(size, size, dtype=torch.bool, device=q.device)
    if causal:  # the own block (the last slot) causally inside
        position = torch.arange(size, device=q.device)
        inside = causal_allows(position[:, None], position[None, :])
    # where every slot of every query block at once holds real keys (all but the first few blocks, causal), one
    # broadcast bias serves them all: no (query, key) pattern is built
    every = torch.ones(size, slots, size, dtype=torch.bool, device=q.device)
    every[:, -1] &= inside
    shared_bias = Pattern(rearrange(every, "i l j -> 1 1 i (l j)")).bias(q.dtype)
    outs = []
    for start in range(0, blocks, SHARED_AT_ONCE):
        stop = min(blocks, start + SHARED_AT_ONCE)
        picked = rows[:, start:stop].flatten()
        block_keys, block_values = (
            rearrange(x.index_select(0, picked), "(x c l) (j d) -> x c (l j) d", x=b * h, l=slots, j=size)
            for x in (keys, values)
        )  # (x, c', l j, d|e)
        if bool(readable[:, :, start:stop].all()):
            outs.append(F.scaled_dot_product_attention(queries[:, start:stop], block_keys, block_values,
                                                       attn_mask=shared_bias))  # fmt: skip
            continue
        allowed = readable[:, :, start:stop].expand(-1, -1, -1, size, -1, -1).clone()  # (b, h, c', i, l, j)
        allowed[..., -1, :] &= inside
        pattern = Pattern(rearrange(allowed, "b h c i l j -> (b h) c i (l j)"))
        outs.append(pattern_attention(queries[:, start:stop], block_keys, block_values, pattern))
    out = torch.cat(outs, dim=1)  # (x, c, i, e)
    return rearrange(out, "(b h) c i e -> b h (c i) e", b=b)[:, :, :n]
