"""Linformer, linear and Performer against references written here: limiting cases, naive quadratic forms,
causality (including through the stabilizer) and error falling with the number of random features."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attnbench.measure.metrics import error_metrics
from attnbench.measure.reference import exact_reference
from attnbench.registry import registry


def qkv(n: int, b: int = 2, h: int = 2, d: int = 16, seed: int = 0, grad: bool = False) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(b, h, n, d, generator=generator, dtype=torch.float64) for _ in range(3)]
    return [t.requires_grad_() for t in tensors] if grad else tensors


def padding(b: int, n: int) -> torch.Tensor:
    return torch.arange(n)[None, :] >= torch.tensor([n - n // 3, n])[:b, None]


@pytest.mark.parametrize("projection", ["identity", "pool"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("n_q", [100, 37])
def test_linformer_with_k_equal_n_is_full_attention(projection: str, padded: bool, n_q: int) -> None:
    n = 100
    q = qkv(n_q, seed=1)[0]
    _, k, v = qkv(n)
    mask = padding(2, n) if padded else None
    variant = registry.create("linformer", k=n, projection=projection)
    expected = exact_reference(q, k, v, causal=False, key_padding_mask=mask).output
    torch.testing.assert_close(variant(q, k, v, key_padding_mask=mask), expected, rtol=0, atol=1e-12)


def test_linformer_padded_keys_do_not_leak_into_the_projection() -> None:
    n = 120
    q, k, v = qkv(n)
    k2, v2 = qkv(n, seed=5)[1:]
    mask = padding(2, n)
    padded = mask[:, None, :, None]
    for projection in ("random", "pool"):
        variant = registry.create("linformer", k=16, projection=projection, share_heads=False)
        before = variant(q, k, v, key_padding_mask=mask)
        after = variant(q, torch.where(padded, k2, k), torch.where(padded, v2, v), key_padding_mask=mask)
        torch.testing.assert_close(before, after, rtol=0, atol=1e-12)


def test_linformer_random_projection_with_padding_is_exact_in_float64() -> None:
    """Padded keys leave the random projection, rescaled by sqrt(n / n_real): computed in the input's dtype
    (it was float32, so float64 results were off by ~1e-7)."""
    n = 90
    q, k, v = qkv(n)
    mask = padding(2, n)
    variant = registry.create("linformer", k=16)
    e, f = variant.projections(n, 2, torch.device("cpu"), torch.float64)  # (1, r, n)
    real = (~mask).double()[:, None, None, :]  # (b, 1, 1, n)
    scale = (n / real.sum(-1, keepdim=True)).sqrt()
    keys = torch.einsum("bhrn,bhnd->bhrd", e[None] * real * scale, k)
    values = torch.einsum("bhrn,bhnd->bhrd", f[None] * real * scale, v)
    expected = F.scaled_dot_product_attention(q, keys, values)
    torch.testing.assert_close(variant(q, k, v, key_padding_mask=mask), expected, rtol=0, atol=1e-12)


def test_linformer_refuses_causal_with_the_reason() -> None:
    reason = registry.create("linformer").unsupported_reason(
        device="cpu", dtype="float32", causal=True, padded=False, n_q=8, n_k=8
    )
    assert reason is not None and "mixes future tokens" in reason


def test_linformer_random_projection_is_seeded_and_keeps_the_key_scale() -> None:
    variant = registry.create("linformer", k=64, seed=3)
    e, f = variant.projections(4096, 1, torch.device("cpu"), torch.float64)
    assert torch.equal(
        e, registry.create("linformer", k=64, seed=3).projections(4096, 1, torch.device("cpu"), torch.float64)[0]
    )
    assert not torch.equal(e, f)  # separate E and F unless share_kv
    assert e.square().sum(-1).mean().item() == pytest.approx(1.0, rel=0.05)  # rows of unit norm on average


def naive_feature_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """The quadratic form: (phi(Q) phi(K)^T, masked) normalized by its row sums."""
    scores = phi_q @ phi_k.transpose(-1, -2)
    if causal:
        scores = scores.tril()
    return (scores @ v) / scores.sum(-1, keepdim=True)


def performer_features(variant, x: torch.Tensor) -> torch.Tensor:
    w = variant.projection(x.shape[-1], x.device, x.dtype)  # d^(-1/4) folded in
    return torch.exp(x @ w.T - (x * x.shape[-1] ** -0.25).square().sum(-1, keepdim=True) / 2)


@pytest.mark.parametrize("chunk", [1, 7, 16, 200])
@pytest.mark.parametrize("causal", [False, True])
def test_linear_equals_the_naive_quadratic_form(chunk: int, causal: bool) -> None:
    q, k, v = qkv(100, grad=True)
    variant = registry.create("linear", chunk_size=chunk)
    out = variant(q, k, v, causal=causal)
    expected = naive_feature_attention(F.elu(q) + 1, F.elu(k) + 1, v, causal)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    cotangent = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, (q, k, v), cotangent), torch.autograd.grad(expected, (q, k, v), cotangent)
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("chunk", [1, 16, 33])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_performer_equals_the_naive_quadratic_form(chunk: int, causal: bool, grad: bool) -> None:
    q, k, v = qkv(100, grad=grad)
    variant = registry.create("performer", features=48, chunk_size=chunk)
    expected = naive_feature_attention(performer_features(variant, q), performer_features(variant, k), v, causal)
    torch.testing.assert_close(variant(q, k, v, causal=causal), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_padded_keys_leave_numerator_and_denominator(name: str) -> None:
    q, k, v = qkv(90)
    mask = padding(2, 90)
    variant = registry.create(name)
    for causal in (False, True):
        out = variant(q, k, v, causal=causal, key_padding_mask=mask)
        # element 0 without its padded tail must give the same outputs for its first 60 queries
        trimmed = variant(q[:1, :, :60], k[:1, :, :60], v[:1, :, :60], causal=causal)
        torch.testing.assert_close(out[:1, :, :60], trimmed, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_causal_outputs_ignore_later_tokens_even_huge_ones(name: str) -> None:
    # later keys 300x larger and values of 100: nothing of them may reach an earlier output
    n, t = 96, 40
    q, k, v = qkv(n)
    k_changed, v_changed = k.clone(), v.clone()
    k_changed[:, :, t + 1 :] *= 300
    v_changed[:, :, t + 1 :] = 100.0
    variant = registry.create(name, chunk_size=16)
    before = variant(q, k, v, causal=True)[:, :, : t + 1]
    after = variant(q, k_changed, v_changed, causal=True)[:, :, : t + 1]
    torch.testing.assert_close(before, after, rtol=0, atol=1e-12)


def test_performer_causal_stabilizer_uses_only_earlier_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scale each key's features are taken against must not depend on later keys (a max over the whole
    sequence would: outputs then differ only by rounding in float32/64, but underflow in low precision)."""
    import attnbench.variants.linear as linear_module

    seen = []
    original = linear_module.causal_feature_attention

    def spy(*args, **kwargs):
        seen.append(kwargs["key_log_scale"].clone())
        return original(*args, **kwargs)

    monkeypatch.setattr(linear_module, "causal_feature_attention", spy)
    n, t = 64, 20
    q, k, v = qkv(n, d=8)
    k_changed = k.clone()
    k_changed[:, :, t + 1 :] = 4 * torch.ones(8)  # later keys whose features are the largest of all
    variant = registry.create("performer", features=32)
    variant(q, k, v, causal=True)
    variant(q, k_changed, v, causal=True)
    assert not torch.equal(seen[0], seen[1])  # the later keys did raise the scale from t + 1 on
    torch.testing.assert_close(seen[0][..., : t + 1], seen[1][..., : t + 1], rtol=0, atol=0)


def test_performer_error_falls_with_more_features() -> None:
    """On the default input (gaussian, temperature 1, d=64), for every seed, m=1024 beats m=64."""
    from attnbench.inputs.catalogue import make_inputs

    errors = {64: [], 1024: []}
    for seed in range(4):
        inputs = make_inputs(
            "gaussian",
            {},
            batch=1,
            heads=4,
            seq_len=1024,
            head_dim=64,
            dtype=torch.float64,
            device=torch.device("cpu"),
            seed=seed,
        )
        reference = exact_reference(inputs.q, inputs.k, inputs.v, causal=False, key_padding_mask=None)
        for features in errors:
            out = registry.create("performer", features=features, seed=seed)(inputs.q, inputs.k, inputs.v)
            errors[features].append(error_metrics(out, reference).vs_uniform)
    assert all(many < few for many, few in zip(errors[1024], errors[64])), errors
    assert sum(errors[1024]) < 0.85 * sum(errors[64]), errors


def test_linformer_identity_projection_does_not_claim_subquadratic_memory() -> None:
    assert registry.create("linformer").supports.subquadratic_memory
    assert not registry.create("linformer", projection="identity").supports.subquadratic_memory
