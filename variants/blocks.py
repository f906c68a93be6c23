"""Building blocks for exact attention on a sparse support, never materializing an N x N matrix.

Queries are cut into blocks; each block attends to a window of keys (a strided view, no copy) or to a
gathered set, under a small boolean pattern. Partial results over disjoint key sets are merged with
their log-sum-exp, which gives exactly one softmax over the union.

x - batch-like axis (b*h), n - block index, i - query in block, j - key in window, d - head dim, e - value dim
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from attnbench.ops import causal_allows, default_scale
from einops import einsum, rearrange
from torch import Tensor


def block_count(n: int, size: int) -> int:
    """Blocks of `size` covering n positions (the last one may be partial)."""
    return -(-n // size)


def pad_sequence(x: Tensor, before: int, after: int) -> Tensor:
    """Zero-pad (b, h, n, d) along n."""
    return F.pad(x, (0, 0, before, after)) if before or after else x


def query_blocks(q: Tensor, block: int) -> Tensor:
    """(b, h, n, d) -> ((b h), blocks, block, d), the tail zero-padded to a whole block."""
    n = q.shape[-2]
    padded = pad_sequence(q, 0, -n % block)
    return rearrange(padded, "b h (n i) d -> (b h) n i d", i=block)


def windows_of(x: Tensor, low: int, high: int, step: int, span: int) -> Tensor:
    """((b h), c, span, d): windows of `span` positions of x (b, h, n, d), one every `step`, the first at `low`, the
    last ending at `high`; positions outside [0, n) are zeros. A strided view of x (no copy) where [low, high) lies
    inside it, else of a zero-padded copy of the slice it needs: the cost of a chunk, never of the whole sequence."""
    n = x.shape[-2]
    part = pad_sequence(x[:, :, max(low, 0) : min(high, n)], max(0, -low), max(0, high - n))
    return rearrange(part.unfold(2, span, step), "b h c d j -> (b h) c j d")


def key_windows(k: Tensor, block: int, before: int, after: int) -> Tensor:
    """((b h), blocks, before + block + after, d): for query block c, keys [c*block - before, (c+1)*block + after).

    A strided view of one padded copy of k: overlapping windows share memory.
    """
    blocks = block_count(k.shape[-2], block)
    return windows_of(k, -before, blocks * block + after, block, before + block + after)


def window_positions(
    first: int, last: int, block: int, before: int, span: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Query positions (c, block, 1) and key positions (c, 1, span) of query blocks first..last-1 in the
    `key_windows` layout."""
    starts = torch.arange(first, last, device=device).view(-1, 1, 1) * block
    queries = starts + torch.arange(block, device=device).view(1, block, 1)
    keys = starts - before + torch.arange(span, device=device).view(1, 1, span)
    return queries, keys


def real_key_blocks(batch: int, n: int, block: int, key_padding_mask: Tensor | None, device: torch.device) -> Tensor:
    """(b, blocks, block) bool over n keys cut into blocks (the last one padded): the key exists and is not padding."""
    blocks = -(-n // block)
    real = torch.arange(blocks * block, device=device) < n  # positions past n pad the last block
    if key_padding_mask is not None:
        real = real & ~F.pad(key_padding_mask, (0, blocks * block - n), value=True)
    return rearrange(real.expand(batch, -1), "b (c j) -> b c j", j=block)


def needs_grad(*tensors: Tensor) -> bool:
    """Autograd records this call: it keeps what the backward needs, so working in place or in chunks buys nothing."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class Rows:
    """A (b, h, n, ...) result assembled from consecutive runs of its rows, in order. Without autograd each run is
    copied into one tensor allocated at the first: the memory of the result and of one run. Under autograd the runs
    are concatenated at the end (the backward keeps them anyway; copying each into one tensor would cost the
    backward a pass over all of it per run)."""

    def __init__(self, n: int, keep_graph: bool) -> None:
        self.n, self.keep_graph = n, keep_graph
        self.runs: list[Tensor] = []
        self.out: Tensor | None = None

    def add(self, start: int, run: Tensor) -> None:
        """Rows start..start + r - 1: run (b, h, r, ...)."""
        if self.keep_graph:
            self.runs.append(run)
            return
        if self.out is None:
            self.out = run.new_empty(*run.shape[:2], self.n, *run.shape[3:])
        self.out[:, :, start : start + run.shape[2]] = run

    def result(self) -> Tensor:
        return torch.cat(self.runs, dim=2) if self.keep_graph else self.out


def with_causal(allowed: Tensor, i: Tensor, j: Tensor, causal: bool) -> Tensor:
    """`allowed` (a rule evaluated at query positions i, key positions j), and'ed with the causal rule if causal."""
    return allowed & causal_allows(i, j) if causal else allowed


def all_pairs(n_q: int, n_k: int) -> tuple[Tensor, Tensor]:
    """Query positions (i, 1) and key positions (1, j): a rule evaluated at them is a dense (i, j) support_mask
    (dense by definition: small N only, never in a forward pass)."""
    return torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]


