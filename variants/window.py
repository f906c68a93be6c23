"""The sliding window, computed block-wise: band attention's kernel, shared by the `band` variant (alone or with
sinks and global tokens) and by strided attention's local run.

The rule is `attnbench.ops.band_allows` (|i - j| <= w; causal adds j <= i): the block pattern, `support_mask` and the
flex backend's mask_mod are all evaluated from it. Queries in blocks of `block_size`; each block attends to the
contiguous window of keys it can reach (a strided view, no copy) under a small (block, window) pattern, through
PyTorch's fused SDPA kernel; `band_partial` also returns the log-sum-exp, for merging with other parts.
O(N * (block + 2w) * D) time, O(N * (block + 2w)) memory for the pattern; never N x N.

b - batch, h - heads, n - sequence, i - query in block, j - key in window, d - head dim, e - value dim
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from attnbench.interface import (
    kept_between_calls,
)
from attnbench.ops import band_allows
from attnbench.variants.blocks import (
    Partial,
    Pattern,
    key_validity_windows,
    key_windows,
    partial_attention,
    pattern_attention,
    query_blocks,
    window_positions,
    with_causal,
)
from einops import rearrange
from torch import Tensor


def band_mask(i: Tensor, j: Tensor, window: int, causal: bool) -> Tensor:
    """The band's whole support at (i, j): the band rule, and j <= i when causal (0 <= i - j <= w)."""
    return with_causal(band_allows(i, j, window), i, j, causal)


def default_block_size(window: int) -> int:
    """Small blocks waste little of the window; too small and the kernel's per-block cost dominates."""
    return min(32, max(16, window))


@dataclass(frozen=True)
class BandLayout:
    """How band attention cuts a sequence: queries in blocks, each against its window of keys (a strided view)."""

    window: int  # clipped to the sequence: a window wider than it is the whole sequence
    block: int  # queries per block
    after: int  # keys past the block's last query in its window: w, or 0 when causal

    @property
    def span(self) -> int:
        """Keys in each block's window: w before, the block, `after` past it."""
        return self.window + self.block + self.after

    def scores(self, n_q: int) -> int:
        """Scores computed per (batch, head), masked ones included: every block whole (the last one padded)."""
        return -(-n_q // self.block) * self.block * self.span

    def pairs(self, n: int, causal: bool) -> int:
        """Scores the band needs per (batch, head): the (i, j) with |i - j| <= w (causal: 0 <= i - j <= w)."""
        w = self.window
        return n * (w + 1) - w * (w + 1) // 2 if causal else n * (2 * w + 1) - w * (w + 1)


def band_layout(n: int, window: int, causal: bool, block_size: int | None) -> BandLayout:
    """The layout for a sequence of n: the forward passes and the cost models read this one."""
    window = min(window, n - 1)
    return BandLayout(window=window, block=block_size or default_block_size(window), after=0 if causal else window)


@kept_between_calls(maxsize=64)
def band_pattern(n: int, layout: BandLayout, causal: bool, device: torch.device) -> Pattern:
    """(1, blocks, block, span): which windowed keys each query of each block sees (cached, reused every call)."""
    # query positions (blocks, block, 1), key positions (blocks, 1, span)
    queries, keys = window_positions(n, layout.block, layout.window, layout.span, device)
    inside = (keys >= 0) & (keys < n)  # the window's keys past either end of the sequence are padding
    return Pattern((band_mask(queries, keys, layout.window, causal) & inside)[None])


@dataclass
class BandBlocks:
    """Band attention's operands: query blocks, their key and value windows, and the pattern between them."""

    queries: Tensor  # ((b h), blocks, block, d)
    keys: Tensor  # ((b h), blocks, span, d)
    values: Tensor  # ((b h), blocks, span, e)
    pattern: Pattern  # (1 | (b h), blocks, block, span)


def band_blocks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    causal: bool,
    key_padding_mask: Tensor | None,
    block_size: int | None,
) -> BandBlocks:
    """q, k (b, h, n, d), v (b, h, n, e) cut into blocks and windows, with the band's pattern and key padding."""
    h, n = q.shape[1], q.shape[-2]
    layout = band_layout(n, window, causal, block_size)
    valid_keys = key_validity_windows(key_padding_mask, n, layout.block, layout.window, layout.after)
    # the band's pattern, and'ed with key padding (b, blocks, 1, span) when given
    pattern = band_pattern(n, layout, causal, q.device).restricted_to(valid_keys, h)
    k_windows, v_windows = (key_windows(x, layout.block, layout.window, layout.after) for x in (k, v))
    return BandBlocks(query_blocks(q, layout.block), k_windows, v_windows, pattern)


def unblocked(x: Tensor, batch: int, n: int) -> Tensor:
    """((b h), blocks, block, ...) -> (b, h, n, ...): blocks back in sequence order, the padded tail cropped."""
    return rearrange(x, "(b h) n i ... -> b h (n i) ...", b=batch)[:, :, :n]


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
    """Exact sliding-window attention, q, k (b, h, n, d), v (b, h, n, e) -> (b, h, n, e), through fused SDPA."""
    blocks = band_blocks(
        q, k, v, window=window, causal=causal, key_padding_mask=key_padding_mask, block_size=block_size
    )
    out = pattern_attention(blocks.queries, blocks.keys, blocks.values, blocks.pattern)  # ((b h), blocks, block, e)
    return unblocked(out, q.shape[0], q.shape[-2])


def band_partial(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    causal: bool,
    key_padding_mask: Tensor | None,
    block_size: int | None = None,
) -> Partial:
    """Band attention with its log-sum-exp, (b, h, n, e) and (b, h, n): one part of a larger support (strided's
    local run), to be merged with the others."""
    blocks = band_blocks(
        q, k, v, window=window, causal=causal, key_padding_mask=key_padding_mask, block_size=block_size
    )
    part = partial_attention(blocks.queries, blocks.keys, blocks.values, blocks.pattern)
    b, n = q.shape[0], q.shape[-2]
    return Partial(out=unblocked(part.out, b, n), lse=unblocked(part.lse, b, n))
