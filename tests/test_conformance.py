"""Every registered variant, built-in or plugin, against every conformance check: new variants are covered for free.

Each runs with its defaults; a few hyperparameter settings that change capabilities or code paths run too.
"""

from __future__ import annotations

import pytest
from attnbench.conformance import CHECKS, check_context, run_check
from attnbench.registry import registry

EXTRA_SETTINGS = [
    ("lsh", {"shared_qk": True}),  # the causal path (per-bucket chunks)
    ("strided", {"pattern": "fixed", "factorize": True}),
    ("linformer", {"projection": "pool", "share_kv": True}),
]
SETTINGS = [(name, {}) for name in registry.names()] + EXTRA_SETTINGS


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("name, params", SETTINGS, ids=[f"{n}{p or ''}" for n, p in SETTINGS])
def test_variant_conforms(name: str, params: dict, check: str) -> None:
    variant_class = registry.load(name)
    ctx = check_context(lambda: variant_class(seed=0, **params))
    if isinstance(ctx, str):
        pytest.skip(ctx)
    result = run_check(check, ctx)
    if result.status == "skip":
        pytest.skip(result.detail)
    assert result.status == "pass", f"{name} {params}: {check}: {result.detail}"
