"""Presses that score the prompt's positions by (approximate) statistical leverage: how far a token's key (and value)
stands out of the head's span, the rows a CUR or column-subset decomposition keeps.

- `cur` (Sengupta et al. 2025, "Value-Guided KV Compression for LLMs via Approximated CUR Decomposition" (CurDKV);
  kvpress's CURPress, kvpress/presses/cur_press.py): the squared norms ||k||², ||v||² (after a Gaussian projection
  to 20 dimensions with `use_random_leverage`, drawn from the variant's seed), each normalised within windows of
  `local_window_size` positions (`use_local_approximation`), combined by `leverage_type` (their product by default),
  normalised over the prompt; the first `num_sinks` positions score 1, above every other.
- `compactor` (Chari & Van Durme 2025, "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate
  Leverage Scores"; kvpress's CompactorPress, compactor_press.py): between `sink_size_start` first and
  `sink_size_end` last positions (kept: scored the maximum), blending * z(leverage) + z(attention), where
  - leverage (kvpress's LeverageScorePress, leverage_press.py): diag(X (XᵀX)⁻¹ Xᵀ) of the sequence-centred
    pre-rotary keys X times a right Gaussian sketch of `sketch_dimension` columns (drawn from the variant's seed), by
    a Cholesky solve, clamped at 0;
  - attention (kvpress's NonCausalAttnPress, non_causal_attention_press.py): the column sums of non-causal,
    unscaled softmax(q kᵀ) within chunks of `chunk_size` positions, averaged over each key/value head's query heads,
    times ||v||, averaged over 3 neighbours;
  each z-normalised over the whole tensor (every batch row and head at once, as kvpress does); `blending` by default
  the press's compression ratio 1 - budget / n (kvpress's default).

  Departures: without the model around the layer (a per-call decode run, no `PromptContext.rotary`) the leverage is
  taken of the post-rotary keys (kvpress re-projects the hidden states; in the model the rotary embedding is undone
  instead, which gives the same pre-rotary keys). Kept from kvpress as it is: the non-causal attention's last chunk
  is padded with zero queries and keys that are not masked (kvpress fills their scores with 0 and -1e-9, not -inf),
  so the last chunk's keys take some mass from the padding.

b - batch, h - query heads, g - key/value heads, n - prompt positions, d - head dim, e - value dim, c - chunks,
w - window or chunk length, k - sketch columns
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from attnbench.interface import Cost, Hyperparameter, PromptContext, Shape, VariantError, expand_kv_heads, query_group
from attnbench.ops import group_mean
from einops import rearrange
from torch import Tensor

from attnbench.variants.press import ScoredPress
from attnbench.variants.rotary import unrotated as turned_back

LEVERAGE_TYPES = ("key", "value", "kv_avg", "kv_product")
RANDOM_LEVERAGE_RANK = 20  # kvpress's CURPress: r = 20 columns of the random projection


def gaussian(shape: tuple[int, ...], seed: int, like: Tensor) -> Tensor:
    """A standard normal draw of `shape` from `seed` (on the CPU, so the same on every device), as `like`'s dtype and
    device."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(like.device, like.dtype)


# ---- CUR --------------------------------------------------------------------------------------------------------


def window_normalised(x: Tensor, window: int) -> Tensor:
    """x (b, g, n) divided by its sum within consecutive windows of `window` positions (the last one zero-padded)."""
    n = x.shape[-1]
    padded = rearrange(F.pad(x, (0, -n % window)), "b g (c w) -> b g c w", w=window)
    return rearrange(padded / padded.sum(dim=-1, keepdim=True), "b g c w -> b g (c w)")[..., :n]


