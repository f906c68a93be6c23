"""What a key block is ranked by, for block top-k selection (MoBA's mean key, Quest's elementwise max and min) and
a query's score of it: shared by the per-query selection, the block-shared one and Quest's decode.

b - batch, h - heads, i - query, c - key block, j - key in block, d - head dim
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor


def block_summaries(k: Tensor, real: Tensor, size: int, score: str) -> tuple[Tensor, ...]:
    """What each key block is scored from, (b, h, c, d) each: its mean real key ("mean"), or the per-dimension
    maximum and minimum over its real keys ("minmax"); a block with no real key gives zeros (it is masked after)."""
    n = k.shape[-2]
    if bool(real.flatten(1)[:, :n].all()):  # no key padding: reduced from views of k, never a copy of it
        return whole_block_summaries(k, size, score)
    keys = rearrange(F.pad(k, (0, 0, 0, real.shape[1] * size - n)), "b h (c j) d -> b h c j d", j=size)
    weight = real[:, None, :, :, None]  # (b, 1, c, j, 1)
    if score == "mean":
        counts = real.sum(dim=-1).clamp(min=1)[:, None, :, None]  # (b, 1, c, 1)
        return (keys.masked_fill(~weight, 0.0).sum(dim=3) / counts,)
    empty = ~real.any(dim=-1)[:, None, :, None]  # (b, 1, c, 1): no real key (a NaN or inf key stays: it shows)
    high = keys.masked_fill(~weight, float("-inf")).amax(dim=3).masked_fill(empty, 0.0)
    low = keys.masked_fill(~weight, float("inf")).amin(dim=3).masked_fill(empty, 0.0)
    return high, low


def whole_block_summaries(k: Tensor, size: int, score: str) -> tuple[Tensor, ...]:
    """`block_summaries` where every key is real: the whole blocks reduced from a view of k, a partial last block
    apart (b, h, c, d each)."""
    n = k.shape[-2]
    whole = n - n % size
    parts = [rearrange(k[..., :whole, :], "b h (c j) d -> b h c j d", j=size)]
    if whole < n:
        parts.append(k[..., None, whole:, :])  # (b, h, 1, j', d): the last block's keys
    reductions = (torch.mean,) if score == "mean" else (torch.amax, torch.amin)
    return tuple(torch.cat([reduce(part, dim=3) for part in parts], dim=2) for reduce in reductions)


def score_blocks(q: Tensor, summaries: tuple[Tensor, ...]) -> Tensor:
    """(b, h, i, c) block scores of queries q (b, h, i, d): q · mean, or Quest's Σ_d max(q_d hi_d, q_d lo_d)."""
    if len(summaries) == 1:
        return einsum(q, summaries[0], "b h i d, b h c d -> b h i c")
    high, low = summaries  # high >= low, so the larger product takes high where q_d > 0 and low where q_d < 0
    return einsum(q.clamp(min=0), high, "b h i d, b h c d -> b h i c") + einsum(
        q.clamp(max=0), low, "b h i d, b h c d -> b h i c"
    )
