"""The float64 reference, the error metrics and the memory tracker, against things known by construction."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attnbench.inputs.catalogue import make_inputs, padding_mask
from attnbench.measure.memory import LiveTensorPeak, peak_memory
from attnbench.measure.metrics import error_metrics
from attnbench.measure.reference import exact_reference
from attnbench.ops import allowed_keys, dense_masked_attention, rows_with_visible_key


def qkv(b: int = 2, h: int = 2, n: int = 50, d: int = 8, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=generator, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk", [1 << 24, 7 * 50 * 4])  # one chunk, and ragged chunks of 7 queries
def test_reference_matches_sdpa_in_any_chunking(causal: bool, chunk: int) -> None:
    q, k, v = qkv()
    reference = exact_reference(q, k, v, causal=causal, key_padding_mask=None, max_chunk_elements=chunk)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(reference.output, expected, rtol=0, atol=1e-12)


def test_reference_uniform_baseline_is_the_mean_of_visible_values() -> None:
    q, k, v = qkv(b=2, n=10)
    mask = padding_mask(2, 10, 0.3)  # element 0: 2 padded keys (round(1.5)), element 1: 3
    reference = exact_reference(q, k, v, causal=True, key_padding_mask=mask, max_chunk_elements=40)
    # causal: query 4 of element 1 sees keys 0..4, all real
    torch.testing.assert_close(reference.uniform[1, :, 4], v[1, :, :5].mean(dim=-2))
    # element 0, last query: sees the 8 real keys
    torch.testing.assert_close(reference.uniform[0, :, 9], v[0, :, :8].mean(dim=-2))


def test_padded_keys_are_ignored_and_rows_that_see_nothing_are_zero() -> None:
    q, k, v = qkv(b=1, n=6)
    mask = torch.tensor([[True, False, False, False, False, True]])  # key 0 padded: causal query 0 sees nothing
    allowed = allowed_keys(6, 6, causal=True, key_padding_mask=mask)
    out = dense_masked_attention(q, k, v, allowed)
    assert torch.all(out[0, :, 0] == 0)
    expected = F.scaled_dot_product_attention(q[:, :, 3:4], k[:, :, 1:4], v[:, :, 1:4])
    torch.testing.assert_close(out[:, :, 3:4], expected)
    visible = rows_with_visible_key(1, 6, causal=True, key_padding_mask=mask)
    assert visible is not None and visible[0, 0, :, 0].tolist() == [False, True, True, True, True, True]
    assert rows_with_visible_key(1, 6, causal=False, key_padding_mask=mask) is None


def test_metrics_read_zero_for_exact_and_one_for_uniform_averaging() -> None:
    q, k, v = qkv()
    reference = exact_reference(q, k, v, causal=False, key_padding_mask=None)
    exact = error_metrics(reference.output.float(), reference)
    assert exact.vs_uniform < 1e-6 and exact.rel_fro < 1e-6 and exact.row_cosine > 0.999999
    uniform = error_metrics(reference.uniform, reference)
    assert uniform.vs_uniform == pytest.approx(1.0)
    assert uniform.max_abs == pytest.approx((reference.uniform - reference.output).abs().max().item())


def test_inputs_are_seeded_and_temperature_sharpens_attention() -> None:
    common = dict(batch=1, heads=2, seq_len=64, head_dim=16, dtype=torch.float32, device=torch.device("cpu"))
    a = make_inputs("gaussian", {}, seed=3, **common)
    b = make_inputs("gaussian", {}, seed=3, **common)
    assert torch.equal(a.q, b.q) and torch.equal(a.v, b.v)
    sharp = make_inputs("gaussian", {"temperature": 0.25}, seed=3, **common)
    torch.testing.assert_close(sharp.q, a.q * 4)


def test_live_tensor_peak_counts_temporaries_and_not_inputs() -> None:
    x = torch.randn(1024, 256)  # 1 MiB input

    def work() -> None:
        a = x * 2  # 1 MiB
        b = a + 1  # 1 MiB: 2 MiB live
        del a
        c = b.view(-1)  # a view: no new memory
        _ = c.sum()

    peak, method, tensors = peak_memory(work, torch.device("cpu"), inputs=(x,))
    assert method == "cpu-allocator-peak"
    assert tensors == pytest.approx(2 * 1024 * 256 * 4, abs=64)
    assert peak == pytest.approx(2 * 1024 * 256 * 4, abs=64)  # ordinary operators: the allocator sees the same


def test_live_tensor_peak_sees_frees_between_steps() -> None:
    with LiveTensorPeak() as tracker:
        for _ in range(5):
            torch.ones(1000, 1000)  # each 4 MB, freed at once
    assert tracker.peak == 4_000_000
    assert tracker.current == 0
