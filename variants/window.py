"""The sliding window, computed block-wise: band attention's kernel, shared by the `band` variant (alone or with
sinks and global tokens) and by strided attention's local run.

The rule is `attnbench.ops.band_allows` (|i - j| <= w; causal adds j <= i): the block pattern, `support_mask` and the
flex backend's mask_mod are all evaluated from it. Queries in blocks of `block_size`; each block attends to the
contiguous window of keys it can reach (a strided view, no copy) under a small (block, window) pattern, through
PyTorch's fused SDPA kernel; `band_partial` also returns the log-sum-exp, for merging with other parts.
The blocks go to the kernel in chunks of about CHUNK_ROWS query rows, each chunk's output written into the one
preallocated output (issue 58): the working memory is one chunk's output, not the sequence's, and no key is copied.
Every window inside the sequence has the same pattern, one (block, span) bias; the blocks whose window would reach
past an end share that end's window (an expanded view) under a pattern kept per length (O(w * span), not O(N)).
O(N * (block + 2w) * D) time, O(chunk * (block + 2w)) memory; never N x N.

b - batch, h - heads, n - sequence, c - query block, i - query in block, j - key in window, d - head dim,
e - value dim
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from attnbench.interface import kept_between_calls
from attnbench.ops import band_allows
from attnbench.variants.blocks import (
    Partial,
    Pattern,
    Rows,
    block_count,
    needs_grad,
    partial_attention,
    pattern_attention,
    window_positions,
    windows_of,
    with_causal,
)
from einops import rearrange
from torch import Tensor

CHUNK_ROWS = 4096  # query rows ((b h) x positions) per kernel call: its output, 1 MiB at e = 64 in float32, is the
# working memory (exact attention's fused kernel holds 1.1 MiB of scratch and its log-sum-exp); fewer rows, more calls
# (each one a parallel region of the kernel and one of the copy, costly where the cores are shared)


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

    def chunk_blocks(self, heads: int) -> int:
        """Query blocks per chunk for `heads` (b h) heads: about CHUNK_ROWS query rows, at least one block."""
        return max(1, CHUNK_ROWS // (heads * self.block))

    def pairs(self, n: int, causal: bool) -> int:
        """Scores the band needs per (batch, head): the (i, j) with |i - j| <= w (causal: 0 <= i - j <= w)."""
        w = self.window
        return n * (w + 1) - w * (w + 1) // 2 if causal else n * (2 * w + 1) - w * (w + 1)


def band_layout(n: int, window: int, causal: bool, block_size: int | None) -> BandLayout:
    """The layout for a sequence of n: the forward passes and the cost models read this one."""
    window = min(window, n - 1)
    return BandLayout(window=window, block=block_size or default_block_size(window), after=0 if causal else window)


@dataclass(frozen=True)
class Segment:
    """Query blocks first..last-1 and where their windows lie: each at its own place (keys_from None), or all of
    them on the one window of `span` keys from `keys_from` (at the sequence's ends, where a window of their own would
    reach past it)."""

    first: int
    last: int
    keys_from: int | None


def segments(n: int, layout: BandLayout) -> list[Segment]:
    """The query blocks cut by where their windows lie: those whose window would begin before the sequence share
    [0, span), those whose window would end past it share [n - span, n) (a block needs no key outside either), and
    the others read their own, inside the sequence. A sequence shorter than a window: one segment, padded."""
    block, span = layout.block, layout.span
    blocks = block_count(n, block)
    if n < span:
        return [Segment(0, blocks, None)]
    head = min(blocks, -(-layout.window // block))  # c * block - w < 0
    tail = max(head, (n - layout.after) // block)  # (c + 1) * block + after > n
    parts = [Segment(0, head, 0), Segment(head, tail, None), Segment(tail, blocks, n - span)]
    return [part for part in parts if part.last > part.first]


def made(pattern: Pattern, dtype: torch.dtype) -> Pattern:
    """A pattern to keep between calls, its bias in `dtype` made now (and with it which queries see a key): a call
    only reads it, so a compiled call's guards on it hold at the next."""
    pattern.bias(dtype)
    return pattern


@kept_between_calls(maxsize=64)
def inner_pattern(layout: BandLayout, causal: bool, dtype: torch.dtype, device: torch.device) -> Pattern:
    """(1, 1, block, span): which windowed keys each query of a block sees, for a block whose window lies inside the
    sequence at its own place: the same for every such block (positions relative to the block's first query)."""
    queries = torch.arange(layout.block, device=device)[:, None]
    keys = torch.arange(layout.span, device=device)[None, :] - layout.window
    return made(Pattern(band_mask(queries, keys, layout.window, causal)[None, None]), dtype)


@kept_between_calls(maxsize=64)
def segment_pattern(
    n: int, layout: BandLayout, causal: bool, segment: Segment, dtype: torch.dtype, device: torch.device
) -> Pattern:
    """(1, c, block, span) for the blocks of a segment at the sequence's ends (or of a sequence shorter than a
    window): built once per length, as an end's blocks are the same at every call; O(w * span), not O(N)."""
    queries, keys = window_positions(segment.first, segment.last, layout.block, layout.window, layout.span, device)
    if segment.keys_from is not None:
        keys = segment.keys_from + torch.arange(layout.span, device=device).view(1, 1, -1)
    inside = (keys >= 0) & (keys < n)  # a padded window's keys past either end of the sequence
    return made(Pattern((band_mask(queries, keys, layout.window, causal) & inside)[None]), dtype)


