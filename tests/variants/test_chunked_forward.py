"""The sparse forwards cut into chunks of query blocks (issue 58: the memory of a chunk, not of the sequence) are the
same attention: band, band with sinks and global tokens, and strided's band part, with chunks of a few blocks, at
lengths that are not a multiple of the block, with key padding, causal or not, and under autograd (the chunks
concatenated) as without it (written into one output)."""

from __future__ import annotations

import pytest
import torch
from attnbench.measure.memory import peak_memory
from attnbench.ops import dense_masked_attention
from attnbench.registry import registry
from attnbench.variants import window
from attnbench.variants.window import band_layout, segments


def band_support(n: int, w: int, causal: bool, sinks: int = 0, global_tokens: int = 0) -> torch.Tensor:
    """(n, n): |i - j| <= w (causal: 0 <= i - j <= w), keys below max(sinks, global_tokens) for every query, every key
    for the first global_tokens queries; causal keeps j <= i throughout."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = (i - j).abs() <= w
    allowed |= (j < max(sinks, global_tokens)) | (i < global_tokens)
    return allowed & (j <= i) if causal else allowed


def inputs(n: int, grad: bool) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(n)
    q, k, v = (
        torch.randn(2, 3, n, 8, generator=generator, dtype=torch.float64, requires_grad=grad) for _ in range(3)
    )
    padding = torch.zeros(2, n, dtype=torch.bool)
    padding[0, : n // 5] = True  # element 0: padded at the start (the first chunk's windows) and the end
    padding[0, n - n // 6 :] = True
    return q, k, v, padding


@pytest.mark.parametrize("rows", [1, 6 * 16 * 3])  # one block of all heads a chunk; three blocks
@pytest.mark.parametrize(
    "n, w, sinks, global_tokens", [(300, 40, 0, 0), (333, 50, 4, 0), (200, 17, 3, 5), (70, 90, 2, 0)]
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_band_in_chunks_matches_the_dense_reference(
    monkeypatch: pytest.MonkeyPatch, rows: int, n: int, w: int, sinks: int, global_tokens: int, causal: bool,
    padded: bool,
) -> None:  # fmt: skip
    monkeypatch.setattr(window, "CHUNK_ROWS", rows)
    variant = registry.create("band", window=w, block_size=16, sinks=sinks, global_tokens=global_tokens)
    q, k, v, padding = inputs(n, grad=False)
    mask = padding if padded else None
    allowed = band_support(n, w, causal, sinks, global_tokens)[None, None]
    if padded:
        allowed = allowed & ~padding[:, None, None, :]
    with torch.no_grad():
        out = variant(q, k, v, causal=causal, key_padding_mask=mask)
    torch.testing.assert_close(out, dense_masked_attention(q, k, v, allowed), rtol=0, atol=1e-10)


@pytest.mark.parametrize("sinks", [0, 3])
def test_band_in_chunks_under_autograd_has_the_reference_gradients(
    monkeypatch: pytest.MonkeyPatch, sinks: int
) -> None:
    monkeypatch.setattr(window, "CHUNK_ROWS", 6 * 16 * 2)
    variant = registry.create("band", window=20, block_size=16, sinks=sinks, global_tokens=1)
    q, k, v, padding = inputs(150, grad=True)
    allowed = band_support(150, 20, True, sinks, 1)[None, None] & ~padding[:, None, None, :]
    out = variant(q, k, v, causal=True, key_padding_mask=padding)
    expected = dense_masked_attention(q, k, v, allowed)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)
    cotangent = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), cotangent)
    for mine, want in zip(got, torch.autograd.grad(expected, (q, k, v), cotangent)):
        torch.testing.assert_close(mine, want, rtol=0, atol=1e-9)


def test_strideds_band_part_in_chunks_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v, padding = inputs(257, grad=False)
    strided = registry.create("strided", stride=16)
    with torch.no_grad():
        whole = strided(q, k, v, causal=True, key_padding_mask=padding)
        monkeypatch.setattr(window, "CHUNK_ROWS", 1)
        chunked = strided(q, k, v, causal=True, key_padding_mask=padding)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n, w, causal", [(1000, 64, False), (1000, 64, True), (1023, 100, True), (40, 60, False)])
def test_segments_cover_every_block_once_and_each_reads_every_key_it_needs(n: int, w: int, causal: bool) -> None:
    """A block whose own window would reach past an end shares that end's window, inside the sequence and holding
    every key the block needs; the others read their own window, inside the sequence (or padded, in a sequence
    shorter than a window)."""
    layout = band_layout(n, w, causal, 16)
    parts = segments(n, layout)
    assert parts[0].first == 0 and parts[-1].last == -(-n // layout.block)
    assert all(before.last == after.first for before, after in zip(parts, parts[1:]))
    for part in parts:
        for c in range(part.first, part.last):
            low, high = c * layout.block - layout.window, (c + 1) * layout.block + layout.after  # its own window
            if part.keys_from is None:
                assert n < layout.span or (low >= 0 and high <= n)
            else:
                assert 0 <= part.keys_from <= max(low, 0) and min(high, n) <= part.keys_from + layout.span <= n


@pytest.mark.slow
@pytest.mark.parametrize("params", [{"window": 256}, {"window": 256, "sinks": 4}])
@pytest.mark.parametrize("causal", [False, True])
def test_band_peaks_no_higher_than_exact_attention(params: dict, causal: bool) -> None:
    """Issue 58's target at N=8192 (B=1, H=8, D=64, float32): a chunk's output is the working memory, so the band's
    peak (the CPU allocator's, kernels' scratch included) stays at or below the fused exact kernel's."""
    q, k, v = (torch.randn(1, 8, 8192, 64) for _ in range(3))
    peaks = {}
    for name, options in [("full", {}), ("band", params)]:
        variant = registry.create(name, **options)
        with torch.no_grad():
            variant(q, k, v, causal=causal)  # warm: a pattern kept between calls is not per-call memory
            peaks[name] = peak_memory(lambda: variant(q, k, v, causal=causal), torch.device("cpu"), (q, k, v))[0]
    assert peaks["band"] <= peaks["full"], f"band {peaks['band'] / 2**20:.1f} MiB, full {peaks['full'] / 2**20:.1f} MiB"
