"""pytest-benchmark suite: every registered variant, forward, float32, CPU, by N and key hyperparameters.

`make test` runs it with --benchmark-disable (each eager case once at the smallest N, as a smoke test).
Each case runs eager and compiled (`torch.compile`, as `compile = true` runs it; compilation lands in the warm-up);
the compiled cases run only when timing for real (compiling every variant takes minutes: `tests/variants/
test_compiled.py` pins that compiled outputs equal eager ones).
`make benchmark` times it for real (warm-up on, grouped by N) and saves the run under .benchmarks/;
`make benchmark-compare` times it again and compares against the last saved run. Each case is timed alone,
back to back: use it to catch a regression of one implementation between commits on one quiet machine.
`attnbench compare` is the tool for sweeps: it times variants in turns, keeps the samples and gives an
interval and a noise-aware verdict per cell.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from attnbench.measure.compiled import call_of, fresh_compile_cache
from attnbench.plan.cells import VariantSpec
from attnbench.registry import registry

SEQ_LENS = [1024, 4096]
SHAPE = dict(batch=1, heads=8, head_dim=64)
KEY_HYPERPARAMETERS: dict[str, list[dict[str, Any]]] = {  # the knobs that move time most; others run with defaults
    "band": [{"window": 64}, {"window": 256}],
    "strided": [{"pattern": "strided"}, {"pattern": "fixed"}],
    "lsh": [{"n_hashes": 1}, {"n_hashes": 4}],
    "linformer": [{"k": 64}, {"k": 256}],
    "performer": [{"features": 128}, {"features": 256}],
}
CASES = [
    pytest.param(name, params, id=VariantSpec(name, tuple(params.items())).label())  # every setting spelled out
    for name in registry.names()
    for params in KEY_HYPERPARAMETERS.get(name, [{}])
]


@pytest.mark.parametrize("seq_len", SEQ_LENS, ids=lambda n: f"N={n}")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize(("name", "params"), CASES)
def test_forward_speed(benchmark, name: str, params: dict[str, Any], compiled: bool, seq_len: int) -> None:
    benchmark.group = f"forward N={seq_len}"  # one table per N: variants compared at the same length
    if benchmark.disabled and (seq_len != SEQ_LENS[0] or compiled):
        pytest.skip("with --benchmark-disable (make test) each eager case runs once, as a smoke test, at the least N")
    variant = registry.create(name, **params)
    reason = variant.unsupported_reason(
        device="cpu", dtype="float32", causal=False, padded=False, n_q=seq_len, n_k=seq_len
    )
    if reason is not None:
        pytest.skip(reason)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(SHAPE["batch"], SHAPE["heads"], seq_len, SHAPE["head_dim"], generator=generator) for _ in range(3)
    )
    benchmark.extra_info.update(SHAPE, seq_len=seq_len, compiled=compiled, **params)
    call = call_of(variant, compiled)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return call(q, k, v, causal=False, key_padding_mask=None)

    with fresh_compile_cache():  # one graph per case, compiled in the warm-up
        out = benchmark(forward)
    assert out.shape == v.shape and torch.isfinite(out).all()
