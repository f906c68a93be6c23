"""The faster forward paths of issue 58, against references built here: strided's column part read as strided views
under one shared row pattern and merged into the local run in place, and the Performer's decayed prefix sum of chunk
states as matmuls (two levels) instead of a step per chunk.

b - batch, h - heads, c - chunk, n - position, m - feature, e - value dim
"""

from __future__ import annotations

import pytest
import torch
from attnbench.ops import dense_masked_attention
from attnbench.registry import registry
from attnbench.variants.feature_attention import GROUP, decayed_exclusive_prefix


def strided_reference(n: int, stride: int, causal: bool) -> torch.Tensor:
    """(n, n): |i - j| <= l or (i - j) mod l == 0, and j <= i when causal (the paper's A(1) and A(2))."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = ((i - j).abs() <= stride) | ((i - j) % stride == 0)
    return allowed & (j <= i) if causal else allowed


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 6])  # 1-2: no column key beyond the local run; 3: a middle row sees none
@pytest.mark.parametrize("extra", [0, 5])  # whole rows (every column shares one row pattern), or a padded last row
@pytest.mark.parametrize("causal", [False, True])
def test_strided_columns_on_whole_and_padded_grids(rows: int, extra: int, causal: bool) -> None:
    stride = 8
    n = rows * stride + extra
    generator = torch.Generator().manual_seed(rows * 10 + extra)
    q, k, v = (torch.randn(2, 3, n, 16, generator=generator, dtype=torch.float64) for _ in range(3))
    out = registry.create("strided", stride=stride)(q, k, v, causal=causal)
    expected = dense_masked_attention(q, k, v, strided_reference(n, stride, causal))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)


def test_strided_default_pattern_in_float32_at_a_long_sequence() -> None:
    """The configuration of the speed goal (default stride 64 at N=4096, causal, float32) against the dense masked
    reference in float64: the in-place merge and the views change nothing beyond float32 rounding."""
    n = 4096
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 32, generator=generator) for _ in range(3))
    with torch.no_grad():
        out = registry.create("strided")(q, k, v, causal=True)
    expected = dense_masked_attention(q.double(), k.double(), v.double(), strided_reference(n, 64, True))
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=2e-5)


def stepped_prefix(sums: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """The recurrence written out: state_0 = 0, state_(t+1) = state_t exp(levels[t] - levels[t+1]) + sums[t]."""
    states, state = [], torch.zeros_like(sums[:, :, 0])
    for t in range(sums.shape[2]):
        states.append(state)
        state = state * (levels[..., t] - levels[..., t + 1]).exp()[..., None, None] + sums[:, :, t]
    return torch.stack(states, dim=2)


@pytest.mark.parametrize("chunks", [1, GROUP - 1, GROUP, 3 * GROUP + 5])
def test_decayed_prefix_equals_the_recurrence(chunks: int) -> None:
    generator = torch.Generator().manual_seed(chunks)
    sums = torch.randn(2, 3, chunks, 5, 4, generator=generator, dtype=torch.float64)
    levels = torch.rand(2, 3, chunks + 1, generator=generator, dtype=torch.float64).cumsum(dim=-1)
    torch.testing.assert_close(decayed_exclusive_prefix(sums, levels), stepped_prefix(sums, levels))


def test_decayed_prefix_stays_finite_when_the_levels_climb_past_the_exponents_range() -> None:
    """Levels rising by 300 (exp(300) overflows float32): every weight is exp(earlier - later) <= 1, so nothing
    overflows; the states equal the recurrence's, in which the old sums have decayed to 0."""
    chunks = 2 * GROUP + 3
    generator = torch.Generator().manual_seed(1)
    sums = torch.rand(1, 2, chunks, 3, 2, generator=generator)
    levels = torch.arange(chunks + 1, dtype=torch.float32).expand(1, 2, -1) * 300.0 / chunks
    states = decayed_exclusive_prefix(sums, levels)
    assert torch.isfinite(states).all()
    torch.testing.assert_close(states, stepped_prefix(sums, levels))
