"""Every registered variant compiled (`compile = true`, `attnbench.measure.compiled`) gives the outputs of its
eager call. At an awkward N (not a multiple of any block, chunk or stride), with padding in the middle where the
variant takes a key padding mask, and causal where it supports that. New variants are covered for free.

What can differ compiled is ours to test: dynamo tracing our code (graph breaks, guards, a branch on a tensor's
value taken at trace time). `make test` compiles with the `aot_eager` backend, which runs that whole path but
hands the graphs to eager kernels instead of generating C++ (inductor's cold compile of every built-in takes ~70 s
on 2 cores); `ATTNBENCH_COMPILE_BACKEND=inductor` runs the same test through inductor, as a compiled run does
(tests/integration/test_compiled_runs.py runs full and linear through inductor end to end).
"""

from __future__ import annotations

import os

import pytest
import torch
from attnbench.measure.compiled import compiled_graphs, fresh_compile_cache, no_recompiling
from attnbench.registry import registry

N = 75
TOLERANCE = 2e-5  # float32: inductor reorders sums, nothing more (every built-in measured ≤ 3e-7 here)
BACKEND = os.environ.get("ATTNBENCH_COMPILE_BACKEND", "aot_eager")


def _cpu_variants() -> list[str]:
    return [name for name in registry.names() if "cpu" in registry.load(name).supports.devices]


@pytest.mark.parametrize("name", _cpu_variants())
def test_compiled_call_matches_eager(name: str) -> None:
    variant = registry.create(name, seed=0)
    caps = variant.supports
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, N, 16, generator=generator) for _ in range(3))
    mask = None
    if caps.key_padding_mask:
        mask = torch.zeros(2, N, dtype=torch.bool)
        mask[1, 30:41] = True  # padding in the middle of the second sequence
    options = dict(device="cpu", dtype="float32", padded=mask is not None, n_q=N, n_k=N, backward=False)
    causal = variant.unsupported_reason(causal=True, **options) is None  # lsh's default setting is not causal
    if not causal and (reason := variant.unsupported_reason(causal=False, **options)) is not None:
        pytest.skip(reason)  # no full-sequence call: a KV-cache method (decode only)
    with fresh_compile_cache(), torch.no_grad():
        graphs = compiled_graphs()
        compiled_call = torch.compile(variant.__call__, dynamic=False, backend=BACKEND)  # compiled_call, its backend
        compiled = compiled_call(q, k, v, causal=causal, key_padding_mask=mask)  # first: state it fills is new
        assert compiled_graphs() > graphs  # dynamo compiled it (no silent fall-back to the eager call)
        with no_recompiling():  # as a run times it: the state its first call filled must not change the guards
            compiled_call(q, k, v, causal=causal, key_padding_mask=mask)
        eager = variant(q, k, v, causal=causal, key_padding_mask=mask)
    assert compiled.shape == eager.shape and compiled.dtype == eager.dtype
    assert torch.isfinite(compiled).all()
    assert (compiled - eager).abs().max().item() <= TOLERANCE, f"{name}: compiled differs from eager"
