"""Presses that score the prompt's positions by the attention the prompt's own queries pay them (kvpress's
attention-based scorers): SnapKV's observation window.

- `snapkv` (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before Generation"; kvpress's SnapKVPress):
  at the end of the prompt the last `window` queries (the observation window) vote: their softmax weights on the
  prefix keys, summed over the window, pooled along the keys (max or average over `kernel` neighbours, so a kept key
  brings its neighbours), per query head; under grouped-query attention a key/value head's score is the mean of its
  query heads' pooled votes (kvpress's SnapKVPress.score, kvpress/presses/snapkv_press.py); per head the top budget -
  window prefix positions are kept, and the window.

b - batch, h - query heads, g - key/value heads, n - prompt positions, d - head dim
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from attnbench.interface import Cost, Hyperparameter, Shape, VariantError, query_group
from attnbench.ops import group_mean
from torch import Tensor

from attnbench.variants.kv_compression import POOLS, pooled, window_votes
from attnbench.variants.press import ScoredPress


class SnapKV(ScoredPress):
    """SnapKV: the prompt's last `window` queries vote for the prefix keys; the top ones and the window are kept."""

    name = "snapkv"
    paper = "SnapKV (Li et al. 2024)"
    press = "SnapKVPress"
    uses_queries = True
    hyperparameters = {
        **ScoredPress.hyperparameters,
        # The defaults are the LongBench setting the SnapKV authors' later code base runs (KVCache-Factory, whose
        # SnapKV configs HELMET reuses: window 32, kernel 7, max pooling). SnapKV's own snapkv_utils.py defaults to
        # window 32, kernel 5, average; kvpress's SnapKVPress to window 64, kernel 5, average: set them to compare.
        "window": Hyperparameter(32, "the observation window: the prompt's last queries, which vote and are kept "
                                 "(32: SnapKV's and KVCache-Factory's; kvpress: 64)", minimum=1),
        "kernel": Hyperparameter(7, "pooling kernel along the keys (7: KVCache-Factory's LongBench runs; SnapKV's "
                                 "snapkv_utils.py and kvpress: 5)", minimum=1),
        "pool": Hyperparameter("max", "pooling of the votes: max (KVCache-Factory's LongBench runs) or avg (SnapKV's "
                               "snapkv_utils.py and kvpress)", kind=str, choices=POOLS),
    }  # fmt: skip

    def __init__(self, seed: int = 0, **hyperparams: Any) -> None:
        super().__init__(seed, **hyperparams)
        if self.window >= self.budget:
            raise VariantError(
                f"Invalid hyperparameters for variant 'snapkv': window: {self.window} must be below the budget "
                f"{self.budget} (the window is kept, and budget - window prefix positions)"
            )

    @classmethod
    def smallest_budget(cls, hparams: dict[str, Any]) -> int:
        return hparams["window"] + 1

    def score(self, q: Tensor, k: Tensor, v: Tensor | None = None) -> Tensor:
        """(b, g, n): the prefix positions' votes, pooled per query head then averaged over each key/value head's
        query heads (kvpress's SnapKVPress.score: pooled before the group's mean, which differs from pooling the
        mean for max pooling), the window's +inf (always kept)."""
        votes = pooled(window_votes(q, k, self.window), self.kernel, self.pool)  # (b, h, n - window)
        return F.pad(group_mean(votes, query_group(q, k)), (0, self.window), value=float("inf"))

    def cost(self, shape: Shape) -> Cost:
        n, window = shape.n_k, min(self.window, shape.n_k)
        causal = n * (n + 1) / 2  # the fused kernel's pairs j <= i
        return self.prompt_cost(shape, attention_pairs=causal, scored_pairs=window * n, held_scores=window * n)
