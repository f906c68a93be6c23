"""Statistics of exact attention, per head: how peaked, how local, how much on the first token, how concentrated.

One definition serves the exact reference of every run (the cheap three), the calibration of `realistic` against
a real model (`attnbench calibrate`), and the test that holds `realistic` to that calibration. Each is a mean over
query rows of a per-row figure of the softmax weights over the row's visible keys:
- entropy: H(p) / log(visible keys): 1 uniform, 0 one key;
- local_mass: mass on keys with |i - j| <= LOCALITY_WINDOW;
- sink_mass: mass on the first key;
- top1pct_mass: mass on the ceil(1% of visible keys) largest weights;
- top64_mass: mass on the TOP_KEYS largest weights (all of them when fewer are visible).

b - batch, h - heads, c - query rows of a chunk, i - query position, j - key position, d - head dim
"""

from __future__ import annotations

import math

import torch
from einops import einsum
from torch import Tensor

from attnbench.ops import band_allows

LOCALITY_WINDOW = 64  # the band |i - j| <= w in which local_mass is measured
TOP_KEYS = 64  # top64_mass: mass on this many largest weights of a row
TOP_SHARE = 0.01  # top1pct_mass: mass on this share of a row's visible keys
REFERENCE_STATISTICS = ("entropy", "local_mass", "sink_mass")  # what every run's exact reference reports
STATISTICS = REFERENCE_STATISTICS + ("top1pct_mass", "top64_mass")  # what the calibration measures


def row_statistics(weights: Tensor, visible: Tensor, rows: Tensor, names: tuple[str, ...]) -> dict[str, Tensor]:
    """Per-row statistics (b, h, c) of softmax weights (b, h, c, j) whose rows see `visible` (b|1, 1, c) keys;
    `rows` (c,) are the rows' positions. Rows that see no key count 0."""
    b, h, c, n_k = weights.shape
    out: dict[str, Tensor] = {}
    if "entropy" in names:
        spread = visible.to(weights.dtype).clamp(min=1).log().expand(b, h, c)
        row_entropy = torch.special.entr(weights).sum(dim=-1)  # -sum p log p, 0 at p = 0
        out["entropy"] = torch.where(spread > 0, row_entropy / spread.clamp(min=1e-300), 0.0)
    if "local_mass" in names:
        keys = torch.arange(n_k, device=weights.device)
        near = band_allows(rows[:, None], keys[None, :], LOCALITY_WINDOW).to(weights.dtype)  # (c, j)
        out["local_mass"] = einsum(weights, near, "b h c j, c j -> b h c")
    if "sink_mass" in names:
        out["sink_mass"] = weights[..., 0]
    wanted = [name for name in ("top1pct_mass", "top64_mass") if name in names]
    if wanted:
        counts = {
            "top1pct_mass": (visible.to(torch.float64) * TOP_SHARE).ceil().long(),
            "top64_mass": visible.clamp(max=TOP_KEYS).long(),
        }
        largest = min(n_k, max(TOP_KEYS, math.ceil(TOP_SHARE * n_k)))
        running = weights.topk(largest, dim=-1).values.cumsum(dim=-1)  # (b, h, c, largest), sorted descending
        for name in wanted:
            index = (counts[name].clamp(min=1) - 1).expand(b, h, c)[..., None]
            out[name] = torch.where(counts[name].expand(b, h, c) > 0, running.gather(-1, index)[..., 0], 0.0)
    return out


def head_statistics(
    q: Tensor,
    k: Tensor,
    *,
    causal: bool,
    scale: float | None = None,
    names: tuple[str, ...] = STATISTICS,
    dtype: torch.dtype = torch.float32,
    chunk_elements: int = 1 << 24,
) -> dict[str, Tensor]:
    """Each statistic per head (h,): the mean over batch and query rows of exact softmax(q k^T * scale) (scale
    1/sqrt(d) by default), computed in query chunks of at most `chunk_elements` scores: never N x N at once."""
    q, k = q.to(dtype), k.to(dtype)
    b, h, n_q, d = q.shape
    n_k = k.shape[-2]
    scale = d**-0.5 if scale is None else scale
    chunk = max(1, chunk_elements // max(1, b * h * n_k))
    sums = {name: torch.zeros(h, dtype=torch.float64) for name in names}
    keys = torch.arange(n_k)
    for start in range(0, n_q, chunk):
        stop = min(n_q, start + chunk)
        rows = torch.arange(start, stop)
        scores = einsum(q[:, :, start:stop], k, "b h c d, b h j d -> b h c j") * scale
        if causal:
            scores.masked_fill_(keys[None, :] > rows[:, None], float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        del scores
        visible = ((rows + 1).clamp(max=n_k) if causal else torch.full_like(rows, n_k))[None, None, :]
        for name, values in row_statistics(weights, visible, rows, names).items():
            sums[name] += values.to(torch.float64).sum(dim=(0, 2))
    return {name: total / (b * n_q) for name, total in sums.items()}
