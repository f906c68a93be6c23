"""BigBird (Zaheer et al., 2020, "Big Bird: Transformers for Longer Sequences", §2 and App. D, BigBird-ITC).

The sequence is cut into blocks of `block_size`; attention is exact softmax on a block-sparse support:
- window: each query block sees the `window_blocks` key blocks centred on it (3: itself and one each side);
- global: the first `global_blocks` // 2 + (odd) and last `global_blocks` // 2 blocks (2: the first and the last, as
  BigBird-ITC makes global the first and last tokens) are seen by every query and see every key;
- random: each query block sees `random_blocks` more key blocks (3), drawn without replacement from the blocks not
  already in its window or global set, from the seed (the same blocks for a given seed and N).

Computed without an N x N tensor: each non-global query block gathers its key blocks (at most window + global +
random of them) and runs the fused SDPA kernel on them, duplicates and out-of-range blocks masked; the global query
blocks attend to every key (global rows x N scores). Causal attention is not defined here (the paper's decoder uses
full attention), so it is refused.

b - batch, h - heads, q - query block, s - slot (a key block of a query block), i/j - position in a block,
d - head dim, e - value dim
"""

from __future__ import annotations

import torch
from attnbench.interface import (
    AttentionVariant,
    Capabilities,
    Cost,
    Hyperparameter,
    Shape,
    kept_between_calls,
    softmax_attention_flops,
)
from attnbench.variants.blocks import (
    Partial,
    Pattern,
    all_pairs,
    combine,
    expand_over_heads,
    key_windows,
    partial_attention,
    pattern_attention,
    query_blocks,
    real_key_blocks,
)
from attnbench.variants.window import unblocked
from einops import rearrange
from torch import Tensor


