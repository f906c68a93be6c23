"""The rotary embedding as a press reads it (`PromptContext.rotary`: positions -> cos, sin, in the rotate-half
convention of transformers' apply_rotary_pos_emb): a vector turned, turned back, and the turn averaged over positions.
It imports no other variant, so any press (and the head-wise module the presses reach) may use it without a cycle.

n - positions, f - future positions, d - head dim
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

Rotary = Callable[[Tensor], tuple[Tensor, Tensor]]  # positions (n,) -> cos, sin (n, d)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the last axis's halves: each channel's partner i <-> i + d / 2 in the rotation."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def rotated(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (..., n, d) turned by the phases cos, sin (n, d): x cos + rotate_half(x) sin."""
    return x * cos + rotate_half(x) * sin


def unrotated(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The inverse turn: each pair (x_i, x_{i + d/2}) is turned by [[c, -s], [s, c]] (c and s the same for both of the
    pair), whose inverse is [[c, s], [-s, c]] / (c^2 + s^2): x cos - rotate_half(x) sin, over cos^2 + sin^2 (1 but for
    a scaled rotary such as YaRN's)."""
    return (x * cos - rotate_half(x) * sin) / (cos * cos + sin * sin)


def prompt_unrotated(x: Tensor, rotary: Rotary) -> Tensor:
    """A prompt's queries or keys x (b, h, n, d), turned at positions 0..n-1, before the turn."""
    cos, sin = (phase.to(device=x.device, dtype=x.dtype) for phase in rotary(torch.arange(x.shape[-2])))
    return unrotated(x, cos, sin)


def mean_rotation(rotary: Rotary, start: int, count: int, dtype: torch.dtype) -> Tensor:
    """(d, d): the turn averaged over positions start..start + count - 1, mean(diag(cos) + diag(sin) P), P the matrix
    of rotate_half (kvpress's ExpectedAttentionPress.apply_avg_rope)."""
    cos, sin = (phase.to(dtype) for phase in rotary(torch.arange(start, start + count)))  # (f, d)
    eye = torch.eye(cos.shape[-1], dtype=dtype, device=cos.device)
    return torch.diag(cos.mean(dim=0)) + torch.diag(sin.mean(dim=0)) @ rotate_half(eye).T
