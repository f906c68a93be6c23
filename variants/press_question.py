"""A press that reads the question: the question's own queries choose what of the context is kept.

- `finch` (Corallo & Papotti 2024, "FINCH: Prompt-guided Key-Value Cache Compression for Large Language Models";
  kvpress's FinchPress, kvpress/presses/finch_press.py): the prompt's last `w` queries vote, SnapKV's rule without
  the pooling, each query's softmax weights on the earlier keys first multiplied by its position (kvpress's
  normalize_scores: a query at position i spreads its weight over ~i keys, so a late query's weights count as much as
  an early one's), averaged over the voters and over each key/value head's query heads; the voters are kept (scored
  max + 1). kvpress finds the question by a delimiter token between context and question (the window is what follows
  it); here `w` is the question's length from `PromptContext.question` (the question-aware protocol puts the question
  at the prompt's end). Without a question (the question-agnostic protocol, or a per-call run) the prompt's last
  `window` queries vote, as SnapKV's window does: a fallback, the question not being in the prompt to vote.

  Departures from kvpress's FinchPress: its keys are re-rotated to consecutive positions after compression
  (rerotate_keys=True), where every press here keeps each key at the position it was encoded at; its optional
  chunked selection (chunk_length, None by default) is not offered (`chunk` is ChunkKV's).

b - batch, h - query heads, g - key/value heads, n - prompt positions, w - voting queries, d - head dim
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from attnbench.interface import Cost, Hyperparameter, Shape, expand_kv_heads, query_group
from attnbench.ops import causal_allows, default_scale, group_mean
from einops import einsum
from torch import Tensor

from attnbench.variants.press import ScoredPress


def window_weights(q: Tensor, k: Tensor, window: int) -> Tensor:
    """The last `window` queries' causal softmax weights (over every key) on the keys before the window: q (b, h, n, d),
    k (b, g, n, d) -> (b, h, window, n - window), float32 at least (kvpress's SnapKVPress.compute_window_attention)."""
    n = k.shape[-2]
    work = torch.promote_types(q.dtype, torch.float32)
    keys = expand_kv_heads(k.to(work), query_group(q, k))
    scores = einsum(q[:, :, n - window :].to(work), keys, "b h i d, b h j d -> b h i j") * default_scale(q.shape[-1])
    i, j = torch.arange(n - window, n, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :]
    return scores.masked_fill_(~causal_allows(i, j), float("-inf")).softmax(dim=-1)[..., : n - window]


class Finch(ScoredPress):
    """Finch: the question's queries vote for the context's positions, each weighted by its position; the question
    is kept."""

    name = "finch"
    paper = "Finch (Corallo & Papotti 2024)"
    press = "FinchPress"
    uses_queries = True
    hyperparameters = {
        **ScoredPress.hyperparameters,
        "window": Hyperparameter(32, "without a question in the prompt (question-agnostic protocol, a per-call run): "
                                 "the prompt's last queries that vote and are kept, as SnapKV's window (32)",
                                 minimum=1),
        "normalize": Hyperparameter(True, "each voter's weights times its position (kvpress's normalize_scores)",
                                    kind=bool),
    }  # fmt: skip

    @classmethod
    def smallest_budget(cls, hparams: dict[str, Any]) -> int:
        return hparams["window"] + 1

    def voters(self, n: int) -> int:
        """How many of the prompt's last queries vote: the question's length when the prompt ends with one, else
        `window`; at most n - 1 (one context position to score)."""
        question = self.context.question if self.context is not None else 0
        return max(1, min(question or self.window, n - 1))

    def score(self, q: Tensor, k: Tensor, v: Tensor | None = None) -> Tensor:
        """(b, g, n): kvpress's FinchPress.score: the voters' weights (times their positions n - w..n - 1 with
        `normalize`), averaged over the voters then over each key/value head's query heads, the voters max + 1."""
        n = k.shape[-2]
        window = self.voters(n)
        weights = window_weights(q, k, window)  # (b, h, w, n - w)
        if self.normalize:
            weights = weights * torch.arange(n - window, n, device=q.device, dtype=weights.dtype)[:, None]
        scores = group_mean(weights.mean(dim=-2), query_group(q, k))  # (b, g, n - w)
        return F.pad(scores, (0, window), value=scores.max().item() + 1)

    def cost(self, shape: Shape) -> Cost:
        n, window = shape.n_k, min(self.window, shape.n_k)
        return self.prompt_cost(shape, attention_pairs=n * (n + 1) / 2, scored_pairs=window * n,
                                held_scores=window * n)  # fmt: skip
