"""KIVI (Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache"; the authors' code,
github.com/jy-yuan/KIVI, models/llama_kivi.py and quant/new_pack.py): a KV cache held in 4 or 2 bits.

- keys per channel: each channel's values over a group of `group` tokens share a scale and a zero point; values per
  token: each token's channels in groups of `group` share them; asymmetric min/max quantization, as KIVI's
  `quant_and_pack_kcache` / `quant_and_pack_vcache`: zero = the group's min, scale = (max - min) / (2^bits - 1),
  code = round((x - zero) / scale), x' = code * scale + zero (so |x - x'| <= scale / 2);
- a full-precision residual of the most recent tokens, by KIVI's rule (llama_kivi.py): after the prompt the keys
  keep its last n mod `residual` tokens in full (the rest quantized) and the values its last `residual`; a step
  attends with its own token in full precision, then the keys' residual, once it holds `residual` tokens, is
  quantized whole (`residual` a multiple of `group`, as KIVI asserts), and the values' oldest full token beyond the
  last `residual` is quantized alone;
- codes packed into uint8, two int4 or four int2 a byte (along the channels), so the bytes held are the real ones;
  scales and zero points in the input's dtype (KIVI's: its fp16 model's).

`QuantizedCache` is the state; `kivi` the method (exact causal attention over the prompt, then generation against the
quantized cache of the whole prompt); `attnbench generate` composes the cache with any method that keeps positions
(`quantize = "kivi-2"` on a method's table: its kept positions quantized after the prompt).

Departures from KIVI's code: one `bits` for keys and values (KIVI's k_bits and v_bits; its KIVI-2 and KIVI-4 set both
alike); a chunk of t new tokens (the question after a compressed context) attends as t steps would, except that the
chunk's own tokens are seen in full precision and the residual is flushed after the chunk (KIVI steps one token at a
time); a group cut short at the end of the channels (a head dim not a multiple of `group`, which KIVI asserts away)
is quantized as a shorter group; a group whose values are all equal has scale 0 and codes 0 (KIVI divides by it).
A step dequantizes what it reads, CHUNK positions at a time (KIVI's CUDA kernels compute on the packed codes
instead): the same values, another speed — eager PyTorch on one CPU thread, a one-token step over 8K positions (8
heads of 64) took ~10 ms against an exact step's ~1.7 ms, at 32K ~38 against ~12 (a busy machine: the ratio, not the
times).

b - batch, g - key/value heads (or query heads, for a cache kept per query head), h - query heads, r - query heads
per key/value head, n - positions, t - new tokens, d - key dim, e - value dim, s - groups
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from attnbench.interface import Cost, DecodeState, Hyperparameter, Shape, UnsupportedOptionError, VariantError
from attnbench.interface import default_scale, expand_kv_heads, query_group
from attnbench.kernels import usable
from attnbench.kernels.steps import kivi_step
from einops import rearrange
from torch import Tensor

from attnbench.variants.kv_compression import KVCompression

BITS = (4, 2)
CHUNK = 1024  # quantized positions a step dequantizes at once (fastest of 256, 1024, 4096 at 8K and 32K positions)


# ---- quantization and packing ---------------------------------------------------------------------------------


def quantize(x: Tensor, bits: int, group: int, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric min/max quantization of x (b, g, n, c) in groups of `group` along `dim` (-2: along the tokens, each
    channel apart: KIVI's keys; -1: along the channels, each token apart: its values), a last group cut short where
    the axis is not a multiple: codes (b, g, n, c) uint8 in [0, 2^bits), and each group's scale and zero point (its
    min) in x's dtype, the groups in place of `dim` ((b, g, s, c) or (b, g, n, s))."""
    length = x.shape[dim]
    groups = -(-length // group)
    if groups * group != length:  # the last element repeated: the short group's min and max stay its own
        shape = list(x.shape)
        shape[dim] = groups * group - length
        x = torch.cat([x, x.narrow(dim, length - 1, 1).expand(shape)], dim)
    grouped = x.unflatten(dim, (groups, group))  # the group's members on axis dim
    zero = grouped.amin(dim)
    scale = (grouped.amax(dim) - zero) / (2**bits - 1)
    work = torch.promote_types(x.dtype, torch.float32)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)).to(work)  # equal values: codes 0 (x' = zero)
    codes = (grouped.to(work) - zero.unsqueeze(dim).to(work)) / safe.unsqueeze(dim)
    codes = codes.round_().clamp_(0, 2**bits - 1).to(torch.uint8).flatten(dim - 1, dim)
    return codes.narrow(dim, 0, length), scale, zero


