"""Attention sinks and global tokens on a sliding window: keys every query sees, and queries that see every key.

- StreamingLLM (Xiao et al., 2023, "Efficient Streaming Language Models with Attention Sinks", §3.2): a window
  drops the first tokens, which take a large share of attention whatever their content; keeping the keys of the
  first `s` positions visible to every query (the sinks) restores it: query i sees {j : |i - j| <= w} ∪ {0..s-1}.
- Longformer (Beltagy et al., 2020, "Longformer: The Long-Document Transformer", §3.1): global attention on
  chosen positions, symmetric: a global position attends to every position and every position attends to it.
  Here the `g` global positions are the first g ([CLS]-style): rows 0..g-1 see every key, and every query sees
  keys 0..g-1.

So the keys every query sees are the first c = max(s, g) positions (the "columns"), and the queries that see every
key are the first g (the "rows"). Causal keeps j <= i throughout, so there a global row i sees only keys 0..i and
`global_tokens` adds little beyond sinks (Longformer's global attention is bidirectional); key padding removes
padded keys everywhere.

Computed without any N x N tensor, a chunk of query blocks at a time (`band_partials`): the band part, with its
log-sum-exp; each query's scores against the c column keys *outside its window* (a key inside both is counted once,
in the band part), folded into the band's output in one softmax over both (`with_columns`), written into the one
output; then the g global rows whole (g x N scores), written over their rows.

b - batch, h - heads, n - sequence, c - column keys, g - global rows, d - head dim, e - value dim
"""

from __future__ import annotations

import torch
from attnbench.ops import allowed_keys, band_allows, causal_allows, default_scale, dense_masked_attention
from attnbench.variants.blocks import Partial, Rows, needs_grad, with_causal
from attnbench.variants.window import band_mask, band_partials
from einops import einsum, rearrange
from torch import Tensor


def seen_by_all(j: Tensor, columns: int) -> Tensor:
    """The sink (and global) rule for keys: key j is visible to every query when j < columns."""
    return j < columns


def sees_all(i: Tensor, rows: int) -> Tensor:
    """The global rule for queries: query i sees every key when i < rows."""
    return i < rows


def columns_and_rows(sinks: int, global_tokens: int, n: int) -> tuple[int, int]:
    """(c, g): how many first positions every query sees, and how many first queries see every key."""
    return min(max(sinks, global_tokens), n), min(global_tokens, n)


def global_band_mask(i: Tensor, j: Tensor, window: int, causal: bool, sinks: int, global_tokens: int) -> Tensor:
    """The whole support at query positions i and key positions j: the band, the columns and the rows."""
    columns, rows = max(sinks, global_tokens), global_tokens
    extra = seen_by_all(j, columns) | sees_all(i, rows)
    return band_mask(i, j, window, causal) | with_causal(extra, i, j, causal)


def column_support(
    n: int, *, window: int, causal: bool, key_padding_mask: Tensor | None, columns: int, device: torch.device
) -> Tensor:
    """(b|1, 1, n, c) bool: the column keys each query sees outside its window (inside it, they are the band's)."""
    i, j = torch.arange(n, device=device)[:, None], torch.arange(columns, device=device)[None, :]
    allowed = seen_by_all(j, columns) & ~band_allows(i, j, window)  # (n, c)
    if causal:
        allowed = allowed & causal_allows(i, j)
    allowed = allowed[None, None]
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :columns]  # (b, 1, n, c)
    return allowed


def with_columns(band: Partial, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """One softmax over the band part and a few column keys: the band's normalized output and log-sum-exp, and
    the columns' raw scores, each weighted by its share of exp. q (b, h, n, d), k (b, h, c, d), v (b, h, c, e),
    allowed (b|1, 1, n, c) -> (b, h, n, e); a query that sees no key in either outputs zeros.

    The columns are a handful of keys, so their scores are (n, c), written out; the band's output is rescaled
    once and the columns' weighted values added to it (no second (n, e) output is made and then merged)."""
    work = band.lse.dtype  # float32 at least: bfloat16 logits would round before the softmax, the band's do not
    k_t = rearrange(k.to(work), "b h c d -> b h d c").contiguous()  # a few columns, contiguous: q is read at speed
    scores = torch.matmul(q.to(work), k_t).mul_(default_scale(q.shape[-1]))  # (b, h, n, c)
    scores = scores.masked_fill(~allowed, float("-inf"))
    top = torch.maximum(band.lse, scores.amax(dim=-1)).detach()  # (b, h, n)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    band_weight = torch.exp(band.lse - top)  # (b, h, n); 0 where the band part has no key
    column_weights = torch.exp(scores - top[..., None])  # (b, h, n, c); 0 where not allowed
    total = band_weight + column_weights.sum(dim=-1)
    total = torch.where(total > 0, total, torch.ones_like(total))
    column_shares = column_weights / total[..., None]  # (b, h, n, c)
    band_share = (band_weight / total)[..., None]  # (b, h, n, 1)
    if band.out.dtype != work:  # low precision: the two parts summed in `work`, rounded once
        summed = einsum(column_shares, v.to(work), "b h n c, b h c e -> b h n e") + band.out.to(work) * band_share
        return summed.to(band.out.dtype)
    out = band.out
    saved = torch.is_grad_enabled() and out.requires_grad  # the band's output is saved for its backward
    flat = None if saved else _merged_view(out)  # ((b h), n, e): a view of `out`, to be written in place
    if flat is None:  # a new output
        return einsum(column_shares, v, "b h n c, b h c e -> b h n e").addcmul_(out, band_share)
    out.mul_(band_share)  # in place: one pass over the (n, e) output instead of three
    flat.baddbmm_(column_shares.flatten(0, 1), v.flatten(0, 1))
    return out


def _merged_view(x: Tensor) -> Tensor | None:
    """(b, h, n, e) -> ((b h), n, e) as a view of `x`, or None where its strides do not merge."""
    try:
        return x.view(-1, *x.shape[-2:])
    except RuntimeError:
        return None


def band_with_global_tokens(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    causal: bool,
    key_padding_mask: Tensor | None,
    block_size: int | None,
    sinks: int,
    global_tokens: int,
) -> Tensor:
    """Band attention with `sinks` sink keys and `global_tokens` global positions; q, k (b, h, n, d), v (b, h, n, e)
    -> (b, h, n, e). Exact on `global_band_mask`."""
    n = q.shape[-2]
    columns, rows = columns_and_rows(sinks, global_tokens, n)
    allowed = column_support(
        n, window=window, causal=causal, key_padding_mask=key_padding_mask, columns=columns, device=q.device
    )  # (b|1, 1, n, c)
    k_columns, v_columns = k[..., :columns, :], v[..., :columns, :]
    out = Rows(n, needs_grad(q, k, v))
    options = {"window": window, "causal": causal, "key_padding_mask": key_padding_mask, "block_size": block_size}
    for start, band in band_partials(q, k, v, **options):
        stop = start + band.out.shape[2]
        out.add(start, with_columns(band, q[:, :, start:stop], k_columns, v_columns, allowed[:, :, start:stop]))
        del band  # dropped before the next chunk's is made
    merged = out.result()
    if rows:
        every_key = allowed_keys(rows, n, causal=causal, key_padding_mask=key_padding_mask, device=q.device)
        merged[:, :, :rows] = dense_masked_attention(q[:, :, :rows], k, v, every_key)  # (b, h, g, e): g x N scores
    return merged
