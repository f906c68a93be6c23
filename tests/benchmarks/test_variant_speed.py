"""pytest-benchmark suite over the whole registry at one fixed size (forward, float32, CPU).

`make test` runs it with --benchmark-disable (each once, as a smoke test); `make benchmark` runs it for
real and saves the results under .benchmarks/ for `pytest-benchmark compare`.
"""

from __future__ import annotations

import pytest
import torch
from attnbench.registry import registry

SHAPE = dict(batch=1, heads=8, seq_len=2048, head_dim=64)


@pytest.mark.parametrize("name", registry.names())
def test_forward_speed(benchmark, name: str) -> None:
    variant = registry.create(name)
    reason = variant.unsupported_reason(
        device="cpu", dtype="float32", causal=False, padded=False, n_q=SHAPE["seq_len"], n_k=SHAPE["seq_len"]
    )
    if reason is not None:
        pytest.skip(reason)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(SHAPE["batch"], SHAPE["heads"], SHAPE["seq_len"], SHAPE["head_dim"], generator=generator)
        for _ in range(3)
    )
    benchmark.extra_info.update(SHAPE)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return variant(q, k, v)

    out = benchmark(forward)
    assert out.shape == v.shape and torch.isfinite(out).all()
