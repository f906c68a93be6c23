"""BigBird against a dense reference built here from the paper's definition: a window of blocks, global blocks that
see and are seen by everything, and random blocks that are reproducible from the seed and never repeat the others."""

from __future__ import annotations

import pytest
import torch
from attnbench.ops import dense_masked_attention
from attnbench.registry import registry
from attnbench.variants.bigbird import random_block_ids


def reference_support(
    n: int, size: int, window: int, global_count: int, random_ids: dict[int, set[int]]
) -> torch.Tensor:
    """(n, n) from the definition: block |q - k| within the centred window, the first ceil(g/2) and last floor(g/2)
    blocks global (rows and columns), plus each query block's random blocks (`random_ids`, the variant's draw)."""
    blocks = -(-n // size)
    glob = set(range(min((global_count + 1) // 2, blocks))) | set(range(blocks - global_count // 2, blocks))
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            qb, kb = i // size, j // size
            in_window = -(window // 2) <= kb - qb < window - window // 2
            allowed[i, j] = in_window or qb in glob or kb in glob or kb in random_ids.get(qb, set())
    return allowed


def drawn(n: int, size: int, window: int, global_count: int, random_count: int, seed: int) -> dict[int, set[int]]:
    """The random blocks the variant drew for each query block, checked: distinct, none in its window or global."""
    blocks = -(-n // size)
    ids, valid = random_block_ids(blocks, window, global_count, random_count, seed)
    glob = set(range(min((global_count + 1) // 2, blocks))) | set(range(blocks - global_count // 2, blocks))
    out = {}
    for q in range(blocks):
        near = {b for b in range(q - window // 2, q - window // 2 + window) if 0 <= b < blocks}
        chosen = [b for b, ok in zip(ids[q].tolist(), valid[q].tolist()) if ok]
        assert len(chosen) == len(set(chosen)), "a random block drawn twice"
        assert not set(chosen) & (near | glob), "a random block repeats a window or global block"
        out[q] = set(chosen)
        assert len(out[q]) == min(random_count, blocks - len(near | glob)), (q, out[q])
    return out


def qkv(n: int, b: int = 2, h: int = 2, d: int = 8):
    generator = torch.Generator().manual_seed(n)
    return tuple(torch.randn(b, h, n, d, generator=generator, dtype=torch.float64) for _ in range(3))


@pytest.mark.parametrize(
    "n, size, window, global_count, random_count",
    [
        (200, 16, 3, 2, 3),
        (257, 16, 3, 2, 2),
        (100, 8, 5, 1, 4),
        (40, 16, 3, 2, 3),
        (10, 64, 3, 2, 3),
        (120, 8, 4, 0, 0),
        (96, 8, 3, 3, 2),
    ],
)
@pytest.mark.parametrize("padded", ["none", "start", "middle", "end"])
def test_bigbird_matches_the_dense_reference(
    n: int, size: int, window: int, global_count: int, random_count: int, padded: str
) -> None:
    variant = registry.create(
        "bigbird", block_size=size, window_blocks=window, global_blocks=global_count, random_blocks=random_count, seed=7
    )
    allowed = reference_support(n, size, window, global_count, drawn(n, size, window, global_count, random_count, 7))
    assert torch.equal(variant.support_mask(n, n, False), allowed)
    q, k, v = qkv(n)
    position = torch.arange(n)
    where = {"none": position < 0, "start": position < n // 4, "middle": (position >= n // 3) & (position < n // 2),
             "end": position >= n - n // 4}[padded]  # fmt: skip
    mask = torch.stack([where, torch.zeros(n, dtype=torch.bool)])  # element 0 padded, element 1 not
    expected = dense_masked_attention(q, k, v, allowed[None, None] & ~mask[:, None, None, :])
    out = variant(q, k, v, causal=False, key_padding_mask=mask)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)


def test_random_blocks_come_from_the_seed() -> None:
    def support(seed: int) -> torch.Tensor:
        return registry.create("bigbird", block_size=8, seed=seed).support_mask(256, 256, False)

    assert torch.equal(support(3), support(3))
    assert not torch.equal(support(3), support(4))


def test_gradients_match_finite_differences() -> None:
    variant = registry.create("bigbird", block_size=3, random_blocks=1)
    q, k, v = (t[:1, :1, :17, :4].clone().requires_grad_() for t in qkv(17))
    mask = torch.zeros(1, 17, dtype=torch.bool)
    mask[0, -3:] = True
    assert torch.autograd.gradcheck(lambda q, k, v: variant(q, k, v, key_padding_mask=mask), (q, k, v))


def test_a_block_larger_than_the_sequence_is_clipped_to_it() -> None:
    """N=5 with block_size=10**5 is one block of 5 (and global): dense attention, a few times 25 scores at most, not
    a 10**5-wide window; the cost says exactly what is done."""
    from attnbench.interface import Shape
    from attnbench.measure.flops import count_matmul_flops

    variant = registry.create("bigbird", block_size=10**5)
    q, k, v = (t[:1, :1, :, :4].float() for t in qkv(5))
    torch.testing.assert_close(variant(q, k, v), dense_masked_attention(q, k, v), rtol=0, atol=1e-6)
    done = count_matmul_flops(lambda: variant(q, k, v))
    assert variant.cost(Shape(1, 1, 5, 5, 4, 4)).matmul_flops == done <= 5 * 2 * 25 * (4 + 4)
