"""Every registered variant's cost model against the matmul FLOPs one forward call really does.

`Cost.matmul_flops` must be within TOLERANCE of `count_matmul_flops` of the call, at small shapes chosen to
be awkward (N not a multiple of any block, chunk or stride, value_dim != head_dim, Nq != Nk where supported),
causal and not, with hyperparameters that reach each code path. New variants are covered for free.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attnbench.interface import Shape, softmax_attention_flops
from attnbench.measure.flops import causal_pairs, count_matmul_flops
from attnbench.registry import registry
from attnbench.variants.flex import FLEX_BACKEND

TOLERANCE = 0.05
# Causal lsh chunks each bucket apart, so how many chunks it computes depends on where the data hashes;
# its model estimates that for Gaussian inputs.
# Block top-k gathers each key block's choosers into chunks, so how many chunk slots stay empty depends on
# which blocks the queries choose; its model takes each block's last chunk as half full.
DATA_DEPENDENT_TOLERANCE = {("lsh", True): 0.10, ("topk", False): 0.10, ("topk", True): 0.10}

EXTRA_SETTINGS = [
    ("band", {"window": 5}),
    ("band", {"window": 7, "block_size": 12}),
    ("band", {"window": 5, "sinks": 4}),
    ("band", {"window": 7, "sinks": 2, "global_tokens": 3}),
    ("strided", {"stride": 7}),
    ("strided", {"pattern": "strided", "factorize": True}),
    ("strided", {"pattern": "fixed", "stride": 7, "summary": 3}),
    ("strided", {"pattern": "fixed", "factorize": True}),
    ("lsh", {"bucket_size": 16, "n_hashes": 3, "n_buckets": 8}),
    ("lsh", {"bucket_size": 24, "n_hashes": 2, "n_buckets": 6, "look_forward": 1}),
    ("lsh", {"bucket_size": 16, "n_hashes": 3, "n_buckets": 8, "shared_qk": True}),  # the causal path
    ("linear", {"chunk_size": 24}),
    ("performer", {"features": 40, "chunk_size": 24}),
    ("performer", {"features": 40, "chunk_size": 24, "kernel": "trig"}),
    ("bigbird", {"block_size": 16}),
    ("bigbird", {"block_size": 7, "window_blocks": 5, "global_blocks": 1, "random_blocks": 1}),
    ("nystromformer", {"landmarks": 16, "pinv_iterations": 3}),
    ("topk", {"block_size": 8, "top_k": 3}),
    ("topk", {"block_size": 16, "top_k": 2, "score": "minmax", "queries_per_chunk": 16}),
    ("linformer", {"k": 32}),
    ("linformer", {"k": 48, "projection": "pool", "share_kv": True}),
    ("linformer", {"k": 8, "projection": "identity"}),
    ("linformer", {"k": 20, "share_heads": False}),
    ("gla", {"chunk_size": 24}),
    ("gated-deltanet", {"chunk_size": 24}),
]
SETTINGS = [(name, {}) for name in registry.names()] + EXTRA_SETTINGS
SHAPES = {  # (batch, heads, n_q, n_k, head_dim, value_dim)
    "n100-e24": (2, 3, 100, 100, 16, 24),
    "n300": (2, 3, 300, 300, 16, 16),
    "cross": (2, 3, 100, 300, 16, 24),
}


def cost_shape(shape_id: str, causal: bool) -> Shape:
    batch, heads, n_q, n_k, head_dim, value_dim = SHAPES[shape_id]
    return Shape(batch, heads, n_q, n_k, head_dim, value_dim, causal=causal)


@pytest.mark.parametrize("shape_id", list(SHAPES))
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name, params", SETTINGS, ids=[f"{n}{p or ''}" for n, p in SETTINGS])
def test_cost_counts_the_matmuls_done(name: str, params: dict, causal: bool, shape_id: str) -> None:
    variant = registry.create(name, **params)
    batch, heads, n_q, n_k, head_dim, value_dim = SHAPES[shape_id]
    reason = variant.unsupported_reason(
        device="cpu", dtype=torch.float32, causal=causal, padded=False, n_q=n_q, n_k=n_k
    )
    if reason is not None:
        pytest.skip(reason)
    if variant.hparams.get("backend") == FLEX_BACKEND:
        pytest.skip("the flex backend runs compiled kernels that FlopCounterMode does not see")
    cost = variant.cost(cost_shape(shape_id, causal))
    if cost.matmul_flops is None:
        assert not type(variant).__module__.startswith("attnbench."), f"built-in {name} gives no matmul_flops"
        pytest.skip(f"{name}'s cost model gives no matmul_flops")

    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(batch, heads, n, head_dim, generator=generator) for n in (n_q, n_k))
    v = torch.randn(batch, heads, n_k, value_dim, generator=generator)
    with torch.no_grad():
        counted = count_matmul_flops(lambda: variant(q, k, v, causal=causal))

    tolerance = DATA_DEPENDENT_TOLERANCE.get((name, causal), TOLERANCE)
    assert cost.matmul_flops == pytest.approx(counted, rel=tolerance), (
        f"{variant.label()} causal={causal} {shape_id}: modelled {cost.matmul_flops:.4g} matmul FLOPs, "
        f"counted {counted:.4g} ({cost.matmul_flops / counted - 1:+.1%})"
    )
    assert cost.flops >= cost.matmul_flops
    assert cost.needed_flops <= cost.flops  # the method's work is never more than the call does
    if cost.useful_flops is not None and getattr(variant, "exact", False) and n_q == n_k:  # a support to count
        support = int(variant.support_mask(n_q, n_k, causal).sum()) * batch * heads
        assert cost.useful_flops == pytest.approx(sum(softmax_attention_flops(support, cost_shape(shape_id, causal))))


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("n, window, block", [(1, 3, None), (75, 5, None), (100, 7, 12), (300, 64, None), (37, 200, 8)])
def test_band_needs_exactly_its_supports_pairs(n: int, window: int, block: int | None, causal: bool) -> None:
    """The band's useful FLOPs count the pairs of its support mask, not its padded blocks: the roofline of the
    method, against which block padding counts as the implementation's."""
    from attnbench.variants.window import band_layout

    variant = registry.create("band", window=window, block_size=block)
    support = int(variant.support_mask(n, n, causal).sum())
    assert band_layout(n, window, causal, block).pairs(n, causal) == support
    shape = Shape(2, 3, n, n, 16, 16, causal=causal)
    assert variant.cost(shape).useful_flops == pytest.approx(sum(softmax_attention_flops(6 * support, shape)))


@pytest.mark.parametrize("value_dim", [16, 24])  # 24: no fused CPU kernel, the math path's bmm instead
@pytest.mark.parametrize("causal", [False, True])
def test_count_includes_fused_attention(causal: bool, value_dim: int) -> None:
    """SDPA's fused CPU kernel is counted, a causal call for the pairs j <= i it computes."""
    q, k = torch.randn(2, 3, 50, 16), torch.randn(2, 3, 50, 16)
    v = torch.randn(2, 3, 50, value_dim)
    with torch.no_grad():
        counted = count_matmul_flops(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    pairs = causal_pairs(50, 50) if causal and value_dim == 16 else 50 * 50
    assert counted == 2 * 2 * 3 * pairs * (16 + value_dim)
