"""The per-head attention statistics (attnbench.inputs.statistics) against a dense, sort-based computation."""

from __future__ import annotations

import math

import pytest
import torch
from attnbench.inputs.statistics import LOCALITY_WINDOW, STATISTICS, TOP_KEYS, TOP_SHARE, head_statistics


def dense_statistics(q: torch.Tensor, k: torch.Tensor, causal: bool) -> dict[str, torch.Tensor]:
    """Each statistic per head, row by row from the full weight matrix sorted in float64."""
    n = q.shape[-2]
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
    weights = scores.softmax(dim=-1)[0]  # (h, i, j)
    rows = {name: torch.zeros(weights.shape[0]) for name in STATISTICS}
    for i in range(n):
        visible = i + 1 if causal else n
        w = weights[:, i, :visible]
        ranked = w.sort(dim=-1, descending=True).values
        rows["entropy"] += (-(w * w.clamp(min=1e-300).log()).sum(-1) / math.log(visible) if visible > 1 else 0) / n
        low, high = max(0, i - LOCALITY_WINDOW), min(visible, i + LOCALITY_WINDOW + 1)
        rows["local_mass"] += w[:, low:high].sum(-1) / n
        rows["sink_mass"] += w[:, 0] / n
        rows["top1pct_mass"] += ranked[:, : math.ceil(TOP_SHARE * visible)].sum(-1) / n
        rows["top64_mass"] += ranked[:, :TOP_KEYS].sum(-1) / n
    return rows


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [37, 300])  # fewer keys than TOP_KEYS in early rows; 1% of 300 is 3 keys
def test_statistics_equal_a_dense_sort_based_computation(causal: bool, n: int) -> None:
    generator = torch.Generator().manual_seed(n)
    q, k = (torch.randn(1, 3, n, 16, generator=generator) * 2 for _ in range(2))
    chunked = head_statistics(q, k, causal=causal, dtype=torch.float64, chunk_elements=3 * n * 7)  # several chunks
    dense = dense_statistics(q, k, causal)
    for name in STATISTICS:
        torch.testing.assert_close(chunked[name].float(), dense[name].float(), rtol=1e-5, atol=1e-6, msg=name)


def test_a_one_hot_head_and_a_uniform_head_have_the_statistics_their_shape_says() -> None:
    n, d = 512, 8
    k = torch.zeros(1, 2, n, d)
    q = torch.zeros(1, 2, n, d)
    q[:, 0, :, 0], k[:, 0, 0, 0] = 200.0, 200.0  # head 0: every query on the first key; head 1: all logits 0
    stats = head_statistics(q, k, causal=False)
    assert stats["sink_mass"][0] == pytest.approx(1.0) and stats["entropy"][0] == pytest.approx(0.0, abs=1e-6)
    assert stats["entropy"][1] == pytest.approx(1.0, abs=1e-6) and stats["top64_mass"][1] == pytest.approx(64 / n)
    assert stats["top1pct_mass"][1] == pytest.approx(math.ceil(0.01 * n) / n)
