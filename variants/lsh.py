"""Reformer-style LSH attention (Kitaev, Kaiser, Levskaya 2020): angular hashing, sort, chunk, combine.

For each of `n_hashes` rounds, positions are hashed by a random rotation R (from the seed):
bucket = argmax([xR; -xR]) over `n_buckets`. Queries and keys are sorted by (bucket, position), cut into
chunks of `bucket_size`, and each query chunk attends to the key chunk of the same index plus
`look_backward` chunks before and `look_forward` after (no wrap-around), masked by original positions.
Rounds are merged by their log-sum-exp, a pair that meets in several rounds kept only in the first:
the result is exactly the softmax over the union of the rounds' supports, each key counted once.

Causal attention must not depend on later tokens at all. With one global sort it would: a later token's
bucket shifts every chunk boundary after its bucket, and so which earlier keys share a chunk. Causal
attention therefore chunks each bucket separately (a bucket's chunks start at a chunk boundary; slots
left over are empty) and attends only within the bucket, so a token's support depends only on earlier
tokens. Queries and keys then need one order: causal is supported with `shared_qk=True`.

Modes: `shared_qk=True` is Reformer proper (keys are the normalized queries; the given k is ignored; a
token attends to itself only when nothing else is available). `shared_qk=False` hashes queries and keys
with the same rotations and sorts them separately: the mode that approximates a given (Q, K).

Cost per round: O(N * bucket_size * (1 + look_backward + look_forward) * D) plus a sort and the hash,
O(N * n_buckets * D); never N x N. Backward flows through the attention, not through the hashing.

b - batch, h - heads, r - hash round, n - position, s - slot in sorted layout, c - chunk, i - query in
chunk, j - key in window, d - head dim, e - value dim
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from attnbench.interface import AttentionVariant, Capabilities, Cost, Hyperparameter, Shape
from attnbench.variants.blocks import Partial, Pattern, combine, partial_attention
from einops import einsum, rearrange
from torch import Tensor

EMPTY = -1  # a slot of a sorted layout that holds no position


MAX_DEFAULT_BUCKETS = 64


def default_buckets(n: int, bucket_size: int) -> int:
    """About N / bucket_size buckets as in the paper, but at most 64; even (the hash picks from [xR; -xR]).

    Hashing costs O(N * n_buckets * D): buckets growing with N would make it quadratic, so by default
    they stop at 64 (hashing then costs about half the attention). Set n_buckets for the paper's N / bucket_size.
    """
    buckets = min(n // bucket_size, MAX_DEFAULT_BUCKETS)
    return 1 if buckets <= 1 else buckets + buckets % 2


def hash_buckets(x: Tensor, rotations: Tensor | None) -> Tensor:
    """(b, h, n, d) -> (b, h, r, n) bucket ids; `rotations` (d, r, buckets/2), or None for one bucket.

    argmax over [xR; -xR] without building it: the larger of max(xR) and -min(xR) wins.
    """
    if rotations is None:
        return x.new_zeros(x.shape[0], x.shape[1], 1, x.shape[2], dtype=torch.long)
    rotated = einsum(x, rotations.to(x.dtype), "b h n d, d r k -> b h r n k")
    index = rotated.abs().argmax(dim=-1, keepdim=True)  # the largest |xR| wins; its sign picks the half
    negative = rotated.gather(-1, index) < 0
    return (index + negative * rotated.shape[-1]).squeeze(-1)


def global_layout(buckets: Tensor, chunk: int) -> Tensor:
    """(b, h, r, n) buckets -> (b, h, r, s) positions in (bucket, position) order, s = n rounded up to chunks."""
    n = buckets.shape[-1]
    positions = torch.arange(n, device=buckets.device)
    order = (buckets * n + positions).argsort(dim=-1)
    return F.pad(order, (0, -n % chunk), value=EMPTY)


def per_bucket_layout(buckets: Tensor, n_buckets: int, chunk: int) -> Tensor:
    """(b, h, r, n) -> (b, h, r, s): each bucket's positions in order, starting on a chunk boundary.

    A position's slot depends only on its bucket and on the earlier positions of that bucket.
    """
    n = buckets.shape[-1]
    codes, order = (buckets * n + torch.arange(n, device=buckets.device)).sort(dim=-1)
    counts = torch.zeros(*buckets.shape[:-1], n_buckets, dtype=torch.long, device=buckets.device)
    counts.scatter_add_(-1, buckets, torch.ones_like(buckets))
    chunks = -(-counts // chunk)
    first_sorted = counts.cumsum(-1) - counts  # where each bucket starts in sorted order
    first_slot = (chunks.cumsum(-1) - chunks) * chunk  # where it starts in the layout
    sorted_bucket = codes // n
    rank = torch.arange(n, device=buckets.device) - first_sorted.gather(-1, sorted_bucket)
    slot = first_slot.gather(-1, sorted_bucket) + rank
    slots = int(chunks.sum(-1).max()) * chunk
    return torch.full((*buckets.shape[:-1], slots), EMPTY, device=buckets.device).scatter_(-1, slot, order)


def slot_of_position(layout: Tensor, n: int) -> Tensor:
    """(b, h, r, s) layout -> (b, h, r, n): the slot each position occupies (the inverse permutation)."""
    slots = torch.arange(layout.shape[-1], device=layout.device).expand_as(layout)
    target = torch.where(layout == EMPTY, n, layout)
    inverse = torch.empty(*layout.shape[:-1], n + 1, dtype=torch.long, device=layout.device)
    return inverse.scatter_(-1, target, slots)[..., :n]


def chunk_windows(x: Tensor, back: int, forward: int, fill: float | int = 0) -> Tensor:
    """(x, c, i, z) -> (x, c, (back + 1 + forward) * i, z): each chunk with its neighbours (no wrap).

    A strided view of one padded copy: neighbouring windows share memory.
    """
    chunk = x.shape[-2]
    padded = F.pad(x, (0, 0, 0, 0, back, forward), value=fill)  # (x, back + c + forward, i, z)
    flat = rearrange(padded, "x c i z -> x (c i) z")
    windows = flat.unfold(1, (back + 1 + forward) * chunk, chunk)  # (x, c, z, window)
    return rearrange(windows, "x c z j -> x c j z")


def _lookup(table: Tensor, positions: Tensor) -> Tensor:
    """table (bh, n) read at positions (bh, ...) -> (bh, ...)."""
    return table.gather(1, positions.reshape(positions.shape[0], -1)).view(positions.shape)


def _rows(x: Tensor, index: Tensor) -> Tensor:
    """Rows of x (b, h, n, z) at `index` (b, h, ...) of positions -> (b, h, ..., z), one index_select.

    An EMPTY slot reads row 0: what it holds never counts, as its key is masked and its query dropped.
    """
    b, h, n, z = x.shape
    base = torch.arange(b * h, device=x.device).view(b, h, *[1] * (index.dim() - 2)) * n
    flat = index.clamp(min=0) + base
    return x.reshape(b * h * n, z).index_select(0, flat.reshape(-1)).view(*index.shape, z)


def gather_chunks(x: Tensor, layout: Tensor, chunk: int) -> Tensor:
    """x (b, h, n, z) in a round's sorted layout (b, h, r, s), as chunks ((b h r), c, i, z)."""
    return rearrange(_rows(x, layout), "b h r (c i) z -> (b h r) c i z", i=chunk)


