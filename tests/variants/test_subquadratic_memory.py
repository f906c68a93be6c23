"""Every sub-quadratic built-in at N=4096 and 16384: its peak memory stays far below an N x N matrix and grows no
faster than its algorithm says (linear, or N^1.5 for strided's default sqrt(N) stride)."""

from __future__ import annotations

import math

import pytest
import torch
from attnbench.interface import clear_kept_state
from attnbench.measure.memory import peak_memory
from attnbench.registry import registry


@pytest.mark.parametrize(
    "name, params, exponent",
    [
        ("band", {"window": 32}, 1.0),
        ("band", {"window": 32, "sinks": 4, "global_tokens": 2}, 1.0),
        ("strided", {}, 1.5),
        ("bigbird", {}, 1.0),
        ("nystromformer", {}, 1.0),
        ("topk", {}, 1.0),
    ],
)
def test_memory_stays_subquadratic(name: str, params: dict, exponent: float) -> None:
    variant = registry.create(name, **params)
    peaks = {}
    for n in (4096, 16384):
        q, k, v = (torch.randn(1, 1, n, 16) for _ in range(3))
        clear_kept_state()  # both calls build their cached pattern (another test may have left one for 4096)
        with torch.no_grad():
            peaks[n] = peak_memory(lambda: variant(q, k, v), torch.device("cpu"), inputs=(q, k, v))[0]
    dense_matrix = 16384**2 * 4  # 1 GiB
    assert peaks[16384] < dense_matrix / 20
    growth = math.log(peaks[16384] / peaks[4096]) / math.log(4)
    assert growth <= exponent + 0.25, f"{name}: peak grew as N^{growth:.2f}"
