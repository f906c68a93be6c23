"""Performer and linear attention in their corners: an unbiased estimate (tested for bias, not only for
shape), no dependence on a denominator floor, padding anywhere, and exact causal gradients.

b - batch, h - heads, n - position, d - head dim
"""

from __future__ import annotations

import math

import pytest
import torch
from attnbench.measure.reference import exact_reference
from attnbench.registry import registry
from attnbench.variants.linear import orthogonal_features


def qkv(n: int, *, d: int = 16, scale: float = 1.0, seed: int = 0, dtype=torch.float64) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, n, d, generator=generator, dtype=torch.float64) for _ in range(3))
    return [(q * scale).to(dtype), (k * scale).to(dtype), v.to(dtype)]


def test_orthogonal_directions_are_uniform_on_the_sphere() -> None:
    """Direction i of a block has its own coordinate i positive half of the time (QR's Q alone: ~never)."""
    d, draws = 8, 400
    generator = torch.Generator().manual_seed(0)
    diagonal = torch.stack([torch.diagonal(orthogonal_features(d, d, generator)) for _ in range(draws)])
    negative_share = (diagonal < 0).double().mean().item()
    standard_error = math.sqrt(0.25 / (draws * d))
    assert abs(negative_share - 0.5) < 4 * standard_error, negative_share
    block = orthogonal_features(d, d, generator)
    directions = block / block.norm(dim=1, keepdim=True)
    torch.testing.assert_close(directions @ directions.T, torch.eye(d, dtype=torch.float64))


def test_performer_is_an_unbiased_estimate_of_softmax_weights() -> None:
    """One query on four keys (+e0, -e0, +e1, -e1) with V = identity: the output is the implied attention
    weights. Over 24 seeds their mean must sit within a few standard errors of softmax's (it sat ~6 above
    on -e0 when QR's signs went uncorrected)."""
    d = 16
    s = d**0.25
    q = torch.zeros(1, 1, 1, d, dtype=torch.float64)
    q[..., 0, 0] = s
    k = torch.zeros(1, 1, 4, d, dtype=torch.float64)
    k[0, 0, 0, 0], k[0, 0, 1, 0], k[0, 0, 2, 1], k[0, 0, 3, 1] = s, -s, s, -s
    v = torch.eye(4, dtype=torch.float64)[None, None]
    softmax = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)[0, 0, 0]
    weights = torch.stack(
        [registry.create("performer", features=8192, seed=seed)(q, k, v)[0, 0, 0] for seed in range(24)]
    )
    z = (weights.mean(0) - softmax) / (weights.std(0) / math.sqrt(len(weights)))
    assert z.abs().max() < 4, z


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_performer_output_does_not_depend_on_a_denominator_floor(causal: bool, grad: bool) -> None:
    """q, k scaled x4 (d=64, N=256): stabilized denominators are legitimately tiny and must be divided as they
    are (a floor of 1e-6 moved the output by ~75%)."""
    q, k, v = qkv(256, d=64, scale=4.0)
    if grad:
        q.requires_grad_()
    variant = registry.create("performer", features=64, chunk_size=32)
    out = variant(q, k, v, causal=causal)
    torch.testing.assert_close(out, performer_reference(variant, q, k, v, causal), rtol=1e-7, atol=1e-9)


