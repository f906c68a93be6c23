"""KIVI's quantized KV cache (`attnbench.variants.quantized`): quantization within half a step of every value, codes
really packed (the bytes counted are the bytes held), the residual flushed by KIVI's rule (a transcription of
llama_kivi.py's branches), and a step equal to exact attention over what the cache dequantizes."""

from __future__ import annotations

import pytest
import torch
from attnbench.interface import VariantError, expand_kv_heads
from attnbench.ops import dense_masked_attention, generate
from attnbench.registry import registry
from attnbench.variants.quantized import KIVI, QuantizedCache, dequantize, pack, quantize, unpack

B, HEADS, KV_HEADS, D, E = 2, 6, 2, 16, 12


def kv(n: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    k = torch.randn(B, KV_HEADS, n, D, generator=generator) * 2 + 0.5
    v = torch.randn(B, KV_HEADS, n, E, generator=generator)
    return k.to(dtype), v.to(dtype)


def per_element(scale: torch.Tensor, group: int, dim: int, length: int) -> torch.Tensor:
    """A group's scale (groups on `dim`) spread over its members: the shape of the quantized tensor."""
    return scale.repeat_interleave(group, dim=dim).narrow(dim, 0, length)


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("dim, length", [(-2, 40), (-2, 37), (-1, 12), (-1, 10)], ids=["tokens", "tokens-ragged",
                                                                                      "channels", "channels-ragged"])
def test_quantization_is_within_half_a_step(bits: int, dim: int, length: int) -> None:
    """|x - x'| <= scale / 2 per element (keys along the tokens, values along the channels, a last group cut short)."""
    x = torch.randn(B, KV_HEADS, length if dim == -2 else 9, length if dim == -1 else 16, generator=torch.Generator().manual_seed(1))
    group = 8
    codes, scale, zero = quantize(x, bits, group, dim)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 2**bits - 1
    assert scale.shape[dim] == -(-length // group) and zero.shape == scale.shape
    error = (dequantize(codes, scale, zero, group, dim) - x).abs()
    assert (error <= per_element(scale, group, dim, length) / 2 * (1 + 1e-5) + 1e-7).all()


def test_a_group_of_equal_values_is_exact() -> None:
    x = torch.full((1, 1, 8, 4), 3.25)
    codes, scale, zero = quantize(x, 2, 8, -2)
    assert (scale == 0).all() and (codes == 0).all() and torch.equal(dequantize(codes, scale, zero, 8, -2), x)


@pytest.mark.parametrize("bits", [4, 2])
def test_codes_are_packed_into_bytes(bits: int) -> None:
    codes = torch.randint(0, 2**bits, (3, 5, 13), dtype=torch.uint8)
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape[-1] == -(-13 * bits // 8)
    assert torch.equal(unpack(packed, bits, 13), codes)


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("n", [37, 10, 32, 0], ids=["awkward", "below-residual", "a-residual-exactly", "empty"])
def test_the_cache_holds_the_prompt_within_half_a_step(bits: int, n: int) -> None:
    """KIVI's prefill: keys quantize the first n - n mod residual tokens, values all but the last residual; the
    residual is exact, the rest within half a step; nothing is quantized below the residual."""
    group, residual = 8, 16
    k, v = kv(n)
    cache = QuantizedCache.of(k, v, bits, group, residual)
    assert cache.keys == n - n % residual and cache.values == max(0, n - residual)
    keys, values = cache.dequantized()
    assert keys.shape == k.shape and values.shape == v.shape
    assert torch.equal(keys[..., cache.keys :, :], k[..., cache.keys :, :])
    assert torch.equal(values[..., cache.values :, :], v[..., cache.values :, :])
    kept_k = cache.key_scales[:, :, : cache.keys // group]
    bound = per_element(kept_k, group, -2, cache.keys) / 2 * (1 + 1e-5) + 1e-7
    assert ((keys - k)[..., : cache.keys, :].abs() <= bound).all()
    kept_v = cache.value_scales[:, :, : cache.values]
    bound = per_element(kept_v, group, -1, E) / 2 * (1 + 1e-5) + 1e-7
    assert ((values - v)[..., : cache.values, :].abs() <= bound).all()


def expected_bytes(cache: QuantizedCache, n: int, element: int) -> int:
    """Codes (packed), scales and zero points (one each per group, in the input's dtype), and the residual."""
    per, group, rows = 8 // cache.bits, cache.group, B * KV_HEADS
    codes = rows * (cache.keys * -(-D // per) + cache.values * -(-E // per))
    scales_and_zeros = 2 * rows * (cache.keys // group * D + cache.values * -(-E // group)) * element
    residual = rows * ((n - cache.keys) * D + (n - cache.values) * E) * element
    return codes + scales_and_zeros + residual


@pytest.mark.parametrize("bits", [4, 2])
def test_bytes_are_codes_scales_zeros_and_residual(bits: int) -> None:
    n = 37
    cache = QuantizedCache.of(*kv(n), bits, 8, 16, room=20)
    assert cache.held_bytes == cache.read_bytes == expected_bytes(cache, n, 4)
    assert cache.nbytes > cache.held_bytes  # the room for later tokens is allocated, not held
    cache.attend(torch.randn(B, HEADS, 3, D), *kv(3, seed=2))
    assert cache.held_bytes == expected_bytes(cache, n + 3, 4)


@pytest.mark.parametrize("bits", [4, 2])
def test_a_long_cache_holds_about_bits_over_16_of_float16(bits: int) -> None:
    """KIVI's setting (group 32, residual 128) on 2048 float16 positions: the codes are bits/16 of the cache, the
    scales and zero points 2/32 more (two float16 a group of 32), and the values' residual, 128 of 2048 positions, in
    full (the keys' is empty: 2048 is a multiple of 128)."""
    n, group, residual = 2048, 32, 128
    k, v = kv(n, dtype=torch.float16)
    k, v = torch.nn.functional.pad(k, (0, 48)), torch.nn.functional.pad(v, (0, 52))  # head dim 64
    cache = QuantizedCache.of(k, v, bits, group, residual)
    full = k.numel() * 2 + v.numel() * 2
    share = cache.held_bytes / full
    quantized = bits / 16 + 2 / group
    assert share == pytest.approx(quantized + residual / n / 2 * (1 - quantized), rel=1e-6)


def exact_over(keys: torch.Tensor, values: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Causal attention of the last t positions over keys, values (b, g, n, .) with grouped heads, in float64."""
    n, t = keys.shape[-2], q.shape[-2]
    group = q.shape[1] // keys.shape[1]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[n - t :]
    return dense_masked_attention(q.double(), expand_kv_heads(keys, group).double(), expand_kv_heads(values, group).double(),
                                  allowed)  # fmt: skip


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("bits", [4, 2])
def test_a_step_is_exact_attention_over_what_the_cache_dequantizes(bits: int, t: int) -> None:
    """One token, or a chunk of 5 (token i sees the cache and new tokens 0..i): exact attention over the cache's
    dequantized keys and values, the new tokens in full precision."""
    n = 45
    cache = QuantizedCache.of(*kv(n), bits, 8, 16, room=t)
    q = torch.randn(B, HEADS, t, D, generator=torch.Generator().manual_seed(3))
    new_k, new_v = kv(t, seed=4)
    keys, values = cache.dequantized()
    expected = exact_over(torch.cat([keys, new_k], -2), torch.cat([values, new_v], -2), q)
    out = cache.attend(q, new_k, new_v)
    assert out.shape == (B, HEADS, t, E)
    assert (out.double() - expected).abs().max() < 1e-5
    assert cache.length == n + t


def test_int4_is_near_exact_attention_over_the_originals() -> None:
    """Against exact attention over the keys and values themselves (unit Gaussians, outputs up to ~0.35): int4 within
    0.06 (measured 0.034-0.042 over three seeds), int2 several times further off (0.18-0.20)."""
    n, t = 300, 5
    generator = torch.Generator().manual_seed(0)
    k, v = (torch.randn(B, KV_HEADS, n + t, x, generator=generator) for x in (D, E))
    q = torch.randn(B, HEADS, t, D, generator=generator)
    expected = exact_over(k, v, q)
    errors = {}
    for bits in (4, 2):
        cache = QuantizedCache.of(k[..., :n, :], v[..., :n, :], bits, 32, 128)
        errors[bits] = (cache.attend(q, k[..., n:, :], v[..., n:, :]).double() - expected).abs().max().item()
    assert errors[4] < 0.06 and errors[4] < errors[2] / 3


def kivi_lengths(n: int, steps: int, residual: int) -> list[tuple[int, int]]:
    """A transcription of llama_kivi.py's cache lengths (its prefill and decode branches): after the prompt and after
    each one-token step, (keys in full precision, values in full precision)."""
    if n % residual != 0:
        key_full = n if n < residual else n % residual
    else:
        key_full = 0
    value_full = n if n <= residual else residual
    lengths = [(key_full, value_full)]
    for _ in range(steps):
        key_full += 1  # key_states_full = cat([key_states_full, key_states])
        if key_full == residual:  # quantized whole: key_states_full = None
            key_full = 0
        value_full += 1
        if value_full > residual:  # the oldest full value quantized
            value_full -= 1
        lengths.append((key_full, value_full))
    return lengths


@pytest.mark.parametrize("n", [5, 16, 21, 40])
def test_the_residual_flushes_as_kivi_does(n: int) -> None:
    residual, steps = 16, 40
    k, v = kv(n + steps, seed=7)
    cache = QuantizedCache.of(k[..., :n, :], v[..., :n, :], 2, 8, residual)
    seen = [(cache.key_residual.shape[-2], cache.value_residual.shape[-2])]
    for t in range(n, n + steps):
        cache.attend(torch.randn(B, HEADS, 1, D), k[..., t : t + 1, :], v[..., t : t + 1, :])
        seen.append((cache.key_residual.shape[-2], cache.value_residual.shape[-2]))
    assert seen == kivi_lengths(n, steps, residual)


def test_a_flush_quantizes_the_residual_as_the_prompt_would() -> None:
    """Keys flushed from the residual after steps are the codes a prompt of that length would have had; a chunk of
    tokens leaves the state one token at a time would."""
    k, v = kv(40, seed=8)
    stepped = QuantizedCache.of(k[..., :10, :], v[..., :10, :], 4, 8, 16)
    for t in range(10, 40):
        stepped.attend(torch.randn(B, HEADS, 1, D), k[..., t : t + 1, :], v[..., t : t + 1, :])
    chunked = QuantizedCache.of(k[..., :10, :], v[..., :10, :], 4, 8, 16)
    chunked.attend(torch.randn(B, HEADS, 30, D), k[..., 10:, :], v[..., 10:, :])
    whole = QuantizedCache.of(k, v, 4, 8, 16)
    for cache in (stepped, chunked):
        assert (cache.keys, cache.values) == (whole.keys, whole.values)
        for got, want in zip(cache.dequantized(), whole.dequantized()):
            assert torch.equal(got, want)


def test_clone_and_rows_are_independent_copies() -> None:
    cache = QuantizedCache.of(*kv(37), 4, 8, 16, room=4)
    copy = cache.clone()
    copy.attend(torch.randn(B, HEADS, 1, D), *kv(1, seed=9))
    assert cache.length == 37 and copy.length == 38
    row = cache.select_rows([1])
    for got, want in zip(row.dequantized(), cache.dequantized()):
        assert torch.equal(got[0], want[1])
    assert row.held_bytes * B == cache.held_bytes and cache.kept() is None


def test_a_cache_kept_per_query_head_takes_the_new_token_repeated() -> None:
    k, v = kv(20, seed=10)
    per_query = QuantizedCache.of(expand_kv_heads(k, 3), expand_kv_heads(v, 3), 4, 8, 16)
    grouped = QuantizedCache.of(k, v, 4, 8, 16)
    q, (new_k, new_v) = torch.randn(B, HEADS, 1, D), kv(1, seed=11)
    assert (per_query.attend(q, new_k, new_v) - grouped.attend(q, new_k, new_v)).abs().max() < 1e-6


def test_kivi_defaults_and_checks() -> None:
    variant = registry.create("kivi")
    assert isinstance(variant, KIVI) and variant.hparams == {"bits": 4, "group": 32, "residual": 128}
    with pytest.raises(VariantError, match="multiple of the group"):
        registry.create("kivi", group=32, residual=48)
    with pytest.raises(VariantError):
        registry.create("kivi", bits=3)


def test_kivi_prefills_exactly_then_steps_on_its_quantized_cache() -> None:
    variant = registry.create("kivi", bits=2, group=8, residual=16)
    generator = torch.Generator().manual_seed(12)
    q = torch.randn(1, HEADS, 45, D, generator=generator)
    k, v = (torch.randn(1, KV_HEADS, 45, x, generator=generator) for x in (D, E))
    out, steps, state = generate(variant, q, k, v, prompt=40)
    assert (out.double() - exact_over(k[..., :40, :], v[..., :40, :], q[..., :40, :])).abs().max() < 1e-5
    assert isinstance(state, QuantizedCache) and state.length == 45
    replay = QuantizedCache.of(k[..., :40, :], v[..., :40, :], 2, 8, 16)
    expected = torch.cat([replay.attend(*(x[..., t : t + 1, :] for x in (q, k, v))) for t in range(40, 45)], -2)
    assert torch.equal(steps, expected)