def expand_over_heads(mask: Tensor, heads: int) -> Tensor:
    """(b, ...) -> ((b h), ...) for masks that are per batch element but must match a (b h) axis."""
    return rearrange(mask[:, None].expand(mask.shape[0], heads, *mask.shape[1:]), "b h ... -> (b h) ...")


class derived:  # noqa: N801 (a decorator, named as functools.cached_property is)
    """`functools.cached_property` without its lock: computed at the first read, then kept on the instance. On
    Python 3.11 that lock is a context manager `torch.compile` cannot trace, so every first read was a graph
    break in a compiled call."""

    def __init__(self, compute: Callable[[Any], Any]) -> None:
        self.compute, self.name, self.__doc__ = compute, compute.__name__, compute.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


class Pattern:
    """A boolean support (broadcastable to (x, y, i, j)), with what the kernels need derived once and kept.

    Give `allowed`, or `bias` (0 where allowed, -inf elsewhere) for a support built as the kernel's float
    bias directly, as LSH does; the bias is never modified (it may be a cached pattern shared by calls).
    """

    def __init__(self, allowed: Tensor | None = None, *, bias: Tensor | None = None) -> None:
        if (allowed is None) == (bias is None):
            raise TypeError("Pattern takes `allowed` or `bias`, one of them")
        self._biases: dict[torch.dtype, Tensor] = {}
        if allowed is not None:
            self.allowed = allowed
        else:
            self.has_key = bias.amax(dim=-1) > float("-inf")  # a vectorized max: faster than any() on bools
            self._biases[bias.dtype] = self._without_nan_rows(bias)

    @derived
    def allowed(self) -> Tensor:
        """Reached only for a pattern given as a bias (rows with no key were zeroed there)."""
        return (next(iter(self._biases.values())) == 0) & self.has_key[..., None]

    @derived
    def has_key(self) -> Tensor:
        """(..., i) bool: the query sees at least one key."""
        return self.allowed.any(dim=-1)

    @derived
    def complete(self) -> bool:
        """Every query sees at least one key (nothing to zero after the kernel). Under `torch.compile` it is taken
        as False without looking: reading a tensor's value would cut the graph, and zeroing the rows that have no
        key, when every row has one, changes nothing."""
        if torch.compiler.is_compiling():
            return False
        return bool(self.has_key.all())

    def _without_nan_rows(self, bias: Tensor) -> Tensor:
        """A row with no allowed key all zeros instead of all -inf (no NaN; its output is zeroed after).

        Out of place: the bias may be a cached pattern shared by later calls.
        """
        return bias if self.complete else bias.masked_fill(~self.has_key[..., None], 0.0)

    def bias(self, dtype: torch.dtype) -> Tensor:
        """0 where allowed, -inf elsewhere; a row with no allowed key is all zeros (no NaN; zeroed after).

        SDPA's fused CPU kernel takes a float mask as it is; a bool mask would be converted on every call.
        """
        if dtype not in self._biases:
            if self._biases:  # given as a bias of another dtype
                self._biases[dtype] = next(iter(self._biases.values())).to(dtype)
            else:
                zero = torch.zeros((), dtype=dtype, device=self.allowed.device)
                self._biases[dtype] = self._without_nan_rows(torch.where(self.allowed, zero, float("-inf")))
        return self._biases[dtype]

    def narrow(self, dim: int, start: int, length: int) -> "Pattern":
        """Entries start..start + length - 1 along `dim` (not the last two): views of this pattern and of the biases
        made so far, so a part of a kept pattern costs nothing."""
        part = Pattern(self.allowed.narrow(dim, start, length))
        part.has_key = self.has_key.narrow(dim, start, length)
        part._biases = {dtype: bias.narrow(dim, start, length) for dtype, bias in self._biases.items()}
        return part

    def restricted_to(self, valid_keys: Tensor | None, heads: int) -> "Pattern":
        """This pattern and'ed with per-batch key validity (b, ..., 1, j), expanded to the (b h) axis."""
        if valid_keys is None:
            return self
        return Pattern(expand_over_heads(self.allowed & valid_keys, heads))


