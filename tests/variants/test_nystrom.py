"""Nyströmformer: its limiting case is softmax attention, its pseudo-inverse is one, its landmarks are segment means,
and its error falls as landmarks are added."""

from __future__ import annotations

import pytest
import torch
from attnbench.inputs.catalogue import make_inputs
from attnbench.measure.metrics import error_metrics
from attnbench.measure.reference import exact_reference
from attnbench.ops import allowed_keys, dense_masked_attention, padding_mask
from attnbench.registry import registry
from attnbench.variants.blocks import segment_means
from attnbench.variants.nystrom import iterative_pinv


def qkv(n: int, b: int = 2, h: int = 2, d: int = 16, n_k: int | None = None, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(b, h, n_k or n, d, generator=generator, dtype=torch.float64) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("n", [37, 64])
@pytest.mark.parametrize("padded", [False, True])
def test_with_a_landmark_per_token_and_the_exact_inverse_it_is_softmax_attention(n: int, padded: bool) -> None:
    """F̃ Ã⁺ B̃ = S S⁺ S = S when every token is its own landmark (the paper's limiting case)."""
    variant = registry.create("nystromformer", landmarks=n, pinv_iterations=0)
    q, k, v = qkv(n)
    mask = padding_mask(2, n, 0.5) if padded else None
    expected = dense_masked_attention(q, k, v, allowed_keys(n, n, causal=False, key_padding_mask=mask))
    torch.testing.assert_close(variant(q, k, v, causal=False, key_padding_mask=mask), expected, rtol=0, atol=1e-8)


def test_the_iteration_converges_to_the_moore_penrose_inverse() -> None:
    """Ã is a row-stochastic softmax matrix; each iteration brings Z closer to Ã⁺ (eq. 9 converges cubically)."""
    q, k, _ = qkv(16, b=1, h=3)
    a = torch.softmax(q @ k.transpose(-1, -2) / 4, dim=-1)  # (1, 3, 16, 16)
    exact = torch.linalg.pinv(a)
    errors = [(iterative_pinv(a, steps) - exact).abs().max().item() for steps in (2, 4, 6, 12, 20)]
    assert all(later <= earlier for earlier, later in zip(errors, errors[1:])), errors
    z = iterative_pinv(a, 20)
    torch.testing.assert_close(a @ z @ a, a, rtol=0, atol=1e-8)  # the Penrose conditions
    torch.testing.assert_close(z @ a @ z, z, rtol=0, atol=1e-6)


def test_landmarks_are_means_of_contiguous_segments_of_the_real_positions() -> None:
    weights = segment_means(3, 10)  # segments [0,3) [3,6) [6,10)
    segments = [[1] * 3 + [0] * 7, [0] * 3 + [1] * 3 + [0] * 4, [0] * 6 + [1] * 4]
    assert torch.equal(weights > 0, torch.tensor(segments).bool())
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(3, dtype=torch.float64))
    real = torch.tensor([[True] * 4 + [False] * 6])  # only the first 4 positions are real
    padded = segment_means(3, 10, real)[0]
    assert padded[0].tolist()[:3] == [1 / 3] * 3 and padded[1, 3] == 1 and padded[2].sum() == 0  # an empty segment


def test_error_falls_as_landmarks_are_added() -> None:
    inputs = make_inputs("realistic", {}, batch=1, heads=8, seq_len=512, head_dim=64, dtype=torch.float64,
                         device=torch.device("cpu"), seed=0)  # fmt: skip
    reference = exact_reference(inputs.q, inputs.k, inputs.v, causal=False, key_padding_mask=None)
    errors = []
    for landmarks in (8, 32, 128, 512):
        variant = registry.create("nystromformer", landmarks=landmarks, pinv_iterations=0 if landmarks == 512 else 6)
        out = variant(inputs.q, inputs.k, inputs.v, causal=False, key_padding_mask=None)
        errors.append(error_metrics(out, reference).vs_uniform)
    assert errors[0] > errors[1] > errors[2] > errors[3] and errors[3] < 1e-6, errors


def test_the_conv_skip_is_seeded_and_added_to_the_approximation() -> None:
    q, k, v = qkv(40)
    plain = registry.create("nystromformer", landmarks=8)
    conv_a, conv_b = (registry.create("nystromformer", landmarks=8, conv_kernel=5, seed=s) for s in (1, 1))
    other = registry.create("nystromformer", landmarks=8, conv_kernel=5, seed=2)
    skip = conv_a(q, k, v) - plain(q, k, v)
    assert skip.abs().max() > 0 and torch.equal(conv_a(q, k, v), conv_b(q, k, v))
    assert not torch.equal(conv_a(q, k, v), other(q, k, v))
    assert conv_a.unsupported_reason(device="cpu", dtype="float32", causal=False, padded=False, n_q=8, n_k=9)


def test_gradients_match_finite_differences() -> None:
    variant = registry.create("nystromformer", landmarks=4)
    q, k, v = (t[:1, :1, :9, :4].clone().requires_grad_() for t in qkv(9))
    mask = padding_mask(1, 9, 0.3)
    assert torch.autograd.gradcheck(lambda q, k, v: variant(q, k, v, key_padding_mask=mask), (q, k, v))
