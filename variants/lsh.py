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
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from attnbench.interface import (
    AttentionVariant,
    Capabilities,
    Cost,
    Hyperparameter,
    Shape,
    kept_between_calls,
    kept_on_instance,
    softmax_attention_flops,
)
from attnbench.variants.blocks import Pattern, merge_partials, partial_attention
from einops import rearrange
from torch import Tensor

EMPTY = -1  # a slot of a sorted layout that holds no position


MAX_DEFAULT_BUCKETS = 64


def default_buckets(n: int, bucket_size: int) -> int:
    """About N / bucket_size buckets as in the paper, but at most 64; even (the hash picks from [xR; -xR]).

    Hashing costs O(N * n_buckets * D): buckets growing with N would make it quadratic, so by default
    they stop at 64 (hashing then costs a quarter of the attention's matmul FLOPs at bucket_size 64, an
    eighth with shared_qk; see `cost`). Set n_buckets for the paper's N / bucket_size.
    """
    buckets = min(n // bucket_size, MAX_DEFAULT_BUCKETS)
    return 1 if buckets <= 1 else buckets + buckets % 2


HASH_BLOCK_ROWS = 2048  # positions hashed at a time: their rotations stay in cache for the argmax


def hash_buckets(x: Tensor, rotations: Tensor | None) -> Tensor:
    """(b, h, n, d) -> (b, h, r, n) bucket ids; `rotations` (d, r, buckets/2), or None for one bucket.

    argmax over [xR; -xR] without building it: the largest |xR| wins and its sign picks the half. Rows are
    rotated a block at a time, so the (rows, r, buckets/2) rotations are reduced while still in cache.
    """
    b, h, n, d = x.shape
    if rotations is None:
        return x.new_zeros(b, h, 1, n, dtype=torch.long)
    rounds, half = rotations.shape[1:]
    flat_rotations = rearrange(rotations.to(x.dtype), "d r k -> d (r k)")
    rows = rearrange(x, "b h n d -> (b h n) d")
    buckets = torch.empty(rows.shape[0], rounds, dtype=torch.long, device=x.device)
    for start in range(0, rows.shape[0], HASH_BLOCK_ROWS):
        rotated = (rows[start : start + HASH_BLOCK_ROWS] @ flat_rotations).view(-1, rounds, half)
        index = rotated.abs().max(dim=-1, keepdim=True).indices  # max beats argmax on the CPU
        negative = rotated.gather(-1, index) < 0
        buckets[start : start + HASH_BLOCK_ROWS] = (index + negative * half).squeeze(-1)
    return rearrange(buckets, "(b h n) r -> b h r n", b=b, h=h)


def global_layout(buckets: Tensor, chunk: int) -> Tensor:
    """(b, h, r, n) buckets -> (b, h, r, s) positions in (bucket, position) order, s = n rounded up to chunks."""
    order = buckets.sort(dim=-1, stable=True).indices  # stable: by position within a bucket
    return F.pad(order, (0, -buckets.shape[-1] % chunk), value=EMPTY)


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


def _gap(key_chunk: Tensor, query_chunk: Tensor, back: int, forward: int) -> Tensor:
    """How far key chunk - query chunk lies from [-back, forward]: <= back + forward exactly when inside.

    Broadcast (..., 1, j) against (..., i, 1) -> (..., i, j). In uint8 (chunk counts that leave no aliasing,
    see `_chunk_ids`) one wrapping subtraction on bytes: k - (q - back), where anything left of the range
    wraps to a large value. Otherwise |2 (k - q) + back - forward| in int16 or int32. The minimum over rounds says
    whether a pair met in any of them.
    """
    if key_chunk.dtype == torch.uint8:
        return key_chunk - (query_chunk - back)
    return (2 * key_chunk - (2 * query_chunk - back + forward)).abs_()


def gather_chunks(x: Tensor, layout: Tensor, chunk: int) -> Tensor:
    """x (b, h, n, z) in one round's sorted layout (b, h, s), as chunks ((b h), c, i, z)."""
    return rearrange(_rows(x, layout), "b h (c i) z -> (b h) c i z", i=chunk)


def gather_windows(x: Tensor, layout: Tensor, chunk: int, back: int, forward: int) -> Tensor:
    """x (b, h, n, z) sorted by one round's `layout` (b, h, s), as chunk windows ((b h), c, window, z).

    One gather writes the sorted rows with `back` and `forward` empty chunks around them, and the windows
    are a strided view of that: no second copy.
    """
    padded = F.pad(rearrange(layout, "b h (c i) -> b h c i", i=chunk), (0, 0, back, forward), value=EMPTY)
    gathered = rearrange(_rows(x, padded), "b h c i z -> (b h) (c i) z")
    windows = gathered.unfold(1, (back + 1 + forward) * chunk, chunk)  # (x, c, z, window)
    return rearrange(windows, "x c z j -> x c j z")


@kept_between_calls(maxsize=32)
def window_slots(chunks: int, chunk: int, back: int, forward: int, device: torch.device) -> Tensor:
    """(c, 1, j): the layout slot of each key of each chunk's window (negative or past the end: outside)."""
    span = (back + 1 + forward) * chunk
    return (torch.arange(chunks, device=device)[:, None, None] - back) * chunk + torch.arange(span, device=device)


@kept_between_calls(maxsize=32)
def _own_chunk_bias(chunk: int, back: int, forward: int, shared_qk: bool, dtype: torch.dtype, device: torch.device):
    """(i, j): 0, or -inf where a shared-QK query meets itself (its own slot in its own chunk of the window)."""
    bias = torch.zeros(chunk, (back + 1 + forward) * chunk, dtype=dtype, device=device)
    if shared_qk:
        own = torch.arange(chunk, device=device)
        bias[own, back * chunk + own] = float("-inf")
    return bias


@kept_between_calls(maxsize=32)
def _global_base_bias(
    n: int, slots: int, chunk: int, back: int, forward: int, shared_qk: bool, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """(1, c, i, j) bias of a global layout without padding: the same in every round and call of this size."""
    real = window_slots(slots // chunk, chunk, back, forward, device)
    real = (real >= 0) & (real < n)  # (c, 1, j)
    return torch.where(real, _own_chunk_bias(chunk, back, forward, shared_qk, dtype, device), float("-inf"))[None]


@dataclass
class SortedRounds:
    """One call's hash rounds: where each position sits in each round's sorted layout, and its bucket."""

    query_layout: Tensor  # (b, h, r, s) position at each slot, EMPTY where none
    key_layout: Tensor  # (b, h, r, s); the same tensor when queries and keys share one order
    query_slot: Tensor  # (b, h, r, n) the inverse: slot of each position
    key_slot: Tensor  # (b, h, r, n)
    buckets: Tensor | None  # (b, h, r, n) for per-bucket (causal) layouts, whose chunks hold one bucket each
    chunk_ids: tuple[Tensor, Tensor] | None = None  # ((b h), r, n) chunk of each query and key position, per round

    @property
    def rounds(self) -> int:
        return self.query_layout.shape[2]


GAUSSIAN_SAMPLE = 8192  # inputs hashed to estimate bucket probabilities for `per_bucket_chunks`
LAYOUT_DRAWS = 256  # layouts per round drawn from them


def per_bucket_chunks(n: int, sample_buckets: Tensor, n_buckets: int, chunk: int, layouts: int) -> float:
    """Estimated chunks of a call's per-bucket (causal) layouts, which it pads to the fullest; for `cost`.

    A layout holds sum over buckets of ceil(count / chunk) chunks, and the counts depend on the data. Each
    round's bucket probabilities are read from `sample_buckets` (r, samples), the buckets of sample inputs;
    LAYOUT_DRAWS layouts of n positions are drawn from them per round, and the fullest of a round's
    `layouts` (b * h) is read as their layouts / (layouts + 1) quantile.
    """
    probabilities = torch.stack([torch.bincount(b, minlength=n_buckets) for b in sample_buckets]).double()
    probabilities /= sample_buckets.shape[-1]  # (r, buckets)
    mass_left = 1 - probabilities.cumsum(dim=-1) + probabilities  # before each bucket
    conditional = (probabilities / mass_left.clamp(min=1e-12)).clamp(max=1.0)
    generator = torch.Generator().manual_seed(0)
    left = torch.full((len(probabilities), LAYOUT_DRAWS), float(n), dtype=torch.float64)
    chunks = torch.zeros_like(left)
    for bucket in range(n_buckets):  # a multinomial draw, one bucket at a time
        count = torch.binomial(left, conditional[:, bucket, None].expand_as(left).contiguous(), generator=generator)
        chunks += torch.ceil(count / chunk)
        left -= count
    return float(torch.quantile(chunks, layouts / (layouts + 1), dim=-1).max())


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

    @kept_on_instance
    def rotations(self, head_dim: int, buckets: int, device: torch.device) -> Tensor | None:
        """(d, n_hashes, buckets/2) Gaussian rotations drawn from the seed; None for a single bucket."""
        if buckets == 1:
            return None
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randn(head_dim, self.n_hashes, buckets // 2, generator=generator).to(device)

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
        b, n = q.shape[0], q.shape[2]
        chunk, back, forward = self.bucket_size, self.look_backward, self.look_forward
        with torch.no_grad():
            sorted_rounds = self._sort(q, k, causal)
            if sorted_rounds.rounds > 1:
                sorted_rounds.chunk_ids = self._chunk_ids(sorted_rounds)
        keys = F.normalize(q, dim=-1) if self.shared_qk else k
        outs, lses = [], []
        for r in range(sorted_rounds.rounds):  # one round at a time: memory O(N * bucket_size), not x rounds
            with torch.no_grad():
                pattern = self._pattern(sorted_rounds, r, n, q.dtype, causal, key_padding_mask)
            part = partial_attention(
                gather_chunks(q, sorted_rounds.query_layout[:, :, r], chunk),  # ((b h), c, i, d)
                gather_windows(keys, sorted_rounds.key_layout[:, :, r], chunk, back, forward),  # ((b h), c, j, d)
                gather_windows(v, sorted_rounds.key_layout[:, :, r], chunk, back, forward),  # ((b h), c, j, e)
                pattern,
            )
            # back to original positions: out[p] = out_sorted[slot[p]]
            slot = sorted_rounds.query_slot[:, :, r]  # (b, h, n)
            outs.append(_rows(rearrange(part.out, "(b h) c i e -> b h (c i) e", b=b), slot))
            lses.append(rearrange(part.lse, "(b h) c i -> b h (c i)", b=b).gather(2, slot))
        lse = torch.stack(lses)  # (r, b, h, n)
        result = merge_partials(outs, lse)  # one softmax over the union of the rounds' supports
        if self.shared_qk:  # a real token that sees nothing else in any round attends to itself alone
            alone = torch.isinf(lse).all(dim=0)  # (b, h, n)
            if key_padding_mask is not None:  # a padding token is no key, not even its own: it outputs zeros
                alone = alone & ~key_padding_mask[:, None, :]
            if bool(alone.any()):
                result = torch.where(alone[..., None], v, result)
        return result

    def _sort(self, q: Tensor, k: Tensor, causal: bool) -> SortedRounds:
        """Hash queries and keys and lay each round out in (bucket, position) order."""
        n, chunk = q.shape[2], self.bucket_size
        n_buckets = self.n_buckets or default_buckets(n, chunk)
        rotations = self.rotations(q.shape[-1], n_buckets, q.device)
        # shared-QK keys are normalized queries: same buckets, as a rotation's argmax ignores the norm
        query_buckets = hash_buckets(q, rotations)  # (b, h, r, n)
        if causal:
            layout = per_bucket_layout(query_buckets, n_buckets, chunk)
            slot = slot_of_position(layout, n)
            return SortedRounds(layout, layout, slot, slot, query_buckets)
        query_layout = global_layout(query_buckets, chunk)
        query_slot = slot_of_position(query_layout, n)
        if self.shared_qk:
            return SortedRounds(query_layout, query_layout, query_slot, query_slot, None)
        key_layout = global_layout(hash_buckets(k, rotations), chunk)
        return SortedRounds(query_layout, key_layout, query_slot, slot_of_position(key_layout, n), None)

    def _pattern(
        self,
        sorted_rounds: SortedRounds,
        r: int,
        n: int,
        dtype: torch.dtype,
        causal: bool,
        key_padding_mask: Tensor | None,
    ) -> Pattern:
        """Which windowed keys each sorted query of round r sees, as the kernel's float bias ((b h), c, i, j).

        A pair that already met in an earlier round is left out, so the union counts it once. Round 0 of a
        global layout without padding needs no per-call mask: its bias is one cached (1, c, i, j) pattern.
        """
        base = self._base_bias(sorted_rounds, r, n, dtype, causal, key_padding_mask)
        if r == 0:
            return Pattern(bias=base)
        chunk, back, forward = self.bucket_size, self.look_backward, self.look_forward
        query_at = self._query_positions(sorted_rounds.query_layout[:, :, r]).clamp(min=0)  # ((b h), c, i, 1)
        key_at = self._window_positions(sorted_rounds.key_layout[:, :, r]).clamp(min=0)  # ((b h), c, 1, j)
        query_chunk, key_chunk = sorted_rounds.chunk_ids
        gap = None
        for earlier in range(r):  # did the pair share a window in an earlier round?
            gap_then = _gap(
                _lookup(key_chunk[:, earlier], key_at), _lookup(query_chunk[:, earlier], query_at), back, forward
            )
            gap = gap_then if gap is None else torch.minimum(gap, gap_then, out=gap)
        full = (query_at.shape[0], query_at.shape[1], chunk, key_at.shape[-1])
        bias = torch.where(gap <= back + forward, torch.tensor(float("-inf"), dtype=dtype), base.expand(full))
        return Pattern(bias=bias)

    def _base_bias(
        self,
        sorted_rounds: SortedRounds,
        r: int,
        n: int,
        dtype: torch.dtype,
        causal: bool,
        key_padding_mask: Tensor | None,
    ) -> Tensor:
        """Round r's bias before de-duplication: real keys only (not padding, not empty slots), causal and
        within the bucket for per-bucket layouts, and no self-attention in shared-QK mode."""
        chunk, back, forward = self.bucket_size, self.look_backward, self.look_forward
        slots = sorted_rounds.key_layout.shape[-1]
        device = sorted_rounds.key_layout.device
        if not causal and key_padding_mask is None:  # global layout: slots [0, n) hold the positions
            return _global_base_bias(n, slots, chunk, back, forward, self.shared_qk, dtype, device)
        key_pos = self._window_positions(sorted_rounds.key_layout[:, :, r])  # ((b h), c, 1, j)
        allowed = key_pos != EMPTY
        if key_padding_mask is not None:
            b, h = sorted_rounds.key_layout.shape[:2]
            batch_of_row = torch.arange(b, device=device).repeat_interleave(h)
            allowed = allowed & ~key_padding_mask[batch_of_row[:, None, None, None], key_pos.clamp(min=0)]
        if causal:
            query_pos = self._query_positions(sorted_rounds.query_layout[:, :, r])  # ((b h), c, i, 1)
            bucket_at = rearrange(sorted_rounds.buckets[:, :, r], "b h n -> (b h) n")
            same_bucket = _lookup(bucket_at, key_pos.clamp(min=0)) == _lookup(bucket_at, query_pos.clamp(min=0))
            allowed = allowed & (key_pos <= query_pos) & same_bucket
        return torch.where(allowed, _own_chunk_bias(chunk, back, forward, self.shared_qk, dtype, device), float("-inf"))

    def _query_positions(self, layout: Tensor) -> Tensor:
        """(b, h, s) one round's layout -> ((b h), c, i, 1): the position at each query slot of each chunk."""
        return rearrange(layout, "b h (c i) -> (b h) c i 1", i=self.bucket_size)

    def _window_positions(self, layout: Tensor) -> Tensor:
        """(b, h, s) one round's layout -> ((b h), c, 1, j): the position at each slot of each chunk's window."""
        windows = chunk_windows(self._query_positions(layout), self.look_backward, self.look_forward, fill=EMPTY)
        return rearrange(windows, "x c j 1 -> x c 1 j")

    def _chunk_ids(self, sorted_rounds: SortedRounds) -> tuple[Tensor, Tensor]:
        """((b h), r, n) chunk of each position in each round, for queries and keys, in `_gap`'s dtype.

        In per-bucket layouts a bucket's index times max(back, forward) is added, so chunks of different
        buckets are never within [-back, forward] of each other: they never shared a window.
        """
        chunk, back, forward = self.bucket_size, self.look_backward, self.look_forward

        def ids(slot: Tensor) -> Tensor:
            chunk_of = slot // chunk
            if sorted_rounds.buckets is not None:
                chunk_of = chunk_of + sorted_rounds.buckets * max(back, forward)
            return rearrange(chunk_of, "b h r n -> (b h) r n")

        query_ids = ids(sorted_rounds.query_slot)
        key_ids = query_ids if sorted_rounds.key_slot is sorted_rounds.query_slot else ids(sorted_rounds.key_slot)
        top = max(int(query_ids.max()), int(key_ids.max())) + 1
        if top + max(back, forward) <= 256:  # bytes wrap without aliasing
            dtype = torch.uint8
        else:  # |2 (k - q) + back - forward| must fit
            dtype = torch.int16 if 2 * top + back + forward < 2**15 else torch.int32
        return query_ids.to(dtype), key_ids.to(dtype)

    def cost(self, shape: Shape) -> Cost:
        s, chunk = shape, self.bucket_size
        bh = s.batch * s.heads
        n_buckets = self.n_buckets or default_buckets(s.n_q, chunk)
        rounds = self.n_hashes if n_buckets > 1 else 1  # one bucket: one round, nothing to hash
        if s.causal:  # each bucket chunked apart: the layout depends on the data, estimated for Gaussian inputs
            sample = torch.randn(1, 1, GAUSSIAN_SAMPLE, s.head_dim, generator=torch.Generator().manual_seed(0))
            sample_buckets = hash_buckets(sample, self.rotations(s.head_dim, n_buckets, sample.device))[0, 0]
            slots = per_bucket_chunks(s.n_q, sample_buckets, n_buckets, chunk, bh) * chunk
        else:
            slots = -(-s.n_q // chunk) * chunk
        window = chunk * (1 + self.look_backward + self.look_forward)
        pairs = bh * rounds * slots * window  # every chunk against its whole window, masked keys included
        attention, softmax = softmax_attention_flops(pairs, s)
        hashed = s.n_q if self.shared_qk else s.n_q + s.n_k  # keys sorted apart are hashed too
        hashing = 2 * bh * hashed * s.head_dim * rounds * (n_buckets // 2)  # rows times (d, rounds * buckets/2)
        sort_flops = bh * rounds * hashed * math.log2(max(s.n_q, 2))
        gathered = bh * rounds * slots * (2 * s.head_dim + s.value_dim)
        io = gathered * (1 + 1 + self.look_backward + self.look_forward) * s.dtype_bytes
        # a round's float bias, byte gaps and met flags and gathered windows; every round's output
        per_round = (pairs * (s.dtype_bytes + 2) + io) / rounds
        outputs = bh * rounds * s.n_q * (s.value_dim + 1) * s.dtype_bytes
        return Cost(
            flops=attention + hashing + softmax + sort_flops,
            bytes_moved=io,
            # rounds run one at a time, but a round's buffers are made before the last one's are freed (measured
            # peaks reached 2.5x a single round's at N = 2^20)
            working_bytes=2 * per_round + outputs,
            matmul_flops=attention + hashing,
            # autograd keeps every round's buffers, and the weights and their gradient, for the backward
            backward_working_bytes=rounds * per_round + 2 * pairs * s.dtype_bytes + outputs,
        )
