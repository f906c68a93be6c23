"""kvpress's wrapper presses as functions of a scored press's scores and budget (`attnbench.variants.press`):
PyramidKV's layer budgets, ChunkKV's chunks, CriticalKV's output-projection rescoring.

- `pyramid_budget` (Cai et al. 2024, "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
  Funneling"; kvpress's PyramidKVPress.get_layer_budget, kvpress/presses/pyramidkv_press.py, after KVCache-Factory's
  pyramidkv_utils.py): the budgets fall linearly from the first layer to the last, the average over layers the
  uniform budget; a setting the pyramid cannot meet falls back to the uniform budget, as kvpress does.
- `chunk_scores` (Liu et al. 2025, "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context LLM
  Inference"; kvpress's ChunkKVPress, chunkkv_press.py): the prompt cut into chunks of `chunk` positions (the last
  one shorter), each scored by the sum over the heads of its positions' mean score; the same chunks for every head.
- `critical_scores` (Feng et al. 2025, "Identify Critical KV Cache in LLM Inference from an Output Perturbation
  Perspective"; kvpress's CriticalKVPress and CriticalAdaKVPress, criticalkv_press.py): a first stage keeps half the
  budget by the press's score, the rest goes by the score times ||W_o v||_1, each value's share of the layer's output.

kvpress's scorers mark what they always keep (SnapKV's window) by the largest score + 1, which a wrapper can outrank
(ChunkKV averages it into its chunk; CriticalKV's second stage rescales it); ours mark it +inf, so the wrappers read
+inf as kvpress's finite mark (`kvpress_marks`) and keep what kvpress keeps.

b - batch, h - query heads, g - key/value heads, n - prompt positions, c - chunks, e - value dim, m - model width
"""

from __future__ import annotations

import math

import torch
from attnbench.interface import PromptContext, UnsupportedOptionError, expand_kv_heads
from einops import rearrange
from torch import Tensor

BETA = 20  # PyramidKV's beta: the last layer keeps 1 / beta of the average budget (kvpress's and KVCache-Factory's)
FIRST_STAGE = 0.5  # CriticalKV's first_stage_ratio: the share of the budget kept by the press's own score
EPSILON = 1e-4  # CriticalKV's epsilon: (score + epsilon) ||W_o v||


def kvpress_marks(scores: Tensor) -> Tensor:
    """scores (b, g, n) in float32 at least, +inf (a position the press always keeps) as kvpress marks it: the largest
    finite score + 1 (over the whole tensor, as kvpress's `scores.max().item() + 1`)."""
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    kept = scores == float("inf")
    if not kept.any():
        return scores
    finite = scores[~kept]
    mark = (finite.max() if finite.numel() else scores.new_zeros(())) + 1
    return torch.where(kept, mark, scores)


# ---- PyramidKV ----------------------------------------------------------------------------------------------------


def pyramid_budget(budget: int, n: int, layer: int, layers: int, smallest: int) -> int:
    """PyramidKV: positions per head layer `layer` of `layers` keeps when the average over layers is `budget` (kvpress's
    get_layer_budget with q_len n, q_len (1 - compression_ratio) = budget and window_size = smallest - 1, the
    positions the press always keeps: SnapKV's window, none for a press without one). The first layer keeps
    max_num = 2 budget - budget / beta (at most n - window), the last min_num = 2 budget - max_num, the layers between
    on the line; rounded, so the average is `budget` up to the rounding. kvpress falls back to the uniform budget where
    n >= max_num >= min_num >= window fails (a budget near n, or below the window), and so does this; a model of one
    layer keeps `budget`, and a layer keeps one position at least (kvpress's last layers may round to none)."""
    window = smallest - 1
    if layers < 2:
        return budget
    min_num = budget / BETA  # (max_capacity_prompt - window_size) / beta, max_capacity_prompt = window + budget
    max_num = budget * 2 - min_num
    if max_num >= n - window:
        max_num = n - window
        min_num = budget * 2 - max_num
    if not n >= max_num >= min_num >= window:
        return budget
    steps = (max_num - min_num) / (layers - 1)
    return max(1, round(max_num - layer * steps))


# ---- ChunkKV ------------------------------------------------------------------------------------------------------


def chunk_scores(scores: Tensor, chunk: int) -> Tensor:
    """ChunkKV: scores (b, g, n) -> each position's chunk's score, the sum over the heads of the mean of its positions'
    scores (kvpress's ChunkKVPress.compress: complete chunks of `chunk`, then the remainder as one chunk), the same for
    every head; a prompt shorter than one chunk keeps the press's own scores (kvpress delegates to the press).

    kvpress keeps int(chunks x (1 - compression_ratio)) whole chunks; `compress` keeps `budget` positions, so the
    ranking must be a strict order: by chunk score, a tie going to the earlier chunk, then by position inside the
    chunk. The top budget positions are then the best chunks whole and the first positions of the next one (kvpress's
    set, and up to chunk - 1 positions more, its int() rounding down to whole chunks). The order is written into the
    scores as a tie-break (float64) below half the smallest gap between two chunks' scores, so it never reorders
    chunks."""
    b, g, n = scores.shape
    if n < chunk:
        return scores
    summed = kvpress_marks(scores).sum(dim=1)  # (b, n): kvpress sums over the heads
    whole = n // chunk * chunk
    means = rearrange(summed[:, :whole], "b (c l) -> b c l", l=chunk).mean(dim=-1)  # (b, c)
    if whole < n:
        means = torch.cat([means, summed[:, whole:].mean(dim=-1, keepdim=True)], dim=-1)
    of_chunk = torch.arange(n, device=scores.device) // chunk  # (n,) each position's chunk
    per_position = means.double()[:, of_chunk]  # (b, n)
    return (per_position - _tie_break(means, n) * torch.arange(n, device=scores.device))[:, None].expand(b, g, n)


