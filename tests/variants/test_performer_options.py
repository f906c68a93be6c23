"""Performer's options for the paper's comparisons: iid instead of orthogonal directions, and trigonometric instead
of positive features (both unbiased estimates of the softmax kernel; the trigonometric one is not positive)."""

from __future__ import annotations

import torch
from attnbench.registry import registry
from attnbench.variants.feature_attention import normalized


def test_iid_directions_are_not_orthogonal_and_the_default_still_is() -> None:
    orthogonal = registry.create("performer", features=16).projection(16, torch.device("cpu"), torch.float64)
    iid = registry.create("performer", features=16, orthogonal=False).projection(16, torch.device("cpu"), torch.float64)
    off_diagonal = ~torch.eye(16, dtype=torch.bool)
    assert (orthogonal @ orthogonal.T)[off_diagonal].abs().max() < 1e-9
    assert (iid @ iid.T)[off_diagonal].abs().max() > 0.1


def test_both_kernels_converge_to_softmax_attention_with_many_features() -> None:
    """Small logits (where trigonometric features are well behaved): with 8192 features both estimates are close."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (0.5 * torch.randn(1, 2, 64, 16, generator=generator, dtype=torch.float64) for _ in range(3))
    expected = registry.create("full")(q, k, v)
    for kernel in ("positive", "trig"):
        for causal in (False, True):
            out = registry.create("performer", features=8192, kernel=kernel)(q, k, v, causal=causal)
            reference = registry.create("full")(q, k, v, causal=causal) if causal else expected
            assert ((out - reference).norm() / reference.norm()) < 0.1, (kernel, causal)


def test_trigonometric_kernel_values_are_unbiased() -> None:
    """The mean of exp(|q'|^2/2 + |k'|^2/2) [sin, cos](w.q') . [sin, cos](w.k') / m over seeds is exp(q'.k')."""
    generator = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 1, 1, 8, generator=generator, dtype=torch.float64) * 0.7 for _ in range(2))
    estimates = []
    for seed in range(400):
        variant = registry.create("performer", features=64, kernel="trig", seed=seed)
        w = variant.projection(8, torch.device("cpu"), torch.float64)  # (m, d), d^(-1/4) folded in
        aq, ak = q.reshape(-1) @ w.T, k.reshape(-1) @ w.T
        phi = lambda a: torch.cat([a.sin(), a.cos()])  # noqa: E731
        scale = ((q.square().sum() + k.square().sum()) * 8**-0.5 / 2).exp()
        estimates.append(float(phi(aq) @ phi(ak) / 64 * scale))
    exact = float((q.reshape(-1) @ k.reshape(-1) * 8**-0.5).exp())
    mean = sum(estimates) / len(estimates)
    spread = (sum((e - mean) ** 2 for e in estimates) / (len(estimates) - 1)) ** 0.5 / len(estimates) ** 0.5
    assert abs(mean - exact) < 4 * spread, (mean, exact, spread)


def test_a_negative_denominator_is_divided_as_it_is() -> None:
    total = torch.tensor([[2.0, -4.0], [1.0, 0.0]])  # numerator, denominator
    assert torch.equal(normalized(total), torch.tensor([[-0.5], [0.0]]))