class CURPress(ScoredPress):
    """CurDKV: keys and values kept by their approximate leverage (squared norms, locally normalised)."""

    name = "cur"
    paper = "CurDKV (Sengupta et al. 2025)"
    press = "CURPress"
    hyperparameters = {
        **ScoredPress.hyperparameters,
        "num_sinks": Hyperparameter(4, "the first positions, always kept (kvpress: 4)", minimum=0),
        "leverage_type": Hyperparameter("kv_product", "what is scored: the keys' leverage, the values', their mean "
                                        "(kv_avg) or product (kv_product: kvpress's default)", kind=str,
                                        choices=LEVERAGE_TYPES),
        "use_random_leverage": Hyperparameter(False, "project keys and values on 20 Gaussian directions (from the "
                                              "seed) first (kvpress: False)", kind=bool),
        "use_local_approximation": Hyperparameter(True, "normalise the leverage within windows of local_window_size "
                                                  "(kvpress: True)", kind=bool),
        "local_window_size": Hyperparameter(16, "the local windows' length (kvpress: 16)", minimum=1),
    }  # fmt: skip

    @classmethod
    def smallest_budget(cls, hparams: dict[str, Any]) -> int:
        return hparams["num_sinks"] + 1

    def score(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(b, g, n): kvpress's CURPress.score."""
        work = torch.promote_types(k.dtype, torch.float32)
        k, v = k.to(work), v.to(work)
        if self.use_random_leverage:  # one draw; keys and values of the same width share it, as in kvpress
            projection = gaussian((max(k.shape[-1], v.shape[-1]), RANDOM_LEVERAGE_RANK), self.seed, k)
            projection = projection / math.sqrt(RANDOM_LEVERAGE_RANK)
            k, v = k @ projection[: k.shape[-1]], v @ projection[: v.shape[-1]]
        k2, v2 = (k**2).sum(dim=-1), (v**2).sum(dim=-1)  # (b, g, n)
        if self.use_local_approximation:
            k2, v2 = window_normalised(k2, self.local_window_size), window_normalised(v2, self.local_window_size)
        scores = {"key": k2, "value": v2, "kv_avg": (k2 + v2) / 2, "kv_product": k2 * v2}[self.leverage_type]
        scores = scores / scores.sum(dim=-1, keepdim=True)
        scores[..., : self.num_sinks] = 1.0
        return scores


# ---- Compactor --------------------------------------------------------------------------------------------------


def unrotated(k: Tensor, context: PromptContext | None, start: int = 0) -> Tensor:
    """The keys k (b, g, n, d) at positions start.. before the model's rotary embedding (k cos - rotate_half(k) sin,
    the inverse rotation); as given without the model's rotary embedding."""
    if context is None or context.rotary is None:
        return k
    cos, sin = context.rotary(torch.arange(start, start + k.shape[-2], device=k.device))  # (n, d)
    return turned_back(k, cos.to(k.device, k.dtype), sin.to(k.device, k.dtype))


def cholesky_with_jitter(gram: Tensor, jitter: float = 1e-2, tries: int = 5) -> Tensor:
    """The lower Cholesky factor of gram (..., k, k), with jitter on the diagonal grown until it factors (kvpress's
    LeverageScorePress.chol_with_jitter, called with jitter 1e-2 and 5 tries)."""
    identity = torch.eye(gram.shape[-1], device=gram.device, dtype=gram.dtype)
    current = float(jitter)
    for _ in range(tries):
        factor, info = torch.linalg.cholesky_ex(gram + current * identity, upper=False)
        if bool((info == 0).all()):
            return factor
        current = max(1e-8, 1e-2 if current == 0.0 else 10.0 * current)
    raise VariantError(f"compactor: the sketched keys' Gram matrix did not factor after {tries} tries; try a smaller "
                       "sketch_dimension")  # fmt: skip


def leverage_scores(keys: Tensor, sketch: Tensor) -> Tensor:
    """Approximate leverage of each key (kvpress's LeverageScorePress.compute_leverage_scores): keys (b, g, n, d)
    centred over the sequence, times the sketch (b, g, d, k) (already scaled by 1/sqrt(k)), X (b, g, n, k) in float32
    at least; diag(X (XᵀX)⁻¹ Xᵀ) by a Cholesky solve, clamped at 0 -> (b, g, n)."""
    x = torch.matmul(keys - keys.mean(dim=-2, keepdim=True), sketch)
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    xt = x.transpose(-2, -1)  # (b, g, k, n)
    gram = xt @ x  # (b, g, k, k)
    factor = cholesky_with_jitter(0.5 * (gram + gram.transpose(-2, -1)))
    solved = torch.cholesky_solve(xt, factor, upper=False)  # (XᵀX)⁻¹ Xᵀ: (b, g, k, n)
    return (x * solved.transpose(-2, -1)).sum(dim=-1).clamp_min(0)


def non_causal_chunk_mass(q: Tensor, k: Tensor, chunk: int) -> Tensor:
    """kvpress's NonCausalAttnPress.non_causal_chunked_attn: q, k (b, h, n, d) cut into chunks of `chunk` positions
    (zero-padded), unscaled softmax(q kᵀ) within each chunk, summed over its queries -> (b, h, n) in float32 at least.
    The padding is kvpress's: padded queries score 0 and padded keys -1e-9, neither masked."""
    n = k.shape[-2]
    pad = -n % chunk
    q, k = F.pad(q, (0, 0, 0, pad)), F.pad(k, (0, 0, 0, pad))
    last = (n - 1) // chunk * chunk  # the last chunk's first position
    invalid = torch.arange(last, last + chunk, device=q.device) >= n  # (w,): its padded positions
    q, k = (rearrange(x, "b h (c w) d -> b h c w d", w=chunk) for x in (q, k))
    dots = torch.matmul(q, k.transpose(-2, -1))  # (b, h, c, w, w)
    dots[:, :, -1].masked_fill_(invalid[:, None], 0)
    dots[:, :, -1].masked_fill_(invalid[None, :], -1e-9)
    weights = torch.softmax(dots.to(torch.promote_types(dots.dtype, torch.float32)), dim=-1)
    return rearrange(weights.sum(dim=-2), "b h c w -> b h (c w)")[..., :n]


def z_normalised(x: Tensor) -> Tensor:
    """(x - mean) / std over the whole tensor, the std at least 1e-6 (kvpress's z-scores)."""
    return (x - x.mean()) / x.std().clamp_min(1e-6)


class CompactorPress(ScoredPress):
    """Compactor: blended z-scores of the keys' approximate leverage and of non-causal chunked attention; the first
    and last positions kept."""

    name = "compactor"
    paper = "Compactor (Chari & Van Durme 2025)"
    press = "CompactorPress"
    uses_queries = True
    hyperparameters = {
        **ScoredPress.hyperparameters,
        "sink_size_start": Hyperparameter(8, "the first positions, always kept (kvpress: 8)", minimum=0),
        "sink_size_end": Hyperparameter(4, "the last positions, always kept (kvpress: 4)", minimum=0),
        "chunk_size": Hyperparameter(256, "the non-causal attention's chunk (kvpress: 256)", minimum=1),
        "sketch_dimension": Hyperparameter(48, "columns of the leverage's Gaussian sketch, drawn from the seed "
                                           "(kvpress: 48)", minimum=1),
        "blending": Hyperparameter(None, "the leverage's weight against the attention's (None: the compression "
                                   "ratio, 1 - budget / n, kvpress's default)", kind=float, minimum=0.0,
                                   optional=True),
    }  # fmt: skip

    @classmethod
    def smallest_budget(cls, hparams: dict[str, Any]) -> int:
        return hparams["sink_size_start"] + hparams["sink_size_end"] + 1

    def score(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(b, g, n): kvpress's CompactorPress.score."""
        n = k.shape[-2]
        left = min(self.sink_size_start, n)
        right = min(self.sink_size_end, max(0, n - left))
        middle = slice(left, n - right)
        q, k, v = q[..., middle, :], k[..., middle, :], v[..., middle, :]
        blending = self.blending if self.blending is not None else max(0.0, 1 - self.layer_budget(n) / n)
        scores = blending * self.leverage(k, left) + self.attention(q, k, v)
        return F.pad(scores, (left, right), value=scores.max().item())

    def leverage(self, k: Tensor, start: int) -> Tensor:
        """(b, g, m): the z-scored leverage of the keys (b, g, m, d) at positions start.. (kvpress's
        LeverageScorePress.score), on the pre-rotary keys where the model's rotary embedding is known."""
        (b, g, _, d), columns = k.shape, self.sketch_dimension
        sketch = gaussian((b, g, d, columns), self.seed, k) * (1 / math.sqrt(columns))
        return z_normalised(leverage_scores(unrotated(k, self.context, start), sketch))

    def attention(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(b, g, m): the z-scored non-causal chunked attention mass times ||v||, smoothed over 3 neighbours (kvpress's
        NonCausalAttnPress.score)."""
        group = query_group(q, k)
        mass = group_mean(non_causal_chunk_mass(q, expand_kv_heads(k, group), self.chunk_size), group)
        scores = mass * v.to(mass.dtype).norm(dim=-1)  # (b, g, m)
        scores = F.avg_pool1d(scores, kernel_size=3, padding=1, stride=1)
        return z_normalised(scores)

    def cost(self, shape: Shape) -> Cost:
        n = shape.n_k
        padded = -(-n // self.chunk_size) * self.chunk_size
        return self.prompt_cost(shape, attention_pairs=n * (n + 1) / 2, scored_pairs=padded * self.chunk_size,
                                held_scores=padded * self.chunk_size)  # fmt: skip