def chunk_windows(x: Tensor, first: int, last: int, layout: BandLayout, keys_from: int | None) -> Tensor:
    """((b h), c, span, d): the key windows of query blocks first..last-1 of x (b, h, n, d), each at its own place
    (a strided view; zero-padded where it reaches past an end) or all on the one from `keys_from` (an expanded view)."""
    if keys_from is None:
        low, high = first * layout.block - layout.window, last * layout.block + layout.after
        return windows_of(x, low, high, layout.block, layout.span)
    shared = rearrange(x[:, :, keys_from : keys_from + layout.span], "b h j d -> (b h) 1 j d")
    return shared.expand(-1, last - first, -1, -1)


@dataclass
class BandChunk:
    """Consecutive query blocks, their key and value windows, and the pattern between them; its query positions
    are start..stop-1 (the last block's rows past the sequence are padding)."""

    start: int
    stop: int
    queries: Tensor  # ((b h), c, block, d)
    keys: Tensor  # ((b h), c, span, d)
    values: Tensor  # ((b h), c, span, e)
    pattern: Pattern  # (1 | (b h), 1 | c, block, span)

    def rows(self, x: Tensor, batch: int) -> Tensor:
        """((b h), c, block, ...) -> (b, h, stop - start, ...): this chunk's rows in sequence order."""
        return rearrange(x, "(b h) c i ... -> b h (c i) ...", b=batch)[:, :, : self.stop - self.start]


def band_chunks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    causal: bool,
    key_padding_mask: Tensor | None,
    block_size: int | None,
) -> Iterator[BandChunk]:
    """q, k (b, h, n, d), v (b, h, n, e) cut into chunks of about CHUNK_ROWS query rows with their windows (views:
    a padded copy only in a sequence shorter than a window), their pattern and'ed with key padding when given."""
    b, h, n, _ = q.shape
    layout = band_layout(n, window, causal, block_size)
    block, per_chunk = layout.block, layout.chunk_blocks(b * h)
    valid = None if key_padding_mask is None else (~key_padding_mask)[:, None, :, None].to(q.dtype)  # (b, 1, n, 1)
    for segment in segments(n, layout):
        own_place = segment.keys_from is None and n >= layout.span  # every window inside, each at its place
        if own_place:
            whole = inner_pattern(layout, causal, q.dtype, q.device)
        else:  # each chunk reads its part of it
            whole = segment_pattern(n, layout, causal, segment, q.dtype, q.device)
        for first in range(segment.first, segment.last, per_chunk):
            last = min(segment.last, first + per_chunk)
            pattern = whole if own_place else whole.narrow(1, first - segment.first, last - first)
            if valid is not None:  # (b, c, 1, span): the windowed key is real (not padding, not past an end)
                real = chunk_windows(valid, first, last, layout, segment.keys_from) > 0  # ((b 1), c, span, 1)
                pattern = pattern.restricted_to(rearrange(real, "b c j 1 -> b c 1 j"), h)
            keys, values = (chunk_windows(x, first, last, layout, segment.keys_from) for x in (k, v))
            queries = windows_of(q, first * block, last * block, block, block)
            yield BandChunk(first * block, min(n, last * block), queries, keys, values, pattern)


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
    b, n = q.shape[0], q.shape[-2]
    out = Rows(n, needs_grad(q, k, v))
    options = {"window": window, "causal": causal, "key_padding_mask": key_padding_mask, "block_size": block_size}
    for chunk in band_chunks(q, k, v, **options):  # each chunk's output dropped as soon as written (no name holds it)
        out.add(chunk.start, chunk.rows(pattern_attention(chunk.queries, chunk.keys, chunk.values, chunk.pattern), b))
    return out.result()


def band_partials(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    causal: bool,
    key_padding_mask: Tensor | None,
    block_size: int | None = None,
) -> Iterator[tuple[int, Partial]]:
    """Band attention with its log-sum-exp, chunk by chunk: (start, part), the part's out (b, h, r, e) and lse
    (b, h, r) for query positions start..start + r - 1. One part of a larger support, to be merged with the others
    a chunk at a time."""
    b = q.shape[0]
    options = {"window": window, "causal": causal, "key_padding_mask": key_padding_mask, "block_size": block_size}
    for chunk in band_chunks(q, k, v, **options):
        part = partial_attention(chunk.queries, chunk.keys, chunk.values, chunk.pattern)
        yield chunk.start, Partial(out=chunk.rows(part.out, b), lse=chunk.rows(part.lse, b))
        del part  # the caller is done with it: dropped before the next chunk's is made


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
    n = q.shape[-2]
    out, lse = Rows(n, needs_grad(q, k, v)), Rows(n, needs_grad(q, k, v))
    options = {"window": window, "causal": causal, "key_padding_mask": key_padding_mask, "block_size": block_size}
    for start, part in band_partials(q, k, v, **options):
        out.add(start, part.out)
        lse.add(start, part.lse)
        del part  # dropped before the next chunk's is made
    return Partial(out=out.result(), lse=lse.result())
