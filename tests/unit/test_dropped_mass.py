"""The dropped mass of several supports from one pass over the exact weights, against each computed densely."""

from __future__ import annotations

import torch
from attnbench.measure.reference import dropped_masses
from attnbench.ops import padding_mask


def test_one_pass_gives_each_supports_own_dropped_mass() -> None:
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 70, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    mask = padding_mask(2, 70, 0.3)
    i, j = torch.arange(70)[:, None], torch.arange(70)[None, :]
    supports = {
        "band": ((i - j).abs() <= 5)[None, None],  # (1, 1, i, j)
        "chosen": torch.rand(2, 3, 70, 70, generator=generator) < 0.3,  # per batch and head, as a selection gives
        "everything": torch.ones(1, 1, 70, 70, dtype=torch.bool),
    }
    for causal in (False, True):
        got = dropped_masses(q, k, supports, causal=causal, key_padding_mask=mask, max_chunk_elements=2000)
        scores = torch.einsum("bhid,bhjd->bhij", q, k) / 8**0.5
        allowed = ~mask[:, None, None, :] & (j <= i if causal else torch.ones_like(i == j))
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        for name, support in supports.items():
            expected = (weights * ~support).sum().item() / (2 * 3 * 70)
            assert abs(got[name] - expected) < 1e-12, (name, causal, got[name], expected)
        assert got["everything"] < 1e-12 < got["band"]
