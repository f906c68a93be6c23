"""Synthetic input distributions: seeded, deterministic Q/K/V drawn on the CPU.

An approximation error means something only on inputs whose attention has the structure a variant
relies on, so there are several, each with the statistic it claims (tests check them):
- `gaussian`: iid N(0, 1), logits with std 1/temperature (Q and K both times `scale`: std scale^2/temperature).
  Near-uniform attention at temperature 1.
- `clustered`: queries and keys near a few shared centroids (what LSH is built for): low entropy.
- `local`: rotary position phases at Gaussian-drawn frequencies: attention mass decays with distance (band's case).
- `lowrank`: Q and K inside a `rank`-dimensional subspace (what Linformer argues for).
- `realistic`: heads that mix position, content and a sink on the first token, each head its own mix,
  calibrated to the attention statistics of a real pretrained encoder (see `realistic`): the default.
- `captured`: Q/K/V read from a file (see `load_captured` for the layout), e.g. from `attnbench capture`.

b - batch, h - heads, n - sequence, d - head dim, c - cluster, r - rank
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

Shape4 = tuple[int, int, int, int]


def gaussian(
    generator: torch.Generator, shape: Shape4, temperature: float = 1.0, scale: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    """iid N(0, 1); Q divided by `temperature`, so the logits q.k/sqrt(d) have std 1/temperature; `scale` multiplies
    Q and K both (logit std scale^2 / temperature): random-feature methods depend on |q| and |k|, not only on the
    logits, and the Performer paper's comparisons draw both small."""
    q = torch.randn(shape, generator=generator) / temperature
    k = torch.randn(shape, generator=generator)
    if scale != 1.0:  # (the default draws exactly what it always drew)
        q, k = q * scale, k * scale
    return q, k, torch.randn(shape, generator=generator)


def _norm_for_logit(d: int, temperature: float) -> float:
    """The length |q| = |k| that makes the logit of two aligned vectors, |q| |k| / sqrt(d), equal 1/temperature."""
    return (math.sqrt(d) / temperature) ** 0.5


def clustered(
    generator: torch.Generator, shape: Shape4, clusters: int = 8, spread: float = 0.3, temperature: float = 0.1
) -> tuple[Tensor, Tensor, Tensor]:
    """Q and K = one of `clusters` shared unit-norm centroids (per head) plus noise of relative size `spread`.

    Logits within a cluster are about 1/temperature, across clusters near 0: peaked attention.
    """
    b, h, n, d = shape
    centroids = torch.nn.functional.normalize(torch.randn(h, clusters, d, generator=generator), dim=-1)

    def near_centroids() -> Tensor:
        members = torch.randint(clusters, (b, h, n), generator=generator)
        picked = torch.gather(centroids[None].expand(b, -1, -1, -1), 2, members[..., None].expand(-1, -1, -1, d))
        return (picked + spread * torch.randn(shape, generator=generator) / math.sqrt(d)) * _norm_for_logit(
            d, temperature
        )

    return near_centroids(), near_centroids(), torch.randn(shape, generator=generator)