def gather_windows(x: Tensor, layout: Tensor, chunk: int, back: int, forward: int) -> Tensor:
    """x (b, h, n, z) sorted by `layout` (b, h, r, s), as chunk windows ((b h r), c, window, z).

    One gather writes the sorted rows with `back` and `forward` empty chunks around them, and the windows
    are a strided view of that: no second copy.
    """
    padded = F.pad(rearrange(layout, "b h r (c i) -> b h r c i", i=chunk), (0, 0, back, forward), value=EMPTY)
    gathered = rearrange(_rows(x, padded), "b h r c i z -> (b h r) (c i) z")
    windows = gathered.unfold(1, (back + 1 + forward) * chunk, chunk)  # (x, c, z, window)
    return rearrange(windows, "x c z j -> x c j z")


class LSHAttention(AttentionVariant):
    """Multi-round angular-LSH attention with exact union-of-rounds normalization."""

    name = "lsh"
    family = "lsh"
    exact = False
    supports = Capabilities(
        cross_attention=False,
        subquadratic_memory=True,
        notes={"cross_attention": "query chunks are paired with key chunks of the same index; use Nq == Nk"},
    )
    hyperparameters = {
        "bucket_size": Hyperparameter(64, "chunk length after sorting (Reformer's bucket size)", minimum=1),
        "n_hashes": Hyperparameter(4, "hash rounds; more rounds, larger union, smaller error", minimum=1),
        "n_buckets": Hyperparameter(
            None, "buckets per round, even or 1 (default: min(N / bucket_size, 64))", minimum=1, optional=True
        ),
        "shared_qk": Hyperparameter(False, "Reformer's shared-QK: keys are the normalized queries", kind=bool),
        "look_backward": Hyperparameter(1, "earlier chunks each query chunk also attends to", minimum=0),
        "look_forward": Hyperparameter(0, "later chunks each query chunk also attends to", minimum=0),
    }

    @classmethod
    def validate_hyperparams(cls, hyperparams: dict[str, Any]) -> list[str]:
        problems = super().validate_hyperparams(hyperparams)
        buckets = hyperparams.get("n_buckets")
        if isinstance(buckets, int) and buckets > 1 and buckets % 2:
            problems.append(f"n_buckets: {buckets} must be even or 1 (the hash picks from [xR; -xR])")
        return problems

    def __init__(self, seed: int = 0, **hyperparams: Any) -> None:
        super().__init__(seed=seed, **hyperparams)
        self._rotations: dict[tuple, Tensor] = {}

    def rotations(self, head_dim: int, buckets: int, device: torch.device) -> Tensor | None:
        """(d, n_hashes, buckets/2) Gaussian rotations drawn from the seed; None for a single bucket."""
        if buckets == 1:
            return None
        key = (head_dim, buckets, str(device))
        if key not in self._rotations:
            generator = torch.Generator().manual_seed(self.seed)
            rotation = torch.randn(head_dim, self.n_hashes, buckets // 2, generator=generator)
            self._rotations[key] = rotation.to(device)
        return self._rotations[key]

    @property
    def reads_keys(self) -> bool:
        return not self.shared_qk

    def unsupported_reason(self, **options: Any) -> str | None:
        reason = super().unsupported_reason(**options)
        if reason is None and options.get("causal") and not self.shared_qk:
            reason = (
                "lsh with shared_qk=False does not support causal attention: queries and keys sorted apart "
                "would let later keys move chunk boundaries; use shared_qk=True"
            )
        return reason

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        b, h, n, _ = q.shape
        chunk, back, forward = self.bucket_size, self.look_backward, self.look_forward
        n_buckets = self.n_buckets or default_buckets(n, chunk)
        rotations = self.rotations(q.shape[-1], n_buckets, q.device)
        with torch.no_grad():
            # shared-QK keys are normalized queries: same buckets, as a rotation's argmax ignores the norm
            query_buckets = hash_buckets(q, rotations)  # (b, h, r, n)
            key_buckets = query_buckets if self.shared_qk else hash_buckets(k, rotations)
            if causal:
                query_layout = key_layout = per_bucket_layout(query_buckets, n_buckets, chunk)
            else:
                query_layout = global_layout(query_buckets, chunk)
                key_layout = query_layout if self.shared_qk else global_layout(key_buckets, chunk)
            pattern = self._pattern(
                query_layout, key_layout, n, causal, key_padding_mask, query_buckets if causal else None
            )

        queries = gather_chunks(q, query_layout, chunk)  # ((b h r), c, i, d)
        values = gather_windows(v, key_layout, chunk, back, forward)  # ((b h r), c, j, e)
        if self.shared_qk:
            keys = chunk_windows(F.normalize(queries, dim=-1), back, forward)
        else:
            keys = gather_windows(k, key_layout, chunk, back, forward)
        part = partial_attention(queries, keys, values, pattern)  # sorted order, per round

        # back to original positions: out[p] = out_sorted[slot[p]]
        slot = slot_of_position(query_layout, n)  # (b, h, r, n)
        out = rearrange(part.out, "(b h r) c i e -> b (h r) (c i) e", b=b, h=h)
        out = rearrange(_rows(out, rearrange(slot, "b h r n -> b (h r) n")), "b (h r) n e -> b h r n e", h=h)
        lse = rearrange(part.lse, "(b h r) c i -> b h r (c i)", b=b, h=h).gather(3, slot)
        result = combine([Partial(out=out[:, :, r], lse=lse[:, :, r]) for r in range(out.shape[2])])
        if self.shared_qk:  # a token that sees nothing else in any round attends to itself alone
            alone = torch.isinf(lse).all(dim=2)[..., None]  # (b, h, n, 1)
            result = torch.where(alone, v, result)
        return result

    def _pattern(
        self,
        query_layout: Tensor,
        key_layout: Tensor,
        n: int,
        causal: bool,
        key_padding_mask: Tensor | None,
        buckets: Tensor | None,
    ) -> Pattern:
        """Which windowed keys each sorted query sees; a pair met in an earlier round is left out (counted once).

        With `buckets` (per-bucket layouts) a query sees only keys of its own bucket.
        """
        b, h, rounds, _ = query_layout.shape
        chunk, back, forward = self.bucket_size, self.look_backward, self.look_forward
        as_chunks = lambda t: rearrange(t, "b h r (c i) -> (b h r) c i 1", i=chunk)  # noqa: E731
        query_pos = as_chunks(query_layout)  # (x, c, i, 1)
        key_pos = rearrange(chunk_windows(as_chunks(key_layout), back, forward, fill=EMPTY), "x c j 1 -> x c 1 j")
        allowed = key_pos != EMPTY
        if key_padding_mask is not None:
            batch_of_row = torch.arange(b, device=key_pos.device).repeat_interleave(h * rounds)
            allowed = allowed & ~key_padding_mask[batch_of_row[:, None, None, None], key_pos.clamp(min=0)]
        if causal:
            allowed = allowed & (key_pos <= query_pos)
        if buckets is not None:
            bucket_at = rearrange(buckets, "b h r n -> (b h r) n")
            allowed = allowed & (_lookup(bucket_at, key_pos.clamp(min=0)) == _lookup(bucket_at, query_pos.clamp(min=0)))
        if self.shared_qk:  # itself only when nothing else is seen (see forward); with one order for queries
            # and keys, a query meets itself only in its own chunk's slot of the window: a fixed diagonal
            own_slot = torch.arange(chunk, device=key_pos.device)
            not_self = torch.ones(chunk, key_pos.shape[-1], dtype=torch.bool, device=key_pos.device)
            not_self[own_slot, back * chunk + own_slot] = False
            allowed = allowed & not_self
        if rounds > 1:
            allowed = self._first_meetings(
                allowed.expand(-1, -1, chunk, -1).clone(), query_layout, key_layout, query_pos, key_pos, n, buckets
            )
        return Pattern(allowed)

    def _first_meetings(
        self,
        allowed: Tensor,
        query_layout: Tensor,
        key_layout: Tensor,
        query_pos: Tensor,
        key_pos: Tensor,
        n: int,
        buckets: Tensor | None,
    ) -> Tensor:
        """Clear, in round r, every pair that also meets in a round before r: the union counts each pair once."""
        rounds, slots = query_layout.shape[2], query_layout.shape[3]
        chunk = self.bucket_size
        index_type = torch.int16 if slots // chunk < 2**15 - 2 else torch.int32
        # chunk of every position in every round, by position: ((b h), r, n)
        chunk_of = lambda layout: rearrange(slot_of_position(layout, n) // chunk, "b h r n -> (b h) r n").to(index_type)  # noqa: E731
        query_chunk = chunk_of(query_layout)
        key_chunk = query_chunk if key_layout is query_layout else chunk_of(key_layout)
        bucket_of = None if buckets is None else rearrange(buckets, "b h r n -> (b h) r n")
        by_round = lambda t: rearrange(t, "(bh r) c i j -> bh r c i j", r=rounds)  # noqa: E731
        allowed_r, query_r, key_r = by_round(allowed), by_round(query_pos.clamp(min=0)), by_round(key_pos.clamp(min=0))
        for earlier in range(rounds - 1):
            later = slice(earlier + 1, None)
            q_chunk = _lookup(query_chunk[:, earlier], query_r[:, later])  # (bh, r', c, i, 1)
            k_chunk = _lookup(key_chunk[:, earlier], key_r[:, later])  # (bh, r', c, 1, j)
            # k - q in [-back, forward], as one unsigned comparison: negatives wrap to large values
            met = (k_chunk - (q_chunk - self.look_backward)).to(torch.uint8) <= self.look_backward + self.look_forward
            if bucket_of is not None:
                met &= _lookup(bucket_of[:, earlier], key_r[:, later]) == _lookup(
                    bucket_of[:, earlier], query_r[:, later]
                )
            allowed_r[:, later].masked_fill_(met, False)
        return allowed

    def cost(self, shape: Shape) -> Cost:
        chunk = self.bucket_size
        window = chunk * (1 + self.look_backward + self.look_forward)
        padded = -(-shape.n_q // chunk) * chunk
        pairs = shape.batch * shape.heads * self.n_hashes * padded * window
        sort_flops = shape.batch * shape.heads * self.n_hashes * padded * math.log2(max(padded, 2))
        flops = 2 * pairs * (shape.head_dim + shape.value_dim) + 5 * pairs + sort_flops
        gathered = shape.batch * shape.heads * self.n_hashes * padded * (2 * shape.head_dim + shape.value_dim)
        io = gathered * (1 + 1 + self.look_backward + self.look_forward) * shape.dtype_bytes
        working = pairs * (4 + 2 + 1 + 4) + io  # offset, count, allowed, bias; gathered windows
        return Cost(flops=flops, bytes_moved=io, working_bytes=working)