def _tie_break(means: Tensor, n: int) -> Tensor:
    """(b, 1) float64: a step per position, half the smallest gap between two distinct chunk scores over n positions
    (when every chunk scores the same, a millionth of the score over n), so a position's score less its place times
    the step keeps the chunks' order and orders ties and positions by place."""
    ordered = means.double().sort(dim=-1).values  # (b, c)
    gaps = ordered.diff(dim=-1)
    gaps = torch.where(gaps > 0, gaps, torch.full_like(gaps, math.inf)).amin(dim=-1, keepdim=True)  # (b, 1)
    flat = ordered.abs().amax(dim=-1, keepdim=True).clamp(min=1.0) * 1e-6
    return torch.where(gaps.isfinite(), gaps / 2, flat) / n


# ---- CriticalKV ---------------------------------------------------------------------------------------------------


def critical_scores(scores: Tensor, v: Tensor, budget: int, context: PromptContext | None, name: str, *,
                    adaptive: bool = False, safeguard: float = 0.2) -> Tensor:  # fmt: skip
    """CriticalKV: the scores (b, g, n) rescored by the values' share of the layer's output, v (b, g, n, e) and the
    layer's output projection from `context`. Uniform heads (kvpress's CriticalKVPress.score): the top
    int(budget x first_stage_ratio) positions by the press's score are raised to the largest score, every other one is
    (score + epsilon) ||W_o v||_1. `adaptive` (kvpress's CriticalAdaKVPress.compress, with AdaKV's `safeguard`): the
    heads' budgets are AdaKV's, from the press's scores, and each head runs the two stages within its own budget; its
    kept positions come out raised to the largest score, so AdaKV's allocation over these scores
    (`headwise.adaptive_lengths`) keeps them, budget x g in all."""
    if context is None or context.out_proj is None:
        raise UnsupportedOptionError(
            f"{name} with critical=True (CriticalKV) needs the model's output projection W_o of each layer to weigh "
            "the values (||W_o v||): run it inside the model (attnbench generate), or set critical=False"
        )
    scores = kvpress_marks(scores)
    norms = output_norms(v, context.out_proj)  # (b, g, n)
    top = torch.finfo(scores.dtype).max
    if not adaptive:
        first = scores.topk(int(budget * FIRST_STAGE), dim=-1).indices
        return ((scores + EPSILON) * norms).scatter_(-1, first, top)
    b, g, n = scores.shape
    scores = scores.scatter(-1, scores.topk(int(budget * safeguard), dim=-1).indices, top)  # each head's safeguard
    chosen = scores.flatten(1).topk(budget * g, dim=-1).indices  # (b, budget g) of (g n)
    head_budgets = torch.zeros(b, g, dtype=torch.long, device=scores.device).scatter_add_(1, chosen // n,
                                                                                          torch.ones_like(chosen))
    scores = _raise_per_head(scores, (head_budgets * FIRST_STAGE).long())  # stage 1 within each head's budget
    return _raise_per_head((scores + EPSILON) * norms, head_budgets)  # stage 2


def _raise_per_head(scores: Tensor, counts: Tensor) -> Tensor:
    """scores (b, g, n) with each head's top counts (b, g) raised to the dtype's largest value (kvpress's loop of
    scatters over the heads, all at once)."""
    order = scores.argsort(dim=-1, descending=True)  # (b, g, n)
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(scores.shape[-1], device=scores.device)
                                             .expand_as(order))  # fmt: skip
    return scores.masked_fill(ranks < counts[..., None], torch.finfo(scores.dtype).max)


def output_norms(v: Tensor, out_proj: Tensor) -> Tensor:
    """||W_o^(i) v_j||_1 averaged over each key/value head's query heads i (kvpress's CriticalKVPress.vwl1norm: the
    value through its query head's slice of the output projection, the L1 norm over the model's width): v (b, g, n, e),
    out_proj (m, h e) -> (b, g, n), float32 at least. A head at a time, as kvpress, so (b, n, m) is held at once."""
    work = torch.promote_types(v.dtype, torch.float32)
    heads = out_proj.shape[1] // v.shape[-1]
    group = heads // v.shape[1]
    w_o = rearrange(out_proj.to(device=v.device, dtype=work), "m (h e) -> h e m", h=heads)
    values = expand_kv_heads(v.to(work), group)  # (b, h, n, e)
    norms = torch.stack([(values[:, head] @ w_o[head]).abs().sum(dim=-1) for head in range(heads)], dim=1)
    return rearrange(norms, "b (g r) n -> b g r n", r=group).mean(dim=2)