def dequantize(codes: Tensor, scale: Tensor, zero: Tensor, group: int, dim: int, out: Tensor | None = None) -> Tensor:
    """`quantize`'s inverse: codes (b, g, n, c) with their groups' scales and zero points -> x' = code * scale + zero
    in the scales' dtype (as KIVI's `unpack_and_dequant_*`), written into `out` when given. In place, a pass each:
    addcmul's broadcast over a value group's channels measured ~15x slower on the CPU."""
    length, groups = codes.shape[dim], scale.shape[dim]
    if groups * group != length:  # a short last group: padded, then cut
        pad = [0, 0] * (-dim - 1) + [0, groups * group - length]
        whole = dequantize(F.pad(codes, pad), scale, zero, group, dim).narrow(dim, 0, length)
        return whole if out is None else out.copy_(whole)
    out = codes.new_empty(codes.shape, dtype=scale.dtype) if out is None else out
    grouped = out.unflatten(dim, (groups, group))
    grouped.copy_(codes.unflatten(dim, (groups, group))).mul_(scale.unsqueeze(dim)).add_(zero.unsqueeze(dim))
    return out


def pack(codes: Tensor, bits: int) -> Tensor:
    """codes (..., c) in [0, 2^bits) -> (..., ceil(c bits / 8)) uint8: 8 / bits codes a byte, the first in the low
    bits (KIVI packs 32 / bits into an int32 the same way)."""
    per = 8 // bits
    codes = F.pad(codes, (0, -codes.shape[-1] % per))
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=codes.device)
    return (codes.unflatten(-1, (-1, per)) << shifts).sum(-1, dtype=torch.uint8)


def unpack(packed: Tensor, bits: int, width: int) -> Tensor:
    """`pack`'s inverse: (..., p) uint8 -> the first `width` codes (..., width)."""
    # a pass per code of the byte: ~3x faster than one broadcast shift over (..., p, 8 / bits)
    codes = [(packed >> shift) & (2**bits - 1) for shift in range(0, 8, bits)]
    return torch.stack(codes, dim=-1).flatten(-2)[..., :width]


def written(buffer: Tensor, start: int, new: Tensor) -> Tensor:
    """`new` (b, g, m, c) written into buffer (b, g, capacity, c) from slot `start` on: the same buffer, or one twice
    as large when it is full."""
    stop = start + new.shape[2]
    if stop > buffer.shape[2]:
        grown = buffer.new_empty(*buffer.shape[:2], max(2 * buffer.shape[2], stop), buffer.shape[3])
        grown[:, :, :start] = buffer[:, :, :start]
        buffer = grown
    buffer[:, :, start:stop] = new
    return buffer


# ---- the cache ------------------------------------------------------------------------------------------------