def global_block_ids(blocks: int, count: int) -> list[int]:
    """The global blocks: the first ceil(count / 2) and the last floor(count / 2) (2: the first and the last)."""
    first = list(range(min((count + 1) // 2, blocks)))
    last = list(range(max(blocks - count // 2, len(first)), blocks))
    return first + last


def window_block_ids(query: int, window: int, blocks: int) -> list[int]:
    """The `window` key blocks centred on query block `query` (3: one each side), inside the sequence."""
    start = query - window // 2
    return [block for block in range(start, start + window) if 0 <= block < blocks]


@kept_between_calls(maxsize=64)
def random_block_ids(
    blocks: int, window: int, global_count: int, random_count: int, seed: int
) -> tuple[Tensor, Tensor]:
    """(q, r) random key block ids per query block and (q, r) validity: drawn without replacement from the blocks
    outside its window and the global set, by a generator seeded by `seed` (reproducible for a seed and N); fewer
    when fewer remain (the unused slots point at block 0 and are invalid)."""
    generator = torch.Generator().manual_seed(seed)
    glob = set(global_block_ids(blocks, global_count))
    ids = torch.zeros(blocks, random_count, dtype=torch.long)
    valid = torch.zeros(blocks, random_count, dtype=torch.bool)
    for query in range(blocks):
        taken = glob | set(window_block_ids(query, window, blocks))
        pool = torch.tensor([block for block in range(blocks) if block not in taken], dtype=torch.long)
        picks = pool[torch.randperm(len(pool), generator=generator)[:random_count]].sort().values
        ids[query, : len(picks)], valid[query, : len(picks)] = picks, True
    return ids, valid


class BigBirdAttention(AttentionVariant):
    """Block-sparse attention: window, global and random key blocks per query block."""

    name = "bigbird"
    family = "block-sparse"
    exact = True
    supports = Capabilities(
        causal=False,
        cross_attention=False,
        subquadratic_memory=True,
        notes={
            "causal": "BigBird's block-sparse pattern is bidirectional (its decoder uses full attention)",
            "cross_attention": "blocks are cut from the positions of one sequence; use Nq == Nk",
        },
    )
    hyperparameters = {
        "block_size": Hyperparameter(64, "tokens per block (the paper's 64)", minimum=1),
        "window_blocks": Hyperparameter(3, "key blocks in each query block's window, centred on it (3)", minimum=1),
        "global_blocks": Hyperparameter(2, "global blocks: the first and the last (2); 0 for none", minimum=0),
        "random_blocks": Hyperparameter(3, "random key blocks per query block, from the seed (3)", minimum=0),
    }

    def size(self, n: int) -> int:
        """The block size for a sequence of n: `block_size`, clipped to n (one block is then dense attention)."""
        return min(self.block_size, n)

    def layout(self, n: int) -> tuple[int, list[int], Tensor, Tensor]:
        """(blocks, global block ids, random block ids (q, r), their validity (q, r)) for a sequence of n."""
        blocks = -(-n // self.size(n))
        ids, valid = random_block_ids(blocks, self.window_blocks, self.global_blocks, self.random_blocks, self.seed)
        return blocks, global_block_ids(blocks, self.global_blocks), ids, valid

    def support_mask(self, n_q: int, n_k: int, causal: bool) -> Tensor:
        blocks, glob, ids, valid = self.layout(n_k)
        block_pairs = torch.zeros(blocks, blocks, dtype=torch.bool)
        for query in range(blocks):
            block_pairs[query, window_block_ids(query, self.window_blocks, blocks)] = True
        block_pairs[:, glob] = True  # every query sees the global blocks
        block_pairs[glob, :] = True  # and they see every key
        block_pairs[torch.arange(blocks)[:, None].expand_as(ids)[valid], ids[valid]] = True
        i, j = all_pairs(n_q, n_k)
        return block_pairs[i // self.size(n_k), j // self.size(n_k)]

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        b, h, n, _ = q.shape
        size = self.size(n)
        blocks, glob, ids, valid = self.layout(n)
        ids, valid = ids.to(q.device), valid.to(q.device)
        real = rearrange(real_key_blocks(b, n, size, key_padding_mask, q.device), "b q j -> b (q j)")  # (b, positions)
        q_blocks = query_blocks(q, size)  # ((b h), q, i, d)
        parts = [
            self.window_part(q_blocks, k, v, real),
            self.random_part(q_blocks, k, v, real, ids, valid),
        ]
        parts = [Partial(out=unblocked(p.out, b, n), lse=unblocked(p.lse, b, n)) for p in parts if p is not None]
        if glob:
            parts.append(self.global_columns(q, k, v, real[:, :n], glob))
        out = combine(parts)  # one softmax over the three disjoint parts
        # the global rows see every (real) key: written over their blocks' rows
        every_key = Pattern(real[:, None, None, :n])  # (b|1, 1, 1, n): the same for every query
        for block in glob:
            start, stop = block * size, min(n, (block + 1) * size)
            out[:, :, start:stop] = pattern_attention(q[:, :, start:stop], k, v, every_key)
        return out

    def window_part(self, q_blocks: Tensor, k: Tensor, v: Tensor, real: Tensor) -> Partial:
        """Each query block against its window of key blocks: a strided view of k and v, nothing copied but the
        padding (a global block inside the window is counted here; the global part leaves it out)."""
        size, heads = self.size(k.shape[-2]), k.shape[1]
        before, after = size * (self.window_blocks // 2), size * (self.window_blocks - 1 - self.window_blocks // 2)
        k_windows, v_windows = (key_windows(x, size, before, after) for x in (k, v))  # ((b h), q, span, d)
        real_windows = key_windows(real[:, None, :, None].float(), size, before, after)[..., 0] > 0  # (b, q, span)
        allowed = real_windows[:, :, None, :]  # (b, q, 1, span): positions outside the sequence are not real
        return partial_attention(q_blocks, k_windows, v_windows, Pattern(expand_over_heads(allowed, heads)))

    def random_part(
        self, q_blocks: Tensor, k: Tensor, v: Tensor, real: Tensor, ids: Tensor, valid: Tensor
    ) -> Partial | None:
        """Each query block against its random key blocks, gathered: ((b h), q, r * j, d)."""
        if not bool(valid.any()):  # no random block (none asked, or no block left to draw from)
            return None
        size, heads = self.size(k.shape[-2]), k.shape[1]
        k_blocks, v_blocks = query_blocks(k, size), query_blocks(v, size)  # ((b h), blocks, j, d)
        # gathered by index_select along the blocks (several times faster than advanced indexing here)
        k_random, v_random = (
            rearrange(x.index_select(1, ids.flatten()), "x (q r) j d -> x q (r j) d", r=ids.shape[1])
            for x in (k_blocks, v_blocks)
        )
        real_blocks = rearrange(real, "b (q j) -> b q j", j=size)[:, ids] & valid[None, :, :, None]  # (b, q, r, j)
        allowed = rearrange(real_blocks, "b q r j -> b q 1 (r j)")
        return partial_attention(q_blocks, k_random, v_random, Pattern(expand_over_heads(allowed, heads)))

    def global_columns(self, q: Tensor, k: Tensor, v: Tensor, real: Tensor, glob: list[int]) -> Partial:
        """Every query against the global blocks' keys outside its own window: (b, h, n, e) with its lse."""
        size, n = self.size(q.shape[-2]), q.shape[-2]
        columns = torch.cat([torch.arange(g * size, min(n, (g + 1) * size)) for g in glob]).to(q.device)
        query_block = torch.arange(n, device=q.device)[:, None] // size  # (n, 1)
        offset = columns[None, :] // size - query_block  # (n, c): key block - query block
        start = -(self.window_blocks // 2)
        outside = (offset < start) | (offset >= start + self.window_blocks)  # inside the window: the window's
        allowed = outside[None, None] & real[:, None, None, columns]  # (b, 1, n, c)
        return partial_attention(q, k[:, :, columns], v[:, :, columns], Pattern(allowed))

    def cost(self, shape: Shape) -> Cost:
        s = shape
        heads = s.batch * s.heads
        blocks, glob, ids, valid = self.layout(s.n_k)
        size = self.size(s.n_k)
        ids = ids if bool(valid.any()) else ids[:, :0]  # no random block: that part is not computed
        window_span = size * self.window_blocks  # the window part's keys per query block (a strided view)
        block_scores = heads * blocks * size * (window_span + ids.shape[1] * size)  # every slot, masked included
        block_scores += heads * s.n_q * sum(min(s.n_k, (g + 1) * size) - g * size for g in glob)  # global columns
        global_rows = sum(min(s.n_q, (g + 1) * size) - g * size for g in glob)
        computed = block_scores + heads * global_rows * s.n_k
        matmul, other = softmax_attention_flops(computed, s)
        gathered = heads * blocks * ids.shape[1] * size * (s.head_dim + s.value_dim)  # the random blocks, copied
        io = heads * (s.n_q * s.head_dim + s.n_k * (s.head_dim + s.value_dim) + s.n_q * s.value_dim) + gathered
        pattern = s.batch * blocks * (window_span + ids.shape[1] * size) * (1 + s.dtype_bytes) * s.heads
        parts = 3 * heads * s.n_q * (s.value_dim + 1) * s.dtype_bytes  # each part's output and log-sum-exp, merged
        return Cost(
            flops=matmul + other,
            bytes_moved=io * s.dtype_bytes,
            working_bytes=gathered * s.dtype_bytes + pattern + parts + heads * global_rows * s.n_k * s.dtype_bytes * 2,
            matmul_flops=matmul,
        )
