"""Strided and fixed sparse attention (Child et al. 2019, Generating Long Sequences with Sparse Transformers).

With stride l (default round(sqrt(N))):
- `strided`: query i sees the local run |i - j| <= l (causal: 0 <= i - j <= l, i.e. positions i - l .. i, the
  paper's A(1) of l + 1 positions) and every position j with (i - j) mod l == 0 (causal: j <= i), A(2).
- `fixed`: query i sees its own block of l positions (causal: up to i) and the last `summary` positions of
  every block (causal: up to i).
Both parts are computed separately and merged by their log-sum-exp: one softmax over the union, a key
that both parts contain counted once (the second part leaves out what the first covers).
`factorize=True` splits the parts across heads as in the paper: even heads the first part, odd heads the second
(it needs at least two heads; with one the second part would be dropped, so that is refused).

Each rule is one function of query and key positions (`column_allows`, ...; the local run's is band.py's
`band_allows`): the parts' patterns, `support_mask` and the flex backend's mask_mod are all evaluated from them.

Work is proportional to the support: the local run is band attention over blocks (band.py's); the stride part is
attention along columns of the sequence laid out as (rows of l), as in OpenAI's reference, read in place as strided
views (the fused kernel takes any strides, and writes its output back in sequence order), under one (rows, rows)
pattern shared by every column — O(N * (l + N/l) * D); the summary part is O(N * (l + N * summary / l) * D). The
second part is folded into the first's output in place, by its share of their log-sum-exps.

Decode (`prefill` / `step`): the stride is fixed at prefill, `stride` or default_stride of the prompt's length; a
step reads only the keys its pattern selects, as views of its cache (no copy): `strided` a KV cache of every
position (each is a later token's column key), the local run a slice, the column a slice with step l; `fixed` keeps
less, the summaries of every block and the current block only (a position outside the summaries is read by its own
block's queries alone): a cache of N * summary / l + l positions. With `stride` given (no longer than the prompt:
the forward clips it to its length), each step equals the last row of the causal forward over everything so far
(`decode_equals_forward`); with the default, the forward's stride follows its length (round(sqrt(N + t))) while the
steps keep the prompt's, so they are compared for shape and finiteness only.

b - batch, h - heads, r - row (block of l), c - column (position in block), d - head dim, e - value dim
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from attnbench.interface import (
    AttentionVariant,
    Capabilities,
    Cost,
    DecodeState,
    Hyperparameter,
    Shape,
    UnsupportedOptionError,
    kept_between_calls,
    saved_scores_bytes,
    softmax_attention_flops,
)
from attnbench.ops import KVCache, band_allows, softmax_step
from attnbench.variants.blocks import (
    Partial,
    Pattern,
    all_pairs,
    combine,
    expand_over_heads,
    needs_grad,
    pad_sequence,
    partial_attention,
    real_key_blocks,
    with_causal,
)
from attnbench.variants.decoding import softmax_over_parts
from attnbench.variants.flex import BACKEND, FLEX_BACKEND, FlexBackend, flex_attention_call
from attnbench.variants.window import band_layout, band_partial
from einops import rearrange
from torch import Tensor


HEAD_CHUNK_BYTES = 2 << 20  # the forward takes as many heads at once as keep one of q, k, v within this


def default_stride(n: int) -> int:
    return max(1, round(math.sqrt(n)))


# ---- the rules: which key positions j a query position i sees (positions broadcast), one function each ------
# `strided`: the local run is band.py's `band_allows` with window l, then `column_allows`;
# `fixed`: `same_block_allows`, then `summary_allows`. Causal is `with_causal`'s j <= i on top.


def column_allows(i: Tensor, j: Tensor, stride: int) -> Tensor:
    """Strided, second part (the paper's A(2)): keys a whole number of strides away, (i - j) mod l == 0."""
    return (i - j) % stride == 0


def same_block_allows(i: Tensor, j: Tensor, stride: int) -> Tensor:
    """Fixed, first part: keys in the query's own block of l positions."""
    return i // stride == j // stride


def summary_allows(i: Tensor, j: Tensor, stride: int, summary: int) -> Tensor:
    """Fixed, second part: the last `summary` positions of every block, whatever the query (reads j only)."""
    return j % stride >= stride - summary


def parts_allow(pattern: str, i: Tensor, j: Tensor, *, stride: int, summary: int) -> tuple[Tensor, Tensor]:
    """The rules of `pattern`'s first and second part at (i, j), causal left out."""
    if pattern == "strided":
        return band_allows(i, j, stride), column_allows(i, j, stride)
    return same_block_allows(i, j, stride), summary_allows(i, j, stride, summary)


def _as_grid(x: Tensor, stride: int) -> Tensor:
    """(b, h, n, d) -> (b, h, rows, stride, d), zero-padded to whole rows."""
    return rearrange(pad_sequence(x, 0, -x.shape[-2] % stride), "b h (r c) d -> b h r c d", c=stride)


def _real_positions(n: int, stride: int, key_padding_mask: Tensor | None, device: torch.device) -> Tensor:
    """(b | 1, rows, stride) bool: positions inside [0, n) and not padding (one row for every batch element when
    nothing is padded)."""
    batch = 1 if key_padding_mask is None else key_padding_mask.shape[0]
    return real_key_blocks(batch, n, stride, key_padding_mask, device)


def _some_key_padded(n: int, stride: int, causal: bool, key_padding_mask: Tensor | None) -> bool:
    """Whether a query may see a padding key of the (rows, l) grid: a masked key, or (not causal) the zeros padding
    the last row. Causal, those zeros lie past every real query and the causal rule already hides them."""
    return key_padding_mask is not None or (not causal and n % stride != 0)


# ---- the parts, each returning its output and log-sum-exp in (b, h, n, .) order --------------------


def local_part(
    q: Tensor, k: Tensor, v: Tensor, *, stride: int, causal: bool, key_padding_mask: Tensor | None
) -> Partial:
    """The local run |i - j| <= l (causal: i - l .. i): band attention with window l, with its log-sum-exp."""
    return band_partial(q, k, v, window=stride, causal=causal, key_padding_mask=key_padding_mask)


@kept_between_calls(maxsize=64)
def _column_rows(rows: int, stride: int, causal: bool, exclude_local: bool, device: torch.device) -> tuple[Tensor, int]:
    """(rows, rows) bool: which rows of the same column a query row sees, and the first row that sees any (rows if
    none does). The rules are evaluated at column 0's positions: they read only i - j, the same in every column."""
    position = torch.arange(rows, device=device) * stride  # column 0 of the (rows, l) grid
    i, j = position[:, None], position[None, :]  # (r, 1), (1, r)
    allowed = with_causal(column_allows(i, j, stride), i, j, causal)
    # the local run i - l .. i + l already holds the same column's keys one row away and the query's own
    allowed = allowed & ~band_allows(i, j, stride) if exclude_local else allowed
    seen = allowed.any(dim=-1)
    return allowed, int(seen.int().argmax()) if bool(seen.any()) else rows


def column_part(
    q: Tensor, k: Tensor, v: Tensor, *, stride: int, causal: bool, key_padding_mask: Tensor | None, exclude_local: bool
) -> tuple[int, Partial] | None:
    """Every j with (i - j) mod l == 0: attention along the columns of the (rows, l) grid, read as strided views of
    q, k, v (copied only to pad the last row). The rows' rule is one (rows, rows) pattern shared by every column;
    only padding keys (a key padding mask, or the padded last row when not causal) make it per column.

    Returns (start, part), the part for positions start..n-1: the grid's first rows that see no key of it (causal
    and exclusive: two, their column keys all in the local run) are left out of the kernel's call rather than
    computed and zeroed. None when no query sees a key."""
    b, h, n, _ = q.shape
    qc, kc, vc = (rearrange(_as_grid(x, stride), "b h r c d -> (b h) c r d") for x in (q, k, v))
    allowed, first = _column_rows(qc.shape[-2], stride, causal, exclude_local, q.device)  # (r, r)
    start = first * stride
    if start >= n:
        return None
    allowed = allowed[first:]  # (r - first, r): the query rows from the first with a key
    if _some_key_padded(n, stride, causal, key_padding_mask):
        real = rearrange(_real_positions(n, stride, key_padding_mask, q.device), "b r c -> b c 1 r")  # keys
        allowed = allowed & real  # (b|1, c, r - first, r)
        allowed = allowed if key_padding_mask is None else expand_over_heads(allowed, h)
    part = partial_attention(qc[:, :, first:], kc, vc, Pattern(allowed))  # the kernel writes (r c) order: views
    return start, Partial(
        out=rearrange(part.out, "(b h) c r e -> b h (r c) e", b=b)[:, :, : n - start],
        lse=rearrange(part.lse, "(b h) c r -> b h (r c)", b=b)[:, :, : n - start],
    )


def _own_block(stride: int, causal: bool, device: torch.device) -> Tensor:
    """(c, c) bool: which positions of its own block (a row of the grid) a query sees. The rules are evaluated at
    row 0's positions: a shift by whole rows changes neither i - j nor whether i and j share a block."""
    position = torch.arange(stride, device=device)  # row 0 of the (rows, l) grid
    i, j = position[:, None], position[None, :]  # (c, 1), (1, c)
    return with_causal(same_block_allows(i, j, stride), i, j, causal)


def block_part(
    q: Tensor, k: Tensor, v: Tensor, *, stride: int, causal: bool, key_padding_mask: Tensor | None
) -> Partial:
    """Own block of l positions (causal: up to i)."""
    b, h, n, _ = q.shape
    qr, kr, vr = (rearrange(_as_grid(x, stride), "b h r c d -> (b h) r c d") for x in (q, k, v))
    allowed = _own_block(stride, causal, q.device)  # (c, c), the same in every block
    if _some_key_padded(n, stride, causal, key_padding_mask):
        allowed = allowed & _real_positions(n, stride, key_padding_mask, q.device)[:, :, None, :]  # (b|1, r, c, c)
        allowed = allowed if key_padding_mask is None else expand_over_heads(allowed, h)
    pattern = Pattern(allowed)
    part = partial_attention(qr, kr, vr, pattern)
    return Partial(
        out=rearrange(part.out, "(b h) r c e -> b h (r c) e", b=b)[:, :, :n],
        lse=rearrange(part.lse, "(b h) r c -> b h (r c)", b=b)[:, :, :n],
    )


def summary_part(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    stride: int,
    summary: int,
    causal: bool,
    key_padding_mask: Tensor | None,
    exclude_own_block: bool,
) -> Partial:
    """The last `summary` positions of every block, gathered once: N x (N * summary / l) scores."""
    b, h, n, _ = q.shape
    summary = min(summary, stride)
    ks, vs = (
        rearrange(_as_grid(x, stride)[:, :, :, stride - summary :], "b h r s d -> (b h) 1 (r s) d") for x in (k, v)
    )
    qs = rearrange(pad_sequence(q, 0, -n % stride), "b h n d -> (b h) 1 n d")
    rows = ks.shape[-2] // summary
    position = torch.arange(rows * stride, device=q.device)
    query_pos = position[:, None]  # (n, 1)
    key_pos = rearrange(position, "(r c) -> r c", c=stride)[:, stride - summary :]  # gathered as ks, vs
    key_pos = rearrange(key_pos, "r s -> 1 (r s)")
    allowed = summary_allows(query_pos, key_pos, stride, summary).expand(len(query_pos), -1)  # (n, r*s)
    allowed = with_causal(allowed, query_pos, key_pos, causal)
    if exclude_own_block:
        allowed = allowed & ~same_block_allows(query_pos, key_pos, stride)
    real = _real_positions(n, stride, key_padding_mask, q.device)[:, :, stride - summary :]  # (b|1, r, s)
    allowed = allowed[None] & rearrange(real, "b r s -> b 1 (r s)")  # (b|1, n, r*s)
    pattern = Pattern(allowed[:, None] if key_padding_mask is None else expand_over_heads(allowed[:, None], h))
    part = partial_attention(qs, ks, vs, pattern)
    return Partial(
        out=rearrange(part.out, "(b h) 1 n e -> b h n e", b=b)[:, :, :n],
        lse=rearrange(part.lse, "(b h) 1 n -> b h n", b=b)[:, :, :n],
    )


def merged(first: Partial, second: tuple[int, Partial] | None) -> Tensor:
    """One softmax over two disjoint parts, `first` over every position, `second` (start, part) over positions
    start..n-1 (None: no key): first's output moved toward second's by second's share of their total weight,
    sigmoid(lse2 - lse1) (a part with no key for a query has lse -inf: share 0 or 1; no key in either: zeros).
    Without autograd in place on first's output, one pass (`combine`'s weights take several); with it, `combine`."""
    if second is None:
        return first.out
    start, part = second
    if needs_grad(first.out, part.out):
        whole = Partial(out=F.pad(part.out, (0, 0, start, 0)), lse=F.pad(part.lse, (start, 0), value=float("-inf")))
        return combine([first, whole])
    share = torch.sigmoid(part.lse - first.lse[:, :, start:]).nan_to_num_(0.0)  # (b, h, n - start); both -inf: 0
    first.out[:, :, start:].lerp_(part.out, share[..., None].to(first.out.dtype))
    return first.out


def strided_support(n: int, *, stride: int, pattern: str, summary: int, causal: bool) -> Tensor:
    """(2, n, n) bool: the dense pattern of the first and second part (their union is the full pattern)."""
    i, j = all_pairs(n, n)  # (i, 1), (1, j)
    parts = parts_allow(pattern, i, j, stride=stride, summary=min(summary, stride))
    return torch.stack([with_causal(part, i, j, causal).expand(n, n) for part in parts])


# ---- decode: one new token against what the pattern keeps -------------------------------------------

EVEN, ODD = slice(0, None, 2), slice(1, None, 2)  # factorized: the first part's heads, the second part's


def row_bytes(k: Tensor, v: Tensor) -> int:
    """Bytes of one position's key and value in buffers like k (..., d) and v (..., e)."""
    return k.shape[-1] * k.element_size() + v.shape[-1] * v.element_size()


def summaries_before(t: int, stride: int, summary: int) -> int:
    """How many positions j < t are block summaries (j mod l >= l - summary)."""
    return (t // stride) * summary + max(0, t % stride - (stride - summary))


def factorized_attention(
    q: Tensor, first: tuple[Tensor, Tensor] | None, second: tuple[Tensor, Tensor] | None
) -> Tensor:
    """Factorized heads: even heads attend to `first` (k, v of the even heads), odd heads to `second` (of the odd
    heads); None: no key, zeros. q (b, h, 1, d) -> (b, h, 1, e)."""
    parts = [part for part in (first, second) if part is not None]
    out = q.new_zeros(*q.shape[:-1], parts[0][1].shape[-1])
    for heads, part in ((EVEN, first), (ODD, second)):
        if part is not None:
            out[:, heads] = softmax_step(q[:, heads], *part)
    return out


@dataclass
class StridedCache(KVCache):
    """The `strided` pattern's cache: every position's key and value. A step at t reads the local run t - l .. t (a
    slice) and the column t - 2l, t - 3l, ... (a slice with step l); factorized, even heads the run and odd heads
    the whole column t, t - l, ..."""

    stride: int
    factorize: bool

    def step(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The new token (position t = length) sees its pattern's keys up to itself: (b, h, 1, e)."""
        self.append(k, v)
        t, l = self.length - 1, self.stride
        local = slice(max(0, t - l), t + 1)
        if self.factorize:
            column = slice(t % l, t + 1, l)
            first = (self.keys[:, EVEN, local], self.values[:, EVEN, local])
            return factorized_attention(q, first, (self.keys[:, ODD, column], self.values[:, ODD, column]))
        parts = [(self.keys[..., local, :], self.values[..., local, :], None)]
        if t >= 2 * l:  # the column beyond the run: t - 2l, t - 3l, ... down to t mod l
            column = slice(t % l, t - 2 * l + 1, l)
            parts.append((self.keys[..., column, :], self.values[..., column, :], None))
        return softmax_over_parts(q, parts)

    @property
    def read_bytes(self) -> int:
        """What the next step (at t = length) reads of the cache: the run's l held positions and the column's t // l
        - 1 beyond it (factorized: even heads the run, odd heads the t // l of the column)."""
        t, l = self.length, self.stride
        b, h = self.keys.shape[:2]
        run, column = min(l, t), max(0, t // l - 1)
        rows = b * (h - h // 2) * run + b * (h // 2) * (t // l) if self.factorize else b * h * (run + column)
        return rows * row_bytes(self.keys, self.values)


@dataclass
class FixedPatternState(KVCache):
    """The `fixed` pattern's cache: the block summaries so far (keys, values: the last `summary` positions of every
    block, in order; a KV cache) and the current block (block_k (b, h, l, d), block_v (b, h, l, e): slot c holds
    position (t // l) * l + c). Nothing else is read again: a position outside the summaries is seen by its own
    block's queries only."""

    block_k: Tensor
    block_v: Tensor
    position: int  # the next token's position
    stride: int
    summary: int
    factorize: bool

    @classmethod
    def of_prompt(
        cls, k: Tensor, v: Tensor, *, stride: int, summary: int, factorize: bool, room: int
    ) -> "FixedPatternState":
        """The state after the prompt k (b, h, n, d), v (b, h, n, e), with room for the summaries of `room` steps."""
        n = k.shape[-2]
        positions = torch.arange(n, device=k.device)
        summaries = positions[summary_allows(positions, positions, stride, summary)]
        cache = KVCache.of(k[..., summaries, :], v[..., summaries, :], room=summaries_before(n + room, stride, summary)
                           - summaries_before(n, stride, summary))  # fmt: skip
        block_k = k.new_zeros(*k.shape[:-2], stride, k.shape[-1])
        block_v = v.new_zeros(*v.shape[:-2], stride, v.shape[-1])
        start = n - n % stride  # the block of the next token: its positions so far
        block_k[..., : n - start, :], block_v[..., : n - start, :] = k[..., start:, :], v[..., start:, :]
        return cls(cache.keys, cache.values, cache.length, block_k, block_v, n, stride, summary, factorize)

    def step(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The new token (position t) sees its block up to itself and the summaries of the earlier blocks
        (factorized: even heads the block, odd heads every summary up to t): (b, h, 1, e)."""
        t, l = self.position, self.stride
        slot = t % l
        self.block_k[..., slot, :], self.block_v[..., slot, :] = k[..., 0, :], v[..., 0, :]
        if slot >= l - self.summary:
            self.append(k, v)
        self.position += 1
        own = (self.block_k[..., : slot + 1, :], self.block_v[..., : slot + 1, :])
        if self.factorize:
            summaries = (self.k[:, ODD], self.v[:, ODD]) if self.length else None
            return factorized_attention(q, (own[0][:, EVEN], own[1][:, EVEN]), summaries)
        earlier = (t // l) * self.summary  # the summaries of the blocks before t's (its own are in `own`)
        parts = [(*own, None)]
        if earlier:
            parts.append((self.keys[..., :earlier, :], self.values[..., :earlier, :], None))
        return softmax_over_parts(q, parts)

    @property
    def read_bytes(self) -> int:
        """What the next step (at t = position) reads: its block's t mod l held positions and the summaries of the
        earlier blocks (factorized: even heads the block, odd heads every summary held)."""
        t, l = self.position, self.stride
        b, h = self.keys.shape[:2]
        own = t % l
        if self.factorize:
            rows = b * (h - h // 2) * own + b * (h // 2) * self.length
        else:
            rows = b * h * (own + (t // l) * self.summary)
        return rows * row_bytes(self.keys, self.values)


class StridedAttention(FlexBackend, AttentionVariant):
    """Sparse Transformer attention, `strided` or `fixed` pattern, exact on its support."""

    name = "strided"
    family = "strided"
    exact = True
    supports = Capabilities(
        cross_attention=False,
        subquadratic_memory=True,
        notes={"cross_attention": "the pattern is defined on the positions of one sequence; use Nq == Nk"},
    )
    hyperparameters = {
        "stride": Hyperparameter(None, "l: stride and local length (default round(sqrt(N)))", minimum=1, optional=True),
        "pattern": Hyperparameter(
            "strided",
            "strided: local run + every l-th; fixed: own block + block summaries",
            kind=str,
            choices=("strided", "fixed"),
        ),
        "summary": Hyperparameter(
            8, "fixed pattern: the last `summary` positions of each block are seen by all", minimum=1
        ),
        "factorize": Hyperparameter(False, "split the two parts across heads (even: first, odd: second)", kind=bool),
        "backend": BACKEND,
    }

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        n = q.shape[-2]
        stride = min(self.stride or default_stride(n), n)
        if self.backend == FLEX_BACKEND:
            return self._flex(q, k, v, stride=stride, causal=causal)
        options = dict(stride=stride, causal=causal, key_padding_mask=key_padding_mask)
        if self.pattern == "strided":
            first = lambda x, y, z: local_part(x, y, z, **options)  # noqa: E731
            second = lambda x, y, z, exclusive: column_part(x, y, z, exclude_local=exclusive, **options)  # noqa: E731
        else:
            first = lambda x, y, z: block_part(x, y, z, **options)  # noqa: E731
            second = lambda x, y, z, exclusive: (  # noqa: E731
                0, summary_part(x, y, z, summary=self.summary, exclude_own_block=exclusive, **options)
            )
        if not self.factorize:
            # a few heads at a time past HEAD_CHUNK_BYTES: each part holds its own output and log-sum-exp (and, for a
            # padded last row, copies of q, k, v): at N=8192 all heads at once peak at 4.6x full's, one head 1.5x
            heads = max(1, HEAD_CHUNK_BYTES // max(1, q.shape[0] * n * q.shape[-1] * q.element_size()))
            if heads >= q.shape[1]:
                return merged(first(q, k, v), second(q, k, v, True))
            out = q.new_empty(*q.shape[:-1], v.shape[-1])
            for start in range(0, q.shape[1], heads):
                part = slice(start, start + heads)
                x, y, z = q[:, part], k[:, part], v[:, part]
                out[:, part] = merged(first(x, y, z), second(x, y, z, True))
            return out
        if q.shape[1] < 2:
            raise UnsupportedOptionError(
                "strided with factorize=True needs at least 2 heads (even heads: the first part, odd heads: the "
                f"second); with {q.shape[1]} head the second part would be dropped"
            )
        out = q.new_zeros(*q.shape[:-1], v.shape[-1])
        even, odd = slice(0, None, 2), slice(1, None, 2)
        # each part alone: its output is the softmax over it (a query with no key of it zeros); the second, not
        # exclusive, starts at 0 (every query sees its own position)
        out[:, even] = first(q[:, even], k[:, even], v[:, even]).out
        out[:, odd] = second(q[:, odd], k[:, odd], v[:, odd], False)[1].out
        return out

    @property
    def decode_equals_forward(self) -> bool:  # type: ignore[override]
        """With `stride` given a step is the causal forward's last row; with the default the forward's stride
        follows its length while the steps keep the prompt's (see the module's docstring)."""
        return self.stride is not None

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """The causal forward, and the cache of the pattern at the stride fixed now (`stride`, else the prompt's
        default): `strided` every position, `fixed` the block summaries and the current block."""
        n = k.shape[-2]
        stride = self.stride or default_stride(n)  # not clipped to n: a stride >= n is causal attention either way
        if self.factorize and q.shape[1] < 2:
            raise UnsupportedOptionError(f"strided with factorize=True needs at least 2 heads; got {q.shape[1]}")
        out = self(q, k, v, causal=True)
        if self.pattern == "strided":
            cache = KVCache.of(k, v, room)
            return out, StridedCache(cache.keys, cache.values, cache.length, stride, self.factorize)
        summary = min(self.summary, stride)
        state = FixedPatternState.of_prompt(k, v, stride=stride, summary=summary, factorize=self.factorize, room=room)
        return out, state

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        if not isinstance(state, (StridedCache, FixedPatternState)):
            raise UnsupportedOptionError(f"strided cannot step from a {type(state).__name__}")
        return state.step(q, k, v), state

    def _flex(self, q: Tensor, k: Tensor, v: Tensor, *, stride: int, causal: bool) -> Tensor:
        pattern, summary, factorize = self.pattern, min(self.summary, stride), self.factorize

        def strided_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            first, second = parts_allow(pattern, q_idx, kv_idx, stride=stride, summary=summary)
            union = (first & (h % 2 == 0)) | (second & (h % 2 == 1)) if factorize else first | second
            return with_causal(union, q_idx, kv_idx, causal)

        key = ("strided", pattern, stride, summary, factorize, causal)
        return flex_attention_call(q, k, v, strided_mod, key=key)

    def support_mask(self, n_q: int, n_k: int, causal: bool) -> Tensor:
        stride = min(self.stride or default_stride(n_q), n_q)
        parts = strided_support(n_q, stride=stride, pattern=self.pattern, summary=self.summary, causal=causal)
        return parts if self.factorize else parts[0] | parts[1]

    def cost(self, shape: Shape) -> Cost:
        n = shape.n_q
        stride = min(self.stride or default_stride(n), n)
        rows = -(-n // stride)  # of the (rows, stride) grid, the last row zero-padded
        # scores computed per head by each part, masked ones included (as the parts above lay them out)
        if self.pattern == "strided":
            first = band_layout(n, stride, shape.causal, None).scores(n)  # local run: band blocks, as local_part
            # columns: each row of the grid from the first that sees a key of the part against every row
            seen_from = _column_rows(rows, stride, shape.causal, not self.factorize, torch.device("cpu"))[1]
            second = stride * (rows - seen_from) * rows
        else:
            first = rows * stride * stride  # own block
            second = rows * stride * rows * min(self.summary, stride)  # each position against every summary
        heads = shape.heads
        first_heads, second_heads = (heads - heads // 2, heads // 2) if self.factorize else (heads, heads)
        computed = shape.batch * (first_heads * first + second_heads * second)
        matmul, other = softmax_attention_flops(computed, shape)
        io = shape.batch * shape.heads * n * (2 * shape.head_dim + 2 * shape.value_dim)
        # both parts' outputs and log-sum-exps, a padded copy of k and v; patterns (bool and bias) shared by (b h)
        held = 2 * (shape.value_dim + 1) + shape.head_dim + shape.value_dim
        patterns = (first + second) * (1 + shape.dtype_bytes)
        working = shape.batch * shape.heads * rows * stride * held * shape.dtype_bytes + patterns
        return Cost(
            flops=matmul + other,
            bytes_moved=io * shape.dtype_bytes,
            working_bytes=working,
            matmul_flops=matmul,
            backward_working_bytes=working + saved_scores_bytes(computed, shape),
        )
