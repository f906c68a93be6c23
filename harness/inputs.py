"""Input distributions: seeded, deterministic Q/K/V (and a key padding mask) for one cell.

b - batch, h - heads, n - sequence, d - head dim
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor


@dataclass
class Inputs:
    q: Tensor  # (b, h, n, d)
    k: Tensor  # (b, h, n, d)
    v: Tensor  # (b, h, n, d)
    key_padding_mask: Tensor | None  # (b, n) bool, True = padding


def gaussian(generator: torch.Generator, shape: tuple[int, int, int, int], temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """iid N(0, 1) entries; Q is divided by `temperature`, so the logits q.k/sqrt(d) have std 1/temperature.

    Low temperature gives peaked attention, high temperature nearly uniform attention.
    """
    q = torch.randn(shape, generator=generator) / temperature
    k = torch.randn(shape, generator=generator)
    v = torch.randn(shape, generator=generator)
    return q, k, v


DISTRIBUTIONS: dict[str, tuple[Callable[..., tuple[Tensor, Tensor, Tensor]], dict[str, Any]]] = {
    "gaussian": (gaussian, {"temperature": 1.0}),
}


def validate_input(name: str, params: dict[str, Any]) -> list[str]:
    """Problems with an input spec: unknown distribution or parameter, non-positive values."""
    if name not in DISTRIBUTIONS:
        return [f"unknown input distribution '{name}' (known: {', '.join(DISTRIBUTIONS)})"]
    defaults = DISTRIBUTIONS[name][1]
    problems = [f"input '{name}': unknown parameter '{key}' (known: {', '.join(defaults)})" for key in params if key not in defaults]
    problems += [
        f"input '{name}': {key} must be a positive number, got {value!r}"
        for key, value in params.items()
        if key in defaults and (not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0)
    ]
    return problems


def padding_mask(batch: int, n: int, fraction: float) -> Tensor | None:
    """Right padding as in a real batch: element b has round(fraction * n * (b + 1) / batch) padded keys at the end.

    At least one key per element stays real. None when `fraction` is 0.
    """
    if fraction <= 0:
        return None
    padded = [min(n - 1, round(fraction * n * (index + 1) / batch)) for index in range(batch)]
    lengths = torch.tensor([n - p for p in padded])
    return torch.arange(n)[None, :] >= lengths[:, None]


def make_inputs(
    name: str,
    params: dict[str, Any],
    *,
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    padding: float = 0.0,
) -> Inputs:
    """Q, K, V for one cell: drawn on the CPU in float32 from `seed`, then cast and moved (same on every device)."""
    generator = torch.Generator().manual_seed(seed)
    fn, defaults = DISTRIBUTIONS[name]
    q, k, v = fn(generator, (batch, heads, seq_len, head_dim), **{**defaults, **params})
    mask = padding_mask(batch, seq_len, padding)
    return Inputs(
        q=q.to(device=device, dtype=dtype),
        k=k.to(device=device, dtype=dtype),
        v=v.to(device=device, dtype=dtype),
        key_padding_mask=None if mask is None else mask.to(device),
    )
