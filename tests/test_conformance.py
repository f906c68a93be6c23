"""Every registered variant, built-in or plugin, against every conformance check: new variants are covered for free."""

from __future__ import annotations

import pytest

from attnbench.conformance import CHECKS, check_context, run_check
from attnbench.registry import registry


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("name", registry.names())
def test_variant_conforms(name: str, check: str) -> None:
    variant_class = registry.load(name)
    ctx = check_context(lambda: variant_class(seed=0))
    if isinstance(ctx, str):
        pytest.skip(ctx)
    result = run_check(check, ctx)
    if result.status == "skip":
        pytest.skip(result.detail)
    assert result.status == "pass", f"{name}: {check}: {result.detail}"
