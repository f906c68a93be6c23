"""Every registered variant, built-in or plugin, against every conformance check: new variants are covered for free.

Each runs with its defaults; a few hyperparameter settings that change capabilities or code paths run too.
"""

from __future__ import annotations

import pytest
import torch
from attnbench.conformance import CHECK_DTYPES, CHECKS, check_contexts, run_check
from attnbench.registry import registry

EXTRA_SETTINGS = [
    ("lsh", {"shared_qk": True}),  # the causal path (per-bucket chunks)
    ("strided", {"pattern": "fixed", "factorize": True}),
    ("linformer", {"projection": "pool", "share_kv": True}),
    ("performer", {"kernel": "trig"}),  # the paper's trigonometric baseline: denominators of either sign
    ("performer", {"orthogonal": False}),
    ("topk", {"block_size": 8, "top_k": 3}),  # at the checks' small N, blocks to choose between
    ("topk", {"block_size": 8, "top_k": 2, "score": "minmax"}),  # decode is Quest's: steps equal the forward here
    ("h2o", {"budget": 16, "recent": 4}),  # budgets below the checks' prompt: eviction and selection happen
    ("snapkv", {"budget": 16, "window": 4}),
]
SETTINGS = [(name, {}) for name in registry.names()] + EXTRA_SETTINGS


@pytest.mark.parametrize("dtype", CHECK_DTYPES)
@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("name, params", SETTINGS, ids=[f"{n}{p or ''}" for n, p in SETTINGS])
def test_variant_conforms(name: str, params: dict, check: str, dtype: str) -> None:
    variant_class = registry.load(name)
    contexts = check_contexts(lambda: variant_class(seed=0, **params))
    if isinstance(contexts, str):
        pytest.skip(contexts)
    ctx = next((c for c in contexts if str(c.dtype) == f"torch.{dtype}"), None)
    if ctx is None:
        pytest.skip(f"{name} is not checked in {dtype} here")
    result = run_check(check, ctx)
    if result.status == "skip":
        pytest.skip(result.detail)
    assert result.status == "pass", f"{name} {params} ({dtype}): {check}: {result.detail}"


def test_check_runs_in_float32_too_where_a_nan_shows_only_there() -> None:
    """A variant whose float32 output overflows to NaN passes in float64: both precisions are checked."""
    from attnbench.interface import AttentionVariant

    class Float32Overflow(AttentionVariant):
        name = "overflow"
        family = "test"
        exact = False

        def forward(self, q, k, v, *, causal, key_padding_mask):
            huge = torch.full_like(v, 1e200 if v.dtype == torch.float64 else float("inf"))
            return v * 0 + (huge - huge if v.dtype == torch.float32 else 0.0)

    contexts = check_contexts(lambda: Float32Overflow())
    assert [str(c.dtype) for c in contexts] == ["torch.float64", "torch.float32"]
    shapes = {str(c.dtype): run_check("shapes", c).status for c in contexts}
    assert shapes == {"torch.float64": "pass", "torch.float32": "fail"}