@dataclass
class QuantizedCache(DecodeState):
    """KIVI's cache: the quantized keys and values in buffers with room for later tokens (filled up to `keys` and
    `values` positions), then each one's full-precision residual, in position order.

    key_codes (b, g, capacity, ceil(d bits / 8)) uint8, key_scales and key_zeros (b, g, capacity / group, d): per
    channel, per group of `group` tokens; value_codes (b, g, capacity, ceil(e bits / 8)) uint8, value_scales and
    value_zeros (b, g, capacity, ceil(e / group)): per token, per group of `group` channels; scales and zero points in
    the input's dtype. key_residual (b, g, n - keys, d), value_residual (b, g, n - values, e) in full precision."""

    key_codes: Tensor
    key_scales: Tensor
    key_zeros: Tensor
    value_codes: Tensor
    value_scales: Tensor
    value_zeros: Tensor
    key_residual: Tensor
    value_residual: Tensor
    keys: int  # quantized keys: a multiple of `residual`
    values: int  # quantized values
    bits: int
    group: int
    residual: int

    @classmethod
    def of(cls, k: Tensor, v: Tensor, bits: int, group: int, residual: int, room: int = 0) -> "QuantizedCache":
        """The cache of k (b, g, n, d), v (b, g, n, e) by KIVI's prefill rule, with room for `room` more positions."""
        if bits not in BITS or residual % group:
            raise VariantError(f"KIVI quantizes to {' or '.join(map(str, BITS))} bits with a residual that is a "
                               f"multiple of the group (got bits={bits}, group={group}, residual={residual})")  # fmt: skip
        (b, g, n, d), e, per = k.shape, v.shape[-1], 8 // bits
        capacity = n + room
        cache = cls(
            k.new_empty((b, g, capacity, -(-d // per)), dtype=torch.uint8),
            k.new_empty(b, g, -(-capacity // group), d),
            k.new_empty(b, g, -(-capacity // group), d),
            v.new_empty((b, g, capacity, -(-e // per)), dtype=torch.uint8),
            v.new_empty(b, g, capacity, -(-e // group)),
            v.new_empty(b, g, capacity, -(-e // group)),
            k.new_empty(b, g, 0, d),
            v.new_empty(b, g, 0, e),
            0, 0, bits, group, residual,
        )  # fmt: skip
        cache.append(k, v)
        return cache

    def append(self, k: Tensor, v: Tensor) -> None:
        """Positions k (b, g, t, d), v (b, g, t, e) join the residual, which is then flushed by KIVI's rule: the keys'
        `residual` oldest full tokens whole each time it holds that many, the values' every token beyond the last
        `residual` (llama_kivi.py's prefill and decode branches, one token or t at a time alike)."""
        self.absorb(torch.cat([self.key_residual, k], dim=-2), torch.cat([self.value_residual, v], dim=-2))

    def absorb(self, keys: Tensor, values: Tensor) -> None:
        """`append` with the residuals and the new positions already joined: keys (b, g, m, d), values (b, g, m', e)."""
        flushed = keys.shape[-2] // self.residual * self.residual
        if flushed:
            codes, scales, zeros = quantize(keys[..., :flushed, :], self.bits, self.group, dim=-2)
            at = self.keys // self.group
            self.key_codes = written(self.key_codes, self.keys, pack(codes, self.bits))
            self.key_scales = written(self.key_scales, at, scales)
            self.key_zeros = written(self.key_zeros, at, zeros)
            self.keys += flushed
        self.key_residual = keys[..., flushed:, :].clone() if flushed else keys
        leaving = max(0, values.shape[-2] - self.residual)
        if leaving:
            codes, scales, zeros = quantize(values[..., :leaving, :], self.bits, self.group, dim=-1)
            self.value_codes = written(self.value_codes, self.values, pack(codes, self.bits))
            self.value_scales = written(self.value_scales, self.values, scales)
            self.value_zeros = written(self.value_zeros, self.values, zeros)
            self.values += leaving
        self.value_residual = values[..., leaving:, :].clone() if leaving else values

    def chunks(self, values: bool = False) -> Iterator[Tensor]:
        """The quantized keys (b, g, c, d), or values (b, g, c, e), dequantized CHUNK positions at a time (whole key
        groups), in position order."""
        codes, scales, zeros, count, residual = (
            (self.value_codes, self.value_scales, self.value_zeros, self.values, self.value_residual) if values else
            (self.key_codes, self.key_scales, self.key_zeros, self.keys, self.key_residual)
        )  # fmt: skip
        dim, step = (-1, CHUNK) if values else (-2, max(1, CHUNK // self.group) * self.group)
        for start in range(0, count, step):
            stop = min(count, start + step)
            groups = slice(start, stop) if values else slice(start // self.group, stop // self.group)
            yield dequantize(unpack(codes[:, :, start:stop], self.bits, residual.shape[-1]), scales[:, :, groups],
                             zeros[:, :, groups], self.group, dim)  # fmt: skip

    def dequantized(self) -> tuple[Tensor, Tensor]:
        """Every position's key (b, g, n, d) and value (b, g, n, e) as a step reads them."""
        return (torch.cat([*self.chunks(), self.key_residual], dim=-2),
                torch.cat([*self.chunks(values=True), self.value_residual], dim=-2))  # fmt: skip

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """t new tokens attend to every earlier position (dequantized) and to the new tokens up to themselves (in full
        precision), then join the cache: q (b, h, t, d), k (b, g, t, d), v (b, g, t, e) -> (b, h, t, e). A cache kept
        per query head takes the new keys and values repeated for each. The scores of every position first, a chunk of
        keys dequantized at a time, then the weighted values the same way: never a full-precision copy of the cache (a
        whole one, fresh each step, measured ~5x slower at 8K positions, its pages faulted in)."""
        repeat = self.key_residual.shape[1] // k.shape[1]
        k, v = expand_kv_heads(k, repeat), expand_kv_heads(v, repeat)
        t = q.shape[-2]
        if t == 1 and self.group % (8 // self.bits) == 0 and usable(q, k, v, self.key_scales, self.key_residual):
            keys, values = torch.cat([self.key_residual, k], dim=-2), torch.cat([self.value_residual, v], dim=-2)
            filled = self.filled()[:6]
            out = kivi_step(q, filled, keys, values, bits=self.bits, group=self.group, scale=default_scale(q.shape[-1]))
            self.absorb(keys, values)
            return out
        grouped = rearrange(q, "b (g r) t d -> b g (r t) d", g=k.shape[1]) * default_scale(q.shape[-1])
        keys = chain(self.chunks(), [self.key_residual, k])  # a chunk dequantized, scored, and let go
        scores = torch.cat([torch.matmul(grouped, part.transpose(-1, -2)) for part in keys], dim=-1)  # (b, g, r t, n)
        if t > 1:  # new token i sees the positions before the chunk and new tokens 0..i
            n = scores.shape[-1]
            later = torch.arange(n, device=q.device) > torch.arange(n - t, n, device=q.device)[:, None]  # (t, n)
            scores = rearrange(scores, "b g (r t) n -> b g r t n", t=t).masked_fill(later, float("-inf"))
            scores = rearrange(scores, "b g r t n -> b g (r t) n")
        weights = torch.softmax(scores, dim=-1)
        out, start = torch.matmul(weights[..., -t:], v), 0  # (b, g, r t, e): the new tokens' share first
        for part in chain(self.chunks(values=True), [self.value_residual]):
            out.add_(torch.matmul(weights[..., start : start + part.shape[-2]], part))
            start += part.shape[-2]
        self.append(k, v)
        return rearrange(out, "b g (r t) e -> b (g r) t e", t=t)

    @property
    def length(self) -> int:
        """Positions held."""
        return self.keys + self.key_residual.shape[-2]

    def filled(self) -> list[Tensor]:
        """What the cache holds of the positions seen: the filled codes, scales and zero points, and the residual."""
        groups = self.keys // self.group
        return [self.key_codes[:, :, : self.keys], self.key_scales[:, :, :groups], self.key_zeros[:, :, :groups],
                self.value_codes[:, :, : self.values], self.value_scales[:, :, : self.values],
                self.value_zeros[:, :, : self.values], self.key_residual, self.value_residual]  # fmt: skip

    @property
    def held_bytes(self) -> int:
        """Codes, scales, zero points and residual of the positions seen (the buffers' room left out)."""
        return sum(t.numel() * t.element_size() for t in self.filled())

    @property
    def read_bytes(self) -> int:
        """A step reads all it holds."""
        return self.held_bytes

    def select_rows(self, rows: list[int]) -> "QuantizedCache":
        index = torch.tensor(rows, device=self.key_codes.device)
        tensors = [t.index_select(0, index) for t in self.tensors()]
        return QuantizedCache(*tensors, self.keys, self.values, self.bits, self.group, self.residual)  # type: ignore[misc]


# ---- the method ------------------------------------------------------------------------------------------------


class KIVI(KVCompression):
    """KIVI: exact causal attention over the prompt, then generation against its KV cache quantized (keys per channel,
    values per token, `bits` bits, the last tokens in full precision)."""

    name = "kivi"
    paper = "KIVI (Liu et al. 2024)"  # for `attnbench list` (kvpress has no quantization press: transformers' cache)
    hyperparameters = {
        "bits": Hyperparameter(4, "bits per key and value code (KIVI-4, KIVI-2; KIVI's authors advise 4 for grouped-"
                               "query models, whose caches are small already)", choices=BITS),
        "group": Hyperparameter(32, "tokens (keys) or channels (values) sharing a scale and a zero point (KIVI's "
                                "LongBench runs: 32; the fused step takes a multiple of the codes a byte holds, 2 or "
                                "4, else the step is eager)", minimum=1),
        "residual": Hyperparameter(128, "recent tokens kept in full precision, a multiple of the group (KIVI's "
                                   "LongBench runs: 128)", minimum=1),
    }  # fmt: skip

    def __init__(self, seed: int = 0, **hyperparams: Any) -> None:
        super().__init__(seed, **hyperparams)
        if self.residual % self.group:
            raise VariantError(f"Invalid hyperparameters for variant 'kivi': residual: {self.residual} must be a "
                               f"multiple of the group {self.group} (KIVI flushes the keys' residual in whole groups)")  # fmt: skip

    def quantized(self, k: Tensor, v: Tensor, room: int = 0) -> QuantizedCache:
        """The quantized cache of keys (b, g, n, d) and values (b, g, n, e): what a method composed with
        `quantize = "kivi-..."` keeps of its positions after the prompt (`attnbench generate`)."""
        return QuantizedCache.of(k, v, self.bits, self.group, self.residual, room)

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """Exact causal attention over the prompt (KIVI's prefill is full precision), then its quantized cache."""
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=query_group(q, k) > 1)
        return out, self.quantized(k, v, room)

    def prefill_state(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> DecodeState:
        return self.quantized(k, v, room)

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        if not isinstance(state, QuantizedCache):
            raise UnsupportedOptionError(f"kivi cannot step from a {type(state).__name__}")
        return state.attend(q, k, v), state

    def steps(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        return self.step(state, q, k, v)  # the cache takes a chunk at once

    def cost(self, shape: Shape) -> Cost:
        n = shape.n_k
        return self.prompt_cost(shape, attention_pairs=n * (n + 1) / 2, scored_pairs=0, held_scores=0)
