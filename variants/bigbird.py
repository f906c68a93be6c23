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
import torch.nn.functional as F
from attnbench.interface import (
    AttentionVariant,
    Capabilities,
    Cost,
    Hyperparameter,
    Shape,
    kept_between_calls,
    softmax_attention_flops,
)
from attnbench.ops import allowed_keys
from attnbench.variants.blocks import Pattern, all_pairs, pad_sequence
from einops import rearrange
from torch import Tensor


def global_block_ids(blocks: int, count: int) -> list[int]:
    """The global blocks: the first ceil(count / 2) and the last floor(count / 2) (2: the first and the last)."""
    first = list(range(min((count + 1) // 2, blocks)))
    last = list(range(max(blocks - count // 2, len(first)), blocks))
    return first + last


@kept_between_calls(maxsize=64)
def key_blocks(blocks: int, window: int, global_count: int, random_count: int, seed: int) -> tuple[Tensor, Tensor]:
    """(q, s) key block ids per query block and (q, s) bool validity: its window, the global blocks and its random
    blocks, each once; unused slots point at block 0 and are invalid. Random blocks are drawn per query block from
    a generator seeded by `seed` (reproducible for a seed and N)."""
    generator = torch.Generator().manual_seed(seed)
    glob = global_block_ids(blocks, global_count)
    half = window // 2
    rows = []
    for query in range(blocks):
        near = [b for b in range(query - half, query - half + window) if 0 <= b < blocks]
        chosen = list(dict.fromkeys(near + glob))
        pool = torch.tensor([b for b in range(blocks) if b not in chosen], dtype=torch.long)
        if random_count and len(pool):
            picks = torch.randperm(len(pool), generator=generator)[:random_count]
            chosen += sorted(pool[picks].tolist())
        rows.append(chosen)
    slots = max(len(r) for r in rows)
    ids = torch.zeros(blocks, slots, dtype=torch.long)
    valid = torch.zeros(blocks, slots, dtype=torch.bool)
    for query, chosen in enumerate(rows):
        ids[query, : len(chosen)] = torch.tensor(chosen)
        valid[query, : len(chosen)] = True
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

    def layout(self, n: int) -> tuple[int, list[int], Tensor, Tensor]:
        """(blocks, global block ids, key block ids (q, s), validity (q, s)) for a sequence of n."""
        blocks = -(-n // self.block_size)
        ids, valid = key_blocks(blocks, self.window_blocks, self.global_blocks, self.random_blocks, self.seed)
        return blocks, global_block_ids(blocks, self.global_blocks), ids, valid

    def support_mask(self, n_q: int, n_k: int, causal: bool) -> Tensor:
        blocks, glob, ids, valid = self.layout(n_k)
        block_pairs = torch.zeros(blocks, blocks, dtype=torch.bool)
        block_pairs[torch.arange(blocks)[:, None].expand_as(ids)[valid], ids[valid]] = True
        block_pairs[glob, :] = True  # global rows see every key
        i, j = all_pairs(n_q, n_k)
        return block_pairs[i // self.block_size, j // self.block_size]

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        b, h, n, _ = q.shape
        size = self.block_size
        blocks, glob, ids, valid = self.layout(n)
        ids, valid = ids.to(q.device), valid.to(q.device)
        pad = blocks * size - n
        as_blocks = lambda t: rearrange(pad_sequence(t, 0, pad), "b h (q i) d -> (b h) q i d", i=size)  # noqa: E731
        q_blocks, k_blocks, v_blocks = as_blocks(q), as_blocks(k), as_blocks(v)
        # each query block's key blocks, gathered: ((b h), q, s * j, d)
        k_gathered = rearrange(k_blocks[:, ids], "x q s j d -> x q (s j) d")
        v_gathered = rearrange(v_blocks[:, ids], "x q s j e -> x q (s j) e")
        real = torch.arange(blocks * size, device=q.device) < n  # (positions,) inside the sequence
        if key_padding_mask is not None:
            real = real & ~F.pad(key_padding_mask, (0, pad), value=True)  # (b, positions)
        real_blocks = rearrange(real.expand(b, -1), "b (q j) -> b q j", j=size)  # (b, blocks, j)
        seen = real_blocks[:, ids] & valid[None, :, :, None]  # (b, q, s, j): a real key in a used slot
        allowed = rearrange(seen, "b q s j -> b q 1 (s j)").repeat_interleave(h, dim=0)  # ((b h), q, 1, s j)
        pattern = Pattern(allowed)
        out = F.scaled_dot_product_attention(q_blocks, k_gathered, v_gathered, attn_mask=pattern.bias(q.dtype))
        if not pattern.complete:  # a query block with no real key (all padding): zeros, not the kernel's output
            out = out.masked_fill(~pattern.has_key[..., None], 0.0)
        out = rearrange(out, "(b h) q i e -> b h (q i) e", b=b)[:, :, :n]
        if not glob:
            return out
        pieces, done = [], 0  # the global rows (every key) in place of their blocks' rows, joined in one copy
        for block in glob:
            start, stop = block * size, min(n, (block + 1) * size)
            every_key = allowed_keys(stop - start, n, causal=False, key_padding_mask=key_padding_mask, device=q.device)
            rows = Pattern(every_key)
            global_out = F.scaled_dot_product_attention(q[:, :, start:stop], k, v, attn_mask=rows.bias(q.dtype))
            if not rows.complete:
                global_out = global_out.masked_fill(~rows.has_key[..., None], 0.0)
            pieces += [out[:, :, done:start], global_out]
            done = stop
        return torch.cat([*pieces, out[:, :, done:]], dim=2)

    def cost(self, shape: Shape) -> Cost:
        s = shape
        heads = s.batch * s.heads
        blocks, glob, ids, _ = self.layout(s.n_k)
        size = self.block_size
        block_scores = heads * blocks * size * ids.shape[1] * size  # every slot computed, masked ones included
        global_rows = sum(min(s.n_q, (g + 1) * size) - g * size for g in glob)
        computed = block_scores + heads * global_rows * s.n_k
        matmul, other = softmax_attention_flops(computed, s)
        gathered = heads * blocks * ids.shape[1] * size * (s.head_dim + s.value_dim)  # the key blocks, copied
        io = heads * (s.n_q * s.head_dim + s.n_k * (s.head_dim + s.value_dim) + s.n_q * s.value_dim) + gathered
        pattern = s.batch * blocks * ids.shape[1] * size * (1 + s.dtype_bytes) * s.heads
        return Cost(
            flops=matmul + other,
            bytes_moved=io * s.dtype_bytes,
            working_bytes=gathered * s.dtype_bytes + pattern + heads * global_rows * s.n_k * s.dtype_bytes * 2,
            matmul_flops=matmul,
        )
