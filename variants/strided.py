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

Work is proportional to the support: the local run is band attention over blocks; the stride part is
attention along columns of the sequence laid out as (rows of l) — the stride axis made contiguous, as in
OpenAI's reference — O(N * (l + N/l) * D); the summary part is O(N * (l + N * summary / l) * D).

b - batch, h - heads, r - row (block of l), c - column (position in block), d - head dim, e - value dim
"""

from __future__ import annotations

import math

import torch
from attnbench.interface import (
    AttentionVariant,
    Capabilities,
    Cost,
    Hyperparameter,
    Shape,
    UnsupportedOptionError,
    kept_between_calls,
    saved_scores_bytes,
    softmax_attention_flops,
)
from attnbench.variants.band import band_pattern, default_block_size
from attnbench.variants.blocks import (
    Partial,
    Pattern,
    combine,
    expand_over_heads,
    key_validity_windows,
    key_windows,
    pad_sequence,
    partial_attention,
    query_blocks,
)
from attnbench.variants.flex import BACKEND, FLEX_BACKEND, FlexBackend, flex_attention_call
from einops import rearrange
from torch import Tensor


def default_stride(n: int) -> int:
    return max(1, round(math.sqrt(n)))


def _as_grid(x: Tensor, stride: int) -> Tensor:
    """(b, h, n, d) -> (b, h, rows, stride, d), zero-padded to whole rows."""
    return rearrange(pad_sequence(x, 0, -x.shape[-2] % stride), "b h (r c) d -> b h r c d", c=stride)


def _real_positions(n: int, stride: int, key_padding_mask: Tensor | None, device: torch.device) -> Tensor:
    """(b | 1, rows, stride) bool: positions inside [0, n) and not padding."""
    rows = -(-n // stride)
    inside = (torch.arange(rows * stride, device=device) < n)[None]  # (1, rows*stride)
    if key_padding_mask is not None:
        inside = (
            inside
            & pad_sequence((~key_padding_mask)[:, None, :, None].float(), 0, rows * stride - n)[:, 0, :, 0].bool()
        )
    return rearrange(inside, "b (r c) -> b r c", c=stride)


# ---- the parts, each returning its output and log-sum-exp in (b, h, n, .) order --------------------


def local_part(
    q: Tensor, k: Tensor, v: Tensor, *, stride: int, causal: bool, key_padding_mask: Tensor | None
) -> Partial:
    """The local run |i - j| <= l (causal: i - l .. i): band attention with window l."""
    b, h, n, _ = q.shape
    window = min(stride, n - 1)
    block = default_block_size(window)
    after = 0 if causal else window
    valid_keys = key_validity_windows(key_padding_mask, n, block, window, after)
    pattern = band_pattern(n, block, window, causal, q.device).restricted_to(valid_keys, h)
    part = partial_attention(
        query_blocks(q, block), key_windows(k, block, window, after), key_windows(v, block, window, after), pattern
    )
    return Partial(
        out=rearrange(part.out, "(b h) n i e -> b h (n i) e", b=b)[:, :, :n],
        lse=rearrange(part.lse, "(b h) n i -> b h (n i)", b=b)[:, :, :n],
    )


@kept_between_calls(maxsize=64)
def _column_rows(rows: int, causal: bool, exclude_local: bool, device: torch.device) -> Tensor:
    """(rows, rows) bool: which rows of the same column a query row sees."""
    offset = torch.arange(rows, device=device)[:, None] - torch.arange(rows, device=device)[None, :]
    allowed = offset >= 0 if causal else torch.ones(rows, rows, dtype=torch.bool, device=device)
    # the local run i - l .. i + l already holds the same column's keys one row away and the query's own
    return allowed & (offset.abs() > 1) if exclude_local else allowed


def column_part(
    q: Tensor, k: Tensor, v: Tensor, *, stride: int, causal: bool, key_padding_mask: Tensor | None, exclude_local: bool
) -> Partial:
    """Every j with (i - j) mod l == 0: attention along the columns of the (rows, l) grid."""
    b, h, n, _ = q.shape
    qc, kc, vc = (rearrange(_as_grid(x, stride), "b h r c d -> (b h) c r d") for x in (q, k, v))
    rows = qc.shape[-2]
    real = rearrange(_real_positions(n, stride, key_padding_mask, q.device), "b r c -> b c 1 r")  # keys
    allowed = _column_rows(rows, causal, exclude_local, q.device) & real  # (b|1, c, r, r)
    pattern = Pattern(allowed if key_padding_mask is None else expand_over_heads(allowed, h))
    part = partial_attention(qc, kc, vc, pattern)
    return Partial(
        out=rearrange(part.out, "(b h) c r e -> b h (r c) e", b=b)[:, :, :n],
        lse=rearrange(part.lse, "(b h) c r -> b h (r c)", b=b)[:, :, :n],
    )


def block_part(
    q: Tensor, k: Tensor, v: Tensor, *, stride: int, causal: bool, key_padding_mask: Tensor | None
) -> Partial:
    """Own block of l positions (causal: up to i)."""
    b, h, n, _ = q.shape
    qr, kr, vr = (rearrange(_as_grid(x, stride), "b h r c d -> (b h) r c d") for x in (q, k, v))
    inside = torch.ones(stride, stride, dtype=torch.bool, device=q.device)
    inside = inside.tril() if causal else inside
    real = _real_positions(n, stride, key_padding_mask, q.device)[:, :, None, :]  # (b|1, r, 1, c)
    allowed = inside & real
    pattern = Pattern(allowed if key_padding_mask is None else expand_over_heads(allowed, h))
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
    query_pos = torch.arange(rows * stride, device=q.device)[:, None]  # (n, 1)
    key_pos = torch.arange(rows, device=q.device)[:, None] * stride + torch.arange(
        stride - summary, stride, device=q.device
    )
    key_pos = key_pos.reshape(1, -1)  # (1, r*s)
    allowed = (
        key_pos <= query_pos
        if causal
        else torch.ones(query_pos.shape[0], key_pos.shape[1], dtype=torch.bool, device=q.device)
    )
    if exclude_own_block:
        allowed = allowed & (key_pos // stride != query_pos // stride)
    real = _real_positions(n, stride, key_padding_mask, q.device)[:, :, stride - summary :]  # (b|1, r, s)
    allowed = allowed[None] & rearrange(real, "b r s -> b 1 (r s)")  # (b|1, n, r*s)
    pattern = Pattern(allowed[:, None] if key_padding_mask is None else expand_over_heads(allowed[:, None], h))
    part = partial_attention(qs, ks, vs, pattern)
    return Partial(
        out=rearrange(part.out, "(b h) 1 n e -> b h n e", b=b)[:, :, :n],
        lse=rearrange(part.lse, "(b h) 1 n -> b h n", b=b)[:, :, :n],
    )


def strided_support(n: int, *, stride: int, pattern: str, summary: int, causal: bool) -> Tensor:
    """(2, n, n) bool: the dense pattern of the first and second part (their union is the full pattern)."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    offset = i - j
    visible = offset >= 0 if causal else torch.ones(n, n, dtype=torch.bool)
    if pattern == "strided":
        first = (offset.abs() <= stride) & visible
        second = (offset % stride == 0) & visible
    else:
        first = (i // stride == j // stride) & visible
        second = (j % stride >= stride - min(summary, stride)) & visible
    return torch.stack([first, second])


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
            second = lambda x, y, z, exclusive: summary_part(  # noqa: E731
                x, y, z, summary=self.summary, exclude_own_block=exclusive, **options
            )
        if not self.factorize:
            return combine([first(q, k, v), second(q, k, v, True)])
        if q.shape[1] < 2:
            raise UnsupportedOptionError(
                "strided with factorize=True needs at least 2 heads (even heads: the first part, odd heads: the "
                f"second); with {q.shape[1]} head the second part would be dropped"
            )
        out = q.new_zeros(*q.shape[:-1], v.shape[-1])
        even, odd = slice(0, None, 2), slice(1, None, 2)
        out[:, even] = combine([first(q[:, even], k[:, even], v[:, even])])
        out[:, odd] = combine([second(q[:, odd], k[:, odd], v[:, odd], False)])
        return out

    def _flex(self, q: Tensor, k: Tensor, v: Tensor, *, stride: int, causal: bool) -> Tensor:
        pattern, summary, factorize = self.pattern, min(self.summary, stride), self.factorize

        def strided_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            offset = q_idx - kv_idx
            if pattern == "strided":
                first, second = offset.abs() <= stride, offset % stride == 0
            else:
                first, second = q_idx // stride == kv_idx // stride, kv_idx % stride >= stride - summary
            union = (first & (h % 2 == 0)) | (second & (h % 2 == 1)) if factorize else first | second
            return union & (offset >= 0) if causal else union

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
            window = min(stride, n - 1)  # the local run i - l .. i + l, as local_part lays it out
            block = default_block_size(window)
            span = block + window + (0 if shape.causal else window)
            first = -(-n // block) * block * span  # local run: band blocks against their key windows
            second = stride * rows * rows  # columns: each row of the grid against every row
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
