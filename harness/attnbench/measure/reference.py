"""Exact softmax attention as ground truth: dense with an explicit pattern, or chunked in float64.

b - batch, h - heads, i - query position, j - key position, d - head dim, e - value dim
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from einops import einsum
from torch import Tensor

from attnbench.inputs.statistics import REFERENCE_STATISTICS, row_statistics
from attnbench.interface import default_scale
from attnbench.ops import allowed_keys


@dataclass
class Reference:
    """Exact output and the trivial baseline (uniform average of V over each query's visible keys), float64,
    with statistics of the exact attention that say what its error figures can tell: how peaked, how local,
    how much lands on the first token, and how much the heads differ."""

    output: Tensor  # (b, h, i, e)
    uniform: Tensor  # (b, h, i, e)
    per_head: dict[str, Tensor] = field(default_factory=dict)  # statistic -> (h,): mean over batch and query rows

    def statistic(self, name: str) -> float:
        """Mean over heads of one per-head statistic (NaN when not computed)."""
        values = self.per_head.get(name)
        return float("nan") if values is None else values.mean().item()

    @property
    def entropy(self) -> float:  # mean over rows of H(p) / log(visible keys): 1 uniform, 0 one-hot
        return self.statistic("entropy")

    @property
    def band_mass(self) -> float:  # mean over rows of the mass on keys with |i - j| <= LOCALITY_WINDOW
        return self.statistic("local_mass")

    @property
    def sink_mass(self) -> float:  # mean over rows of the mass on the first key
        return self.statistic("sink_mass")

    @property
    def head_spread(self) -> float:
        """Standard deviation across heads of their mean entropy: 0 when every head attends alike."""
        values = self.per_head.get("entropy")
        return float("nan") if values is None or len(values) < 2 else values.std().item()


REFERENCE_CHUNK_ELEMENTS = 1 << 24  # scores of one chunk of queries (at least one query row): 128 MiB in float64
REFERENCE_CHUNK_COPIES = 3  # float64 arrays of a chunk's size alive at once: scores/weights, an entropy term, slack


def uniform_average(
    v: Tensor, n_q: int, *, causal: bool, key_padding_mask: Tensor | None, query_offset: int = 0
) -> Tensor:
    """(b, h, i, e): the mean of V over each query's visible keys (0 where it sees none), in O(N·e) memory; query i
    is at position `query_offset` + i (decode: the new tokens after a prompt).

    The visible keys are the unpadded ones (and j <= i when causal), so the sums are prefix sums, never N x N.
    """
    real = torch.ones(v.shape[0], v.shape[-2], dtype=v.dtype, device=v.device)  # (b, j)
    if key_padding_mask is not None:
        real = (~key_padding_mask).to(v.dtype)
    weighted = v * real[:, None, :, None]  # (b, h, j, e)
    if causal:
        rows = slice(query_offset, query_offset + n_q)
        sums = weighted.cumsum(dim=2)[:, :, rows]  # (b, h, i, e)
        counts = real.cumsum(dim=1)[:, None, rows, None]  # (b, 1, i, 1)
    else:
        sums = weighted.sum(dim=2, keepdim=True).expand(-1, -1, n_q, -1)  # (b, h, i, e)
        counts = real.sum(dim=1)[:, None, None, None]  # (b, 1, 1, 1)
    return torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros((), dtype=v.dtype, device=v.device))


def reference_chunk_rows(b: int, h: int, n_k: int, max_chunk_elements: int = REFERENCE_CHUNK_ELEMENTS) -> int:
    """Query rows per chunk of the reference: as many as fit `max_chunk_elements` scores, at least one."""
    return max(1, max_chunk_elements // max(1, b * h * n_k))


def exact_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    max_chunk_elements: int = REFERENCE_CHUNK_ELEMENTS,
    query_offset: int = 0,
) -> Reference:
    """Exact attention in float64, queries in chunks: beyond the float64 copies of Q, K, V and the two outputs
    (all O(N·D)), at most REFERENCE_CHUNK_COPIES arrays of one chunk's scores live at once, never N x N. Query i is
    at position `query_offset` + i (decode: the steps' rows, against every key up to them)."""
    q64, k64, v64 = (t.detach().to(torch.float64) for t in (q, k, v))
    b, h, n_q, _ = q.shape
    n_k = k.shape[-2]
    chunk = reference_chunk_rows(b, h, n_k, max_chunk_elements)
    output = torch.empty(b, h, n_q, v.shape[-1], dtype=torch.float64, device=q.device)  # filled chunk by chunk
    sums = {name: torch.zeros(h, dtype=torch.float64, device=q.device) for name in REFERENCE_STATISTICS}
    for start in range(0, n_q, chunk):
        stop = min(n_q, start + chunk)
        allowed = allowed_keys(
            stop - start,
            n_k,
            causal=causal,
            key_padding_mask=key_padding_mask,
            device=q.device,
            query_offset=query_offset + start,
        )  # (b|1, 1, c, j)
        scores = einsum(q64[:, :, start:stop], k64, "b h i d, b h j d -> b h i j")  # (b, h, c, j)
        scores.mul_(default_scale(q.shape[-1])).masked_fill_(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        del scores
        weights.nan_to_num_(0.0)  # rows with no visible key: zeros
        output[:, :, start:stop] = einsum(weights, v64, "b h i j, b h j e -> b h i e")
        rows = torch.arange(query_offset + start, query_offset + stop, device=q.device)
        visible = allowed.sum(dim=-1)  # (b|1, 1, c)
        for name, values in row_statistics(weights, visible, rows, REFERENCE_STATISTICS).items():
            sums[name] += values.sum(dim=(0, 2))
        del weights
    return Reference(
        output=output,
        uniform=uniform_average(
            v64, n_q, causal=causal, key_padding_mask=key_padding_mask, query_offset=query_offset
        ),
        per_head={name: total.cpu() / (b * n_q) for name, total in sums.items()},
    )


def dropped_mass(
    q: Tensor,
    k: Tensor,
    support: Tensor,
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    max_chunk_elements: int = REFERENCE_CHUNK_ELEMENTS,
) -> float:
    """Mean over query rows of the exact attention mass outside `support` ((b|1, h|1, i, j), a variant's
    `support_for` these inputs).

    For an exact-pattern variant this mass is what its error against full attention comes from.
    """
    return dropped_masses(
        q, k, {"": support}, causal=causal, key_padding_mask=key_padding_mask, max_chunk_elements=max_chunk_elements
    )[""]


def dropped_masses(
    q: Tensor,
    k: Tensor,
    supports: dict[str, Tensor],
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    max_chunk_elements: int = REFERENCE_CHUNK_ELEMENTS,
) -> dict[str, float]:
    """`dropped_mass` of several supports of the same q and k, from one pass over the exact weights."""
    q64, k64 = q.detach().to(torch.float64), k.detach().to(torch.float64)
    b, h, n_q, _ = q.shape
    n_k = k.shape[-2]
    supports = {key: support.to(q.device) for key, support in supports.items()}
    chunk = reference_chunk_rows(b, h, n_k, max_chunk_elements)
    dropped = dict.fromkeys(supports, 0.0)
    for start in range(0, n_q, chunk):
        stop = min(n_q, start + chunk)
        allowed = allowed_keys(
            stop - start, n_k, causal=causal, key_padding_mask=key_padding_mask, device=q.device, query_offset=start
        )
        scores = einsum(q64[:, :, start:stop], k64, "b h i d, b h j d -> b h i j") * default_scale(q.shape[-1])
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        del scores
        total = weights.sum().item()
        for key, support in supports.items():  # outside = all of the row's mass - the mass inside
            dropped[key] += total - weights.masked_fill(~support[..., start:stop, :], 0.0).sum().item()
    return {key: mass / (b * h * n_q) for key, mass in dropped.items()}
