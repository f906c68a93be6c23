"""The exact baselines agree with each other and with the float64 reference, options included."""

from __future__ import annotations

import pytest
import torch
from attnbench.inputs.catalogue import padding_mask
from attnbench.interface import UnsupportedOptionError
from attnbench.measure.reference import exact_reference
from attnbench.registry import registry


def qkv(n_q: int, n_k: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    shapes = [(2, 3, n_q, 32), (2, 3, n_k, 32), (2, 3, n_k, 40)]
    return [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]


@pytest.mark.parametrize("name", ["full", "full-math"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_exact_baselines_match_reference(name: str, causal: bool, padded: bool) -> None:
    q, k, v = qkv(131, 131)
    mask = padding_mask(2, 131, 0.4) if padded else None
    out = registry.create(name)(q, k, v, causal=causal, key_padding_mask=mask)
    expected = exact_reference(q, k, v, causal=causal, key_padding_mask=mask).output
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["full", "full-math"])
def test_cross_attention(name: str) -> None:
    q, k, v = qkv(19, 57)
    out = registry.create(name)(q, k, v)
    expected = exact_reference(q, k, v, causal=False, key_padding_mask=None).output
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["full", "full-math"])
def test_a_query_that_sees_nothing_outputs_zeros_and_no_nan_gradient(name: str) -> None:
    q, k, v = (t.requires_grad_() for t in qkv(16, 16))
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[1, :5] = True  # causal queries 0..4 of element 1 see only padding
    out = registry.create(name)(q, k, v, causal=True, key_padding_mask=mask)
    assert torch.all(out[1, :, :5] == 0)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_causal_needs_equal_lengths() -> None:
    q, k, v = qkv(8, 12)
    with pytest.raises(UnsupportedOptionError, match="causal attention needs Nq == Nk"):
        registry.create("full")(q, k, v, causal=True)


def test_xformers_is_unsupported_on_cpu_with_a_reason() -> None:
    variant = registry.create("full-xformers")
    reason = variant.unsupported_reason(device="cpu", dtype="float32", causal=False, padded=False, n_q=8, n_k=8)
    assert reason is not None and "no CPU kernels" in reason
    with pytest.raises(UnsupportedOptionError):
        variant(*qkv(8, 8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: xformers has no CPU kernels")
@pytest.mark.parametrize("causal", [False, True])
def test_all_three_agree_on_cuda(causal: bool) -> None:
    q, k, v = (t.cuda() for t in qkv(257, 257))
    outputs = [registry.create(name)(q, k, v, causal=causal) for name in ("full", "full-math", "full-xformers")]
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0], rtol=2e-3, atol=2e-3)