def performer_reference(variant, q, k, v, causal: bool, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The quadratic form phi(Q) phi(K)^T in float64, each side shifted by its max (the shift cancels in the
    ratio), masked, normalized per query; a query that sees no key outputs zeros. No floor anywhere."""
    q, k, v = q.detach().double(), k.detach().double(), v.double()
    w = variant.projection(q.shape[-1], q.device, q.dtype)  # (m, d), d^(-1/4) folded in
    log_q, log_k = (x @ w.T - (x * x.shape[-1] ** -0.25).square().sum(-1, keepdim=True) / 2 for x in (q, k))
    allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if mask is not None:
        allowed = allowed & ~mask[:, None, None, :]
        log_k = log_k.masked_fill(mask[:, None, :, None], float("-inf"))
    top = log_k.amax(dim=(-2, -1), keepdim=True).nan_to_num(0.0, neginf=0.0)
    scores = (log_q - log_q.amax(-1, keepdim=True)).exp() @ (log_k - top).exp().transpose(-1, -2)
    scores = scores * allowed
    total = scores.sum(-1, keepdim=True)
    return torch.where(total > 0, (scores @ v) / torch.where(total > 0, total, 1.0), 0.0)


@pytest.mark.parametrize("where", ["start", "middle", "end", "all"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_performer_padding_anywhere(where: str, causal: bool, grad: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Padding at the start, middle, end, or every key of one batch element; float32 against float64.
    Non-causal without grad runs the streamed path in blocks (64 here): a fully padded leading block with large
    keys after it (x7) made it floor its running max at 0, and every later key underflowed (outputs ~1e-23
    instead of ~3)."""
    import attnbench.variants.linear as linear_module

    monkeypatch.setattr(linear_module, "STREAM_BLOCK", 64)
    n = 300
    large = where == "start" and not causal  # causal float32 at x7 underflows whole rows: the estimator's limit
    q, k, v = qkv(n, scale=7.0 if large else 1.0, dtype=torch.float32)
    if grad:
        q.requires_grad_()
    padded = {
        "start": torch.arange(n) < 130,  # two whole streamed blocks and part of a third
        "middle": (torch.arange(n) >= n // 3) & (torch.arange(n) < 2 * n // 3),
        "end": torch.arange(n) >= 2 * n // 3,
        "all": torch.ones(n, dtype=torch.bool),
    }[where]
    mask = torch.stack([padded, torch.zeros(n, dtype=torch.bool)])  # element 1 unpadded
    variant = registry.create("performer", features=32, chunk_size=64)
    out = variant(q, k, v, causal=causal, key_padding_mask=mask)
    assert torch.isfinite(out).all()
    expected = performer_reference(variant, q, k, v, causal, mask)
    torch.testing.assert_close(out.double(), expected, rtol=2e-3, atol=2e-4)
    if large:
        assert out[0].abs().mean() > 0.1  # not underflowed to ~0


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_queries_that_see_no_key_output_zeros_with_zero_gradient(name: str) -> None:
    """Left padding, causal: queries 0-8 see no key. They output 0 and send no gradient anywhere, and the
    gradients of float32 agree with float64 (a floor 1/eps and cumsum - chunk_sums made dv off by ~1.0)."""
    n = 128
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[:, :9] = True
    grads = {}
    for dtype in (torch.float32, torch.float64):
        q, k, v = (t.requires_grad_() for t in qkv(n, dtype=dtype))
        out = registry.create(name, chunk_size=64)(q, k, v, causal=True, key_padding_mask=mask)
        assert torch.equal(out[:, :, :9], torch.zeros_like(out[:, :, :9]))
        cotangent = torch.ones_like(out)
        grads[dtype] = torch.autograd.grad(out, (q, k, v), cotangent)
    for low, high in zip(grads[torch.float32], grads[torch.float64]):
        scale = high.abs().max().item()
        assert (low.double() - high).abs().max().item() < 1e-4 * max(scale, 1.0)


@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("chunk", [16, 64])
def test_causal_outputs_are_bit_identical_when_a_later_token_changes(name: str, chunk: int) -> None:
    """Not close: identical. A later key or value may not even move the rounding of an earlier output."""
    n, t = 160, 70
    q, k, v = qkv(n, dtype=torch.float32)
    k_changed, v_changed = k.clone(), v.clone()
    k_changed[:, :, t + 1 :] += 0.5
    v_changed[:, :, t + 1 :] -= 2.0
    variant = registry.create(name, chunk_size=chunk)
    before = variant(q, k, v, causal=True)[:, :, : t + 1]
    after = variant(q, k_changed, v_changed, causal=True)[:, :, : t + 1]
    assert torch.equal(before, after)


def test_linear_limiting_case_constant_features_is_uniform_averaging() -> None:
    """Identical keys make every weight equal: linear attention is then the mean of the visible values
    (causal: the running mean), exactly as softmax is."""
    q, _, v = qkv(50)
    k = torch.ones_like(q)
    out = registry.create("linear")(q, k, v, causal=True)
    running_mean = v.cumsum(dim=-2) / torch.arange(1, 51, dtype=torch.float64)[:, None]
    torch.testing.assert_close(out, running_mean)
    reference = exact_reference(q, k, v, causal=True, key_padding_mask=None).output
    torch.testing.assert_close(out, reference)  # equal keys: softmax is uniform too