def rotate(x: Tensor, frequencies: Tensor) -> Tensor:
    """Rotary position phases: pair (2p, 2p+1) of position i turned by angle i * frequencies[..., p].

    frequencies: (d/2,) shared by every head, or (h, d/2) one set per head of x (b, h, n, d).
    """
    n = x.shape[-2]
    angles = torch.arange(n, dtype=x.dtype)[:, None] * frequencies[..., None, :]  # (n, d/2) or (h, n, d/2)
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def local(
    generator: torch.Generator, shape: Shape4, length: float = 64.0, temperature: float = 0.1, noise: float = 0.5
) -> tuple[Tensor, Tensor, Tensor]:
    """Q, K share one direction per head, turned by rotary phases whose frequencies are drawn from a Gaussian.

    q_i . k_j is then a sum of cos((i - j) * frequency) over the d/2 rotary pairs: random Fourier features of
    a Gaussian kernel of width `length` / 4 positions (a logit of about 1/temperature at i = j, decayed by
    |i - j| = `length`). Drawn frequencies do not line up again at large distances as evenly spaced ones do,
    so the mass stays near the diagonal at any N (about 96 % within 64 positions at N=4096, 87 % at 16384).
    """
    b, h, n, d = shape
    if d % 2:
        raise ValueError("the `local` input needs an even head_dim (rotary pairs)")
    frequencies = (torch.randn(d // 2, generator=generator) * 4 / length).abs()
    angle = torch.rand(h, d // 2, generator=generator) * 2 * math.pi  # each pair weighs the same in the sum
    direction = torch.stack([angle.cos(), angle.sin()], dim=-1).flatten(-2) / math.sqrt(d // 2)
    direction = direction[None, :, None, :]  # (1, h, 1, d), unit length
    scale = _norm_for_logit(d, temperature)

    def with_phases() -> Tensor:
        base = direction + noise * torch.randn(shape, generator=generator) / math.sqrt(d)
        return rotate(base * scale, frequencies)

    return with_phases(), with_phases(), torch.randn(shape, generator=generator)


def lowrank(
    generator: torch.Generator, shape: Shape4, rank: int = 8, temperature: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    """Q = A_q B, K = A_k B with B (rank x d) per head: Q and K live in a rank-dimensional subspace."""
    b, h, n, d = shape
    basis = torch.linalg.qr(torch.randn(h, d, min(rank, d), generator=generator)).Q.transpose(-1, -2)  # (h, r, d)
    scale = (d / min(rank, d)) ** 0.5  # logits keep std 1/temperature
    q = torch.einsum("bhnr,hrd->bhnd", torch.randn(b, h, n, min(rank, d), generator=generator), basis) * scale
    k = torch.einsum("bhnr,hrd->bhnd", torch.randn(b, h, n, min(rank, d), generator=generator), basis) * scale
    return q / temperature, k, torch.randn(shape, generator=generator)


def _log_uniform(generator: torch.Generator, count: int, low: float, high: float) -> Tensor:
    return torch.exp(math.log(low) + torch.rand(count, generator=generator) * (math.log(high) - math.log(low)))


@dataclass(frozen=True)
class HeadMix:
    """The ranges each head of `realistic` draws its mix from (log-uniform, the sink uniform).

    The defaults are calibrated against all 72 heads of MiniLM-L6-H384 (a 6-layer BERT-style sentence encoder)
    on 512 tokens of English prose (non-causal); `DECODER_MIXES` against every head of SmolLM2-135M, causal, one
    mix per length it was measured at (512, 2048, 8192 tokens; `decoder_mix` between them). `attnbench.inputs.calibration` holds what those heads showed, and tests keep the
    input within its tolerances.
    """

    width: tuple[float, float] = (8.0, 256.0)  # positions over which a head's positional logit decays
    position: tuple[float, float] = (1.0, 10.0)  # positional logit of a token with itself
    temperature: tuple[float, float] = (0.3, 3.0)  # content logits have std 1 / temperature
    sink: tuple[float, float] = (-4.5, 0.5)  # first key's logit = sink_growth * log(N) + this
    sink_growth: float = 1.0  # 1: the first token's mass does not fade with N (non-causal)
    position_share: float = 0.5  # of the head dim (but the sink's coordinate): the more pairs, the smoother the decay
    types: int = 0  # > 0: each position has a token type (Zipf over this many); same-type keys get a `match` logit
    match: tuple[float, float] = (0.0, 0.0)  # logit of a query on a key of its own type (per head, log-uniform)
    sink_value: float = 1.0  # norm of the first token's value relative to the others' (a decoder's sink is a no-op)
    value_mean_share: float = 0.0  # share of the values' energy in one direction shared by every position of a head
    value_growth: float = 0.0  # a head's values are (1 + this * u) times larger, u in [0, 1] its place in `sink`'s
    # range: in a real decoder the late layers park the most mass on the sink and carry the largest values


_DECODER_COMMON = dict(position_share=0.95, types=512, sink_value=0.2, value_mean_share=0.1, value_growth=3.0)
DECODER_MIXES = {  # per length the decoder was measured at (attnbench.inputs.calibration), fitted to its targets
    512: HeadMix(width=(8.0, 514.0), position=(1.06, 11.1), temperature=(0.62, 2.9), sink=(3.6, 8.2),
                 match=(1.57, 2.32), sink_growth=0.2, **_DECODER_COMMON),
    2048: HeadMix(width=(6.0, 217.0), position=(1.51, 12.9), temperature=(0.45, 3.57), sink=(4.76, 8.28),
                  match=(3.2, 3.69), sink_growth=0.2, **_DECODER_COMMON),
    8192: HeadMix(width=(20.9, 104.2), position=(4.5, 10.8), temperature=(0.39, 3.2), sink=(5.04, 9.37),
                  match=(1.73, 6.35), sink_growth=0.2, **_DECODER_COMMON),
}  # fmt: skip


def decoder_mix(n: int) -> HeadMix:
    """The decoder's mix at length `n`: a calibrated length's own, else each range interpolated linearly in log N
    between the two calibrated lengths around `n` (the nearest one outside them)."""
    lengths = sorted(DECODER_MIXES)
    if n <= lengths[0] or n >= lengths[-1]:
        return DECODER_MIXES[lengths[0] if n <= lengths[0] else lengths[-1]]
    low = max(x for x in lengths if x <= n)
    high = min(x for x in lengths if x >= n)
    if low == high:
        return DECODER_MIXES[low]
    t = (math.log(n) - math.log(low)) / (math.log(high) - math.log(low))
    a, b = DECODER_MIXES[low], DECODER_MIXES[high]

    def between(x: Any, y: Any) -> Any:
        if isinstance(x, tuple):
            return tuple(between(u, v) for u, v in zip(x, y))
        return x + t * (y - x) if isinstance(x, float) else x

    return HeadMix(**{f.name: between(getattr(a, f.name), getattr(b, f.name)) for f in fields(HeadMix)})




def _token_types(
    generator: torch.Generator, b: int, h: int, n: int, dims: int, mix: HeadMix
) -> tuple[Tensor, Tensor]:
    """Content from token types: each position draws a type (Zipf over `mix.types`, shared by every head, as the
    tokens of a text are), each head embeds the types as random unit vectors, and q and k carry their position's
    embedding times sqrt(match), a key that of the token before it: a query's logit is about `match` on the keys
    that follow an earlier occurrence of its token (what induction heads read), about 0 elsewhere."""
    ranks = torch.arange(1, mix.types + 1, dtype=torch.float64)
    types = torch.multinomial((1 / ranks).float(), b * n, replacement=True, generator=generator).view(b, n)
    embedding = torch.nn.functional.normalize(torch.randn(h, mix.types, dims, generator=generator), dim=-1)
    match = _log_uniform(generator, h, *mix.match) if mix.match[0] > 0 else torch.zeros(h)
    previous = torch.cat([types[:, :1], types[:, :-1]], dim=1)  # a key carries the type of the token before it
    heads = torch.arange(h)[None, :, None]
    root = match.sqrt()[None, :, None, None]  # the parts' dot products are the logits
    return embedding[heads, types[:, None, :]] * root, embedding[heads, previous[:, None, :]] * root


def realistic(
    generator: torch.Generator, shape: Shape4, temperature: float = 1.0, causal: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Attention that looks like a pretrained model's: per head, a mix of three logit sources drawn from `HeadMix`.

    - position: rotary phases at Gaussian-drawn frequencies of a per-head width (as `local`), a logit of
      `position` at i = j decaying with |i - j|;
    - content: iid Gaussian parts with per-head temperature (broad heads and sharp ones), and for a decoder
      token types (a query's logit is high on the keys after earlier occurrences of its token: induction);
    - a sink: every query has a logit of sink_growth * log(N) + `sink` on the first key (attention sinks, [CLS]).
    Each part lives in its own coordinates of the head dim, so their logits add. `temperature` scales every
    logit (1: the calibrated input). V is iid N(0, 1) for an encoder; a decoder's (causal=True) first value is
    short, the values share a direction, and heads with a strong sink carry larger values, as SmolLM2's do.
    causal=False draws the encoder's heads (MiniLM, N=512); causal=True a decoder's, per length (`decoder_mix`).
    """
    return mixed_heads(generator, shape, decoder_mix(shape[2]) if causal else HeadMix(), temperature)


def mixed_heads(
    generator: torch.Generator, shape: Shape4, mix: HeadMix, temperature: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    """`realistic`'s heads, each drawing its position, content and sink parts from the ranges of `mix`."""
    b, h, n, d = shape
    pairs = int((d - 1) * mix.position_share) // 2  # rotary pairs for position; one coordinate for the sink; the rest content
    content_dims = d - 1 - 2 * pairs
    width = _log_uniform(generator, h, *mix.width)
    position = _log_uniform(generator, h, *mix.position)
    content_temperature = _log_uniform(generator, h, *mix.temperature)
    sink_place = torch.rand(h, generator=generator)  # (h,) in [0, 1]
    sink = mix.sink[0] + sink_place * (mix.sink[1] - mix.sink[0])
    parts_q, parts_k = [], []
    if pairs:
        frequencies = (torch.randn(h, pairs, generator=generator) * 4 / width[:, None]).abs()  # (h, p)
        angle = torch.rand(h, pairs, generator=generator) * 2 * math.pi
        direction = torch.stack([angle.cos(), angle.sin()], dim=-1).flatten(-2) / math.sqrt(pairs)  # (h, 2p) unit
        base = (direction * position.sqrt()[:, None])[None, :, None, :].expand(b, h, n, 2 * pairs)
        positional = rotate(base, frequencies)  # q_i . k_j = position * mean_p cos((i - j) f_p)
        parts_q.append(positional)
        parts_k.append(positional)
    if content_dims:
        # q.k has std 1 / temperature, its scale split evenly between q and k (neither norm outgrows the other)
        scale = (content_temperature * math.sqrt(content_dims)) ** -0.5  # (h,)
        content_q = torch.randn(b, h, n, content_dims, generator=generator) * scale[None, :, None, None]
        content_k = torch.randn(b, h, n, content_dims, generator=generator) * scale[None, :, None, None]
        if mix.types:
            same_type = _token_types(generator, b, h, n, content_dims, mix)  # (b, h, n, c) unit per head x type
            content_q, content_k = content_q + same_type[0], content_k + same_type[1]
        parts_q.append(content_q)
        parts_k.append(content_k)
    sink_logit = mix.sink_growth * math.log(n) + sink  # (h,): split evenly between q and k, as a learned sink would be
    split = sink_logit.clamp(min=1.0).sqrt()
    parts_q.append(split[None, :, None, None].expand(b, h, n, 1))
    sink_key = torch.zeros(b, h, n, 1)
    sink_key[:, :, 0, 0] = sink_logit / split
    parts_k.append(sink_key)
    to_logit = d**0.25 / math.sqrt(temperature)  # q.k / sqrt(d) is then the sum of the parts' logits / temperature
    q, k = torch.cat(parts_q, dim=-1) * to_logit, torch.cat(parts_k, dim=-1) * to_logit
    return q, k, _values(generator, shape, mix, sink_place)


def _values(generator: torch.Generator, shape: Shape4, mix: HeadMix, sink_place: Tensor) -> Tensor:
    """V: iid N(0, 1) (the defaults), or with a direction per head that every position shares (`value_mean_share`
    of the energy) and a first value of norm `sink_value` times the others' (real decoders' sinks add ~nothing)."""
    v = torch.randn(shape, generator=generator)
    if mix.value_mean_share > 0:
        b, h, n, d = shape
        shared = torch.nn.functional.normalize(torch.randn(1, h, 1, d, generator=generator), dim=-1) * math.sqrt(d)
        v = v * math.sqrt(1 - mix.value_mean_share) + shared * math.sqrt(mix.value_mean_share)
    if mix.sink_value != 1.0:
        v[:, :, 0] *= mix.sink_value
    if mix.value_growth:
        v = v * (1 + mix.value_growth * sink_place)[None, :, None, None]
    return v
