"""The `heads` input: a real decoder's own attention heads, as `attnbench heads` captured them (post-rotary q/k/v
of layers across depth, on a shipped text; `attnbench.inputs.heads_cache` says where and which cells they serve).

A cell of B x H heads takes B * H of the captured (layer, head) pairs spread evenly over all of them, layer-major,
so 8 heads come from 8 depths and not from one layer's first 8; the cell's seed shifts the spread (another seed,
other heads). Each q head gets its own key/value head (grouped-query: the group's), and q is scaled so that the
variants' 1/sqrt(d) gives the model's own attention scaling.

b - batch, h - heads (the cell's), g - the model's key/value heads, n - sequence, d - head dim, l - layer
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import Tensor

from attnbench.inputs.heads_cache import (
    DEFAULT_HEADS_MODEL,
    heads_folder,
    heads_problems,
    held_positions,
    read_manifest,
)
from attnbench.inputs.synthetic import Shape4


def pool_indices(count: int, pool: int, shift: float) -> list[int]:
    """`count` indices spread evenly over range(pool), shifted by `shift` in [0, 1) of one step."""
    return [min(pool - 1, int((j + shift) * pool / count)) for j in range(count)]


def real_heads(
    generator: torch.Generator,
    shape: Shape4,
    model: str = DEFAULT_HEADS_MODEL,
    text: str = "prose",
    causal: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (b, h, n, d) from `model`'s heads captured on `text`: the first n positions of b * h heads spread
    over its captured layers (see the module's docstring)."""
    b, h, n, d = shape
    if problems := heads_problems({"model": model, "text": text}):
        raise ValueError(problems[0])
    manifest = read_manifest(model)
    assert manifest is not None
    held = held_positions(manifest, text)[0]
    if not causal or n > held or d != int(manifest["head_dim"]):
        raise ValueError(f"{manifest.get('model', model)}'s heads on the {text}: causal cells of N <= {held} and "
                         f"head_dim {manifest['head_dim']} only (asked: causal={causal}, N={n}, head_dim={d})")  # fmt: skip
    layers, query_heads = len(manifest["layers"]), int(manifest["heads"])
    shift = float(torch.rand(1, generator=generator))
    picked = [divmod(index, query_heads) for index in pool_indices(b * h, layers * query_heads, shift)]
    q, k, v = captured_heads(model, text, picked, n)  # (1, b * h, n, d)
    return tuple(rearrange(t, "1 (b h) n d -> b h n d", b=b) for t in (q, k, v))


def captured_heads(model: str, text: str, heads: list[tuple[int, int]], n: int) -> tuple[Tensor, Tensor, Tensor]:
    """The first n positions of the given (captured layer slot, query head) pairs of `model`'s heads on `text`, side by
    side: q (1, len(heads), n, d) at the model's scaling x sqrt(d) (the variants scale by 1/sqrt(d)), k and v of each
    query head's key/value head. The file is memory-mapped: only those heads are read."""
    manifest = read_manifest(model)
    assert manifest is not None
    data = torch.load(heads_folder(model) / manifest["texts"][text]["file"], map_location="cpu", weights_only=True, mmap=True)
    q_all, k_all, v_all = data["q"], data["k"], data["v"]  # (l, 1, heads, positions, d), k/v with g heads
    group = q_all.shape[2] // k_all.shape[2]
    d = q_all.shape[-1]
    parts = [(q_all[layer, 0, head, :n].float() * (float(manifest["scaling"][layer]) * math.sqrt(d)),
              k_all[layer, 0, head // group, :n].float(), v_all[layer, 0, head // group, :n].float())
             for layer, head in heads]  # fmt: skip
    return tuple(torch.stack(t)[None] for t in zip(*parts))