@dataclass
class Partial:
    """Attention over one part of the support: the normalized output and the log-sum-exp of its scores."""

    out: Tensor  # (..., i, e)
    lse: Tensor  # (..., i), float32 (float64 for float64 inputs), -inf where the part has no key for the query


def segment_means(rows: int, n: int, real: Tensor | None = None, device: torch.device | str = "cpu") -> Tensor:
    """(rows, n) in float64, or (b, rows, n) given `real` (b, n): row r averages the (real) positions of the
    contiguous segment [floor(r n / rows), floor((r + 1) n / rows)); a segment with none is zeros. Linformer's
    pooling projection and Nyströmformer's landmarks."""
    bounds = (torch.arange(rows + 1, device=device) * n) // rows
    position = torch.arange(n, device=device)[None, :]
    member = (position >= bounds[:-1, None]) & (position < bounds[1:, None])  # (rows, n)
    if real is not None:
        member = member & real[:, None, :]  # (b, rows, n)
    return member.double() / member.sum(dim=-1, keepdim=True).clamp(min=1)


def pattern_attention(q: Tensor, k: Tensor, v: Tensor, pattern: Pattern) -> Tensor:
    """Softmax attention of q (x, y, i, d) over k, v (x, y, j, d|e) restricted to `pattern`, through the fused SDPA
    kernel; a query that sees no key outputs zeros (the kernel's row for it is discarded)."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=pattern.bias(q.dtype))
    return out if pattern.complete else out.masked_fill(~pattern.has_key[..., None], 0.0)


def _flash_with_lse() -> object | None:
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def partial_attention(q: Tensor, k: Tensor, v: Tensor, pattern: Pattern) -> Partial:
    """Softmax attention of q (x, y, i, d) over k, v (x, y, j, d|e) restricted to `pattern`.

    Without autograd on the CPU this runs PyTorch's fused flash kernel, which also returns the log-sum-exp;
    with autograd it is written out (block-sized scores only) so gradients flow through the log-sum-exp too.
    """
    accumulate = torch.promote_types(q.dtype, torch.float32)  # the log-sum-exp in at least float32
    flash = _flash_with_lse()
    fused = flash is not None and q.device.type == "cpu" and q.dim() == 4 and q.shape[-1] == v.shape[-1]
    if fused and not needs_grad(q, k, v):
        out, lse = flash(q, k, v, attn_mask=pattern.bias(q.dtype), scale=default_scale(q.shape[-1]))
    else:
        allowed = pattern.allowed
        scores = einsum(q, k, "... i d, ... j d -> ... i j") * default_scale(q.shape[-1])
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        lse = torch.logsumexp(scores.to(accumulate), dim=-1)
        weights = torch.exp(scores - lse[..., None].to(scores.dtype)).masked_fill(~allowed, 0.0)
        out = einsum(weights, v, "... i j, ... j e -> ... i e")
    lse = lse.to(accumulate)
    if pattern.complete:
        return Partial(out=out, lse=lse)
    has_key = pattern.has_key.expand(lse.shape)
    return Partial(out=out.masked_fill(~has_key[..., None], 0.0), lse=lse.masked_fill(~has_key, float("-inf")))


def merge_partials(outs: Sequence[Tensor], lse: Tensor) -> Tensor:
    """One softmax over the union of p parts' (disjoint) supports: weight each part by its share of exp(lse).

    outs: p tensors (..., i, e), each normalized over its part; lse: (p, ..., i). A query that sees no key in
    any part outputs zeros.
    """
    top = lse.amax(dim=0).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(lse - top)  # (p, ..., i); 0 for parts with no key
    total = weights.sum(dim=0)
    share = (weights / torch.where(total > 0, total, torch.ones_like(total)))[..., None].to(outs[0].dtype)
    out = outs[0] * share[0]
    for part, part_share in zip(outs[1:], share[1:]):
        out.addcmul_(part, part_share)
    return out


def combine(parts: list[Partial]) -> Tensor:
    """`merge_partials` for a list of parts."""
    return merge_partials([part.out for part in parts], torch.stack([part.lse for part in parts]))
