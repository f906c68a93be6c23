"""What the gated and delta-rule kernels share (gated_kernels.py, delta_kernels.py): their arguments checked and
brought to one form, the two layouts of a sequence cut into chunks, a scalar gate's decay matrix inside a chunk, and
the loop of the recurrent forms.

b - batch, h - heads, n - position, c - chunk, i - query in chunk, j - key in chunk, d - key dim, e - value dim
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor

# A log decay below this is a reset to float precision (e^-100 ~ 4e-44): gates are clamped there, so -inf (a full
# reset) works in every form, and a chunk's cumulative decays stay small enough to subtract in float32
MIN_LOG_DECAY = -100.0
# exp(40) ~ 2e17: factors e^b and e^-b of a chunk's log decays b stay far from float32's range while |b| is within it;
# past it the kernels form the decays pair by pair (the delta rule a matrix, GLA sub-blocks)
STABLE_LOG_DECAY = 40.0
NORM_EPS = 1e-6  # fla's l2norm: x / sqrt(|x|^2 + eps), so a zero vector (a padded key) stays zero
CHUNK_MAJOR, IN_PLACE = "c b h i z", "b h c i z"  # the two layouts of a chunked tensor


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types and float32, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


@dataclass
class Inputs:
    """A kernel's arguments, checked: q, k (b, h, n, d), v (b, h, n, e) and the gates in the work dtype (float32, or
    float64 when any input is), gates expanded to (b, h, n[, d | 1]) and clamped at MIN_LOG_DECAY; `dtype` the
    output's (v's); `scale` positive."""

    q: Tensor
    k: Tensor
    v: Tensor
    gates: dict[str, Tensor | None]
    initial_state: Tensor | None
    scale: float
    dtype: torch.dtype
    work: torch.dtype

    @property
    def n(self) -> int:
        return self.q.shape[-2]

    def state(self) -> Tensor:
        """The state before the first position: (b, h, d, e), zeros unless given (a copy: the caller's stays theirs)."""
        if self.initial_state is not None:
            return self.initial_state.to(self.work, copy=True)
        b, h, _, d = self.q.shape
        return torch.zeros(b, h, d, self.v.shape[-1], dtype=self.work, device=self.q.device)

    def empty(self, output_final_state: bool) -> tuple[Tensor, Tensor | None]:
        """The results for a sequence of no positions: no outputs, and the initial state (a copy)."""
        return self.v.new_zeros(self.v.shape, dtype=self.dtype), self.state() if output_final_state else None


def checked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gates: dict[str, Tensor | None],
    *,
    scale: float | None,
    initial_state: Tensor | None,
    chunk_size: int | None = None,
) -> Inputs:
    """Every argument checked before any work (a clear ValueError naming it), then brought to the work dtype. `gates`
    by name: "gk" (b|1, h|1, n, d|1) log decays; "g" (b|1, h|1, n) log decays or None; "beta" (b|1, h|1, n)."""
    if not all(t.is_floating_point() for t in (q, k, v)):
        raise ValueError(f"q, k and v must be floating point; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"q, k must be (b, h, n, d) and v (b, h, n, e) with the same b, h, n; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    b, h, n, d = q.shape
    floats = [t.dtype for t in (q, k, v, initial_state, *gates.values()) if t is not None and t.is_floating_point()]
    work = accumulation_dtype(functools.reduce(torch.promote_types, floats))  # float64 when any input is
    ready: dict[str, Tensor | None] = {}
    for name, gate in gates.items():
        if gate is None:
            ready[name] = None
            continue
        per_key = name == "gk"
        shape = (b, h, n, gate.shape[-1]) if per_key else (b, h, n)
        fits = gate.dim() == len(shape) and gate.shape[0] in (1, b) and gate.shape[1] in (1, h)
        if not fits or gate.shape[2] != n or (per_key and gate.shape[-1] not in (1, d)):
            what = "(b|1, h|1, n, d|1)" if per_key else "(b|1, h|1, n)"
            raise ValueError(f"{name} must be {what} for q {tuple(q.shape)}; got {tuple(gate.shape)}")
        gate = gate.to(work).expand(shape)
        ready[name] = gate if name == "beta" else gate.clamp_min(MIN_LOG_DECAY)
    if initial_state is not None and tuple(initial_state.shape) != (b, h, d, v.shape[-1]):
        raise ValueError(f"initial_state must be (b, h, d, e) = {(b, h, d, v.shape[-1])}; got {tuple(initial_state.shape)}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int; got {chunk_size!r}")
    scale = d**-0.5 if scale is None else scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive number; got {scale!r}")
    return Inputs(q.to(work), k.to(work), v.to(work), ready, initial_state, scale, v.dtype, work)


def unit_norm_factor(x: Tensor) -> Tensor:
    """(..., d) -> (..., 1): the factor that L2-normalises x as fla's l2norm does, 1 / sqrt(|x|^2 + NORM_EPS)."""
    return (torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() + NORM_EPS).rsqrt()  # one reduction pass


def chunks(x: Tensor, chunk: int, layout: str = CHUNK_MAJOR) -> Tensor:
    """(b, h, n, z) -> `layout`, zero-padded to whole chunks (zero gates, keys and beta: padding neither writes to the
    state nor decays it). CHUNK_MAJOR (c, b, h, i, z) is a contiguous copy, each chunk one block of memory, for a loop
    of matrix products over chunks; IN_PLACE (b, h, c, i, z) is a view where nothing is padded."""
    pad = -x.shape[-2] % chunk
    x = F.pad(x, (0, 0, 0, pad)) if pad else x
    chunked = rearrange(x, f"b h (c i) z -> {layout}", i=chunk)
    return chunked.contiguous() if layout == CHUNK_MAJOR else chunked


def unchunked(x: Tensor, n: int, dtype: torch.dtype, layout: str = CHUNK_MAJOR) -> Tensor:
    """`layout` (e for z) -> (b, h, n, e) in `dtype`, the padding dropped (a view where nothing needs copying)."""
    return rearrange(x, f"{layout} -> b h (c i) z")[:, :, :n].to(dtype)


def pair_decay(b: Tensor, log_scale: float = 0.0) -> Tensor:
    """b (..., i, 1): a scalar gate's cumulative log decay in each chunk -> scale exp(b_i - b_j) for j <= i, 0 above:
    (..., i, j), every entry in [0, scale]."""
    chunk = b.shape[-2]
    positions = torch.arange(chunk, device=b.device)
    later = positions[:, None] >= positions[None, :]
    difference = b - b.mT  # (..., i, j): b_i - b_j
    return difference.add_(log_scale).masked_fill_(~later, float("-inf")).exp_()  # in place on a fresh tensor


def recurrence(
    inputs: Inputs, q: Tensor, write: Callable[[int, Tensor], Tensor], output_final_state: bool
) -> tuple[Tensor, Tensor | None]:
    """The recurrent form of either operator: per position t the state after `write(t, state)`, read by the query
    (q: the scaled one): o_t = S_t^T q_t. -> o (b, h, n, e) in the inputs' dtype, the final state or None."""
    state, outputs = inputs.state(), []
    for t in range(inputs.n):
        state = write(t, state)
        outputs.append(einsum(q[:, :, t], state, "b h d, b h d e -> b h e"))
    out = torch.stack(outputs, dim=2) if outputs else torch.zeros_like(inputs.v)
    return out.to(inputs.dtype), state if output_final_state else None
