"""The flex backend: block masks equal create_block_mask's without an N x N tensor; every new shape compiles
(never a silent eager fallback past dynamo's recompile limit) with its compile time recorded; outputs match the
dense reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from attnbench.ops import dense_masked_attention
from attnbench.registry import registry
from attnbench.variants import flex
from helpers import LargestTensor
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import create_block_mask

PATTERNS = [
    ("band", {"window": 20}),
    ("band", {"window": 200}),
    ("strided", {"stride": 16, "pattern": "strided"}),
    ("strided", {"stride": 16, "pattern": "strided", "factorize": True}),
    ("strided", {"stride": 24, "pattern": "fixed", "summary": 5}),
    ("strided", {"stride": 24, "pattern": "fixed", "summary": 5, "factorize": True}),
]
BLOCK_MASK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
BLOCK_MASK_FIELDS += ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def flex_skip_reason() -> str | None:
    return flex.flex_unsupported_reason("flex", device="cpu", dtype=torch.float32, padded=False)


def qkv(n: int, heads: int = 2) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(n)
    return tuple(torch.randn(1, heads, n, 16, generator=generator) for _ in range(3))


def mask_mod_of(name: str, params: dict, causal: bool, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """The mask_mod the variant hands to flex_attention_call (captured, nothing compiled)."""
    captured = []

    def capture(q, k, v, mask_mod, key):
        captured.append(mask_mod)
        return q

    monkeypatch.setattr(f"attnbench.variants.{name}.flex_attention_call", capture)
    q = torch.zeros(1, 2, 64, 8)
    registry.create(name, backend="flex", **params)(q, q, q, causal=causal)
    return captured[0]


@pytest.mark.parametrize("n", [300, 1000])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name, params", PATTERNS)
def test_block_mask_equals_create_block_mask(
    name: str, params: dict, causal: bool, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    mask_mod = mask_mod_of(name, params, causal, monkeypatch)
    heads = 2 if params.get("factorize") else 1  # a mask that reads h gets one block mask per head
    got = flex.build_block_mask(mask_mod, 2, n, n, torch.device("cpu"))
    want = create_block_mask(mask_mod, 1, heads, n, n, device="cpu")
    assert got.seq_lengths == want.seq_lengths == (n, n) and got.BLOCK_SIZE == want.BLOCK_SIZE
    for field in BLOCK_MASK_FIELDS:
        assert torch.equal(getattr(got, field), getattr(want, field)), field
        assert getattr(got, field).dtype == torch.int32


@pytest.mark.parametrize("name, params", [PATTERNS[0], PATTERNS[3]])
def test_block_mask_never_holds_an_n_by_n_tensor(name: str, params: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 8192
    mask_mod = mask_mod_of(name, params, False, monkeypatch)
    with LargestTensor() as largest:
        block_mask = flex.build_block_mask(mask_mod, 2, n, n, torch.device("cpu"))
    assert largest.numel < n * n / 16, f"a tensor of {largest.numel} elements: N x N is {n * n}"
    assert block_mask.kv_indices.shape[-2:] == (n // flex.BLOCK, n // flex.BLOCK)


SEQ_LENS = (64, 96, 160)  # three new shapes for one pattern


def test_every_new_shape_compiles_past_dynamos_recompile_limit() -> None:
    """With dynamo's limit at 1 (as if the default 8 were used up by earlier cells), each new shape still compiles
    once through AOTAutograd and Inductor (an eager fallback compiles nothing there) and reports its compile
    time; outputs match the dense reference."""
    if reason := flex_skip_reason():
        pytest.skip(reason)
    variant = registry.create("band", backend="flex", window=13)
    with torch._dynamo.config.patch(recompile_limit=1):
        for n in SEQ_LENS:
            q, k, v = qkv(n)
            compiled = counters["aot_autograd"]["ok"]
            out = variant(q, k, v, causal=True)
            assert counters["aot_autograd"]["ok"] == compiled + 1, f"N={n} ran without compiling (eager fallback)"
            assert flex.last_compile_seconds() > 0
            torch.testing.assert_close(variant(q, k, v, causal=True), out, rtol=0, atol=0)
            assert flex.last_compile_seconds() is None and counters["aot_autograd"]["ok"] == compiled + 1
            expected = dense_masked_attention(q, k, v, variant.support_mask(n, n, causal=True))
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_recompile_limit_raises_instead_of_falling_back(monkeypatch: pytest.MonkeyPatch) -> None:
    if reason := flex_skip_reason():
        pytest.skip(reason)
    variant = registry.create("band", backend="flex", window=13)
    variant(*qkv(SEQ_LENS[0]), causal=True)  # compiled above, or here: at least one compiled shape
    monkeypatch.setattr(flex, "RECOMPILE_LIMIT", 1)
    with pytest.raises(RuntimeError, match="recompile limit .* will not fall back"):
        variant(*qkv(72), causal=True)  # a new shape: over the limit, refused before anything is compiled


def test_factorized_strided_masks_each_head() -> None:
    """factorize=True: even heads see the first part, odd heads the second (one block mask per head)."""
    if reason := flex_skip_reason():
        pytest.skip(reason)
    variant = registry.create("strided", backend="flex", stride=16, factorize=True)
    q, k, v = qkv(300)
    expected = dense_masked_attention(q, k, v, variant.support_mask(300, 300, causal=False))
    torch.testing.assert_close(variant(q, k, v, causal=False), expected, rtol=1e-4, atol=1e-5)


def test_cpu_backward_is_declared_unsupported() -> None:
    variant = registry.create("band", backend="flex")
    reason = variant.unsupported_reason(
        device="cpu", dtype="float32", causal=False, padded=False, n_q=64, n_k=64, backward=True
    )
    assert reason is not None and "backward" in reason
