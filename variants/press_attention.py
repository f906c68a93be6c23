"""Presses that score the prompt's positions by the attention the prompt's own queries pay them (kvpress's
attention-based scorers): SnapKV's observation window, TOVA's last query, ObservedAttention's whole prompt.

- `snapkv` (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before Generation"; kvpress's SnapKVPress):
  at the end of the prompt the last `window` queries (the observation window) vote: their softmax weights on the
  prefix keys, summed over the window, pooled along the keys (max or average over `kernel` neighbours, so a kept key
  brings its neighbours), per query head; under grouped-query attention a key/value head's score is the mean of its
  query heads' pooled votes (kvpress's SnapKVPress.score, kvpress/presses/snapkv_press.py); per head the top budget -
  window prefix positions are kept, and the window.
- `tova` (Oren et al. 2024, "Transformers are Multi-State RNNs"; kvpress's TOVAPress, tova_press.py): the last
  query's softmax weights on the earlier keys, averaged over every query head (one ranking for all the heads, as
  kvpress does), the last position kept (scored max + 1: kvpress's slight departure from TOVA, which does not force
  it).
- `observed-attention` (kvpress's ObservedAttentionPress, observed_attention_press.py, after H2O's score, Zhang et
  al. 2023): the attention each key receives from the whole prompt, the sum of its causal weights over the queries
  that see it divided by their number, averaged over each key/value head's query heads; computed 256 queries at a
  time (`attnbench.ops.prompt_mass`), never n x n, where kvpress reads the eager attention matrix.

b - batch, h - query heads, g - key/value heads, n - prompt positions, d - head dim
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from attnbench.interface import Cost, Hyperparameter, Shape, VariantError, query_group
from attnbench.ops import SCORE_CHUNK, group_mean, prompt_mass
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
        """(b, g, n): the prefix positions' votes (averaged over the window, as kvpress's, so CriticalKV's epsilon
        weighs alike; the ranking is the sum's), pooled per query head then averaged over each key/value head's
        query heads (kvpress's SnapKVPress.score: pooled before the group's mean, which differs from pooling the
        mean for max pooling), the window's +inf (always kept)."""
        votes = pooled(window_votes(q, k, self.window) / self.window, self.kernel, self.pool)  # (b, h, n - window)
        return F.pad(group_mean(votes, query_group(q, k)), (0, self.window), value=float("inf"))

    def cost(self, shape: Shape) -> Cost:
        n, window = shape.n_k, min(self.window, shape.n_k)
        causal = n * (n + 1) / 2  # the fused kernel's pairs j <= i
        return self.prompt_cost(shape, attention_pairs=causal, scored_pairs=window * n, held_scores=window * n)


class TOVA(ScoredPress):
    """TOVA: the prompt's last query's attention, averaged over every head, decides; the last position is kept."""

    name = "tova"
    paper = "TOVA (Oren et al. 2024)"
    press = "TOVAPress"
    uses_queries = True

    @classmethod
    def smallest_budget(cls, hparams: dict[str, Any]) -> int:
        return 2  # the last position, and one more

    def score(self, q: Tensor, k: Tensor, v: Tensor | None = None) -> Tensor:
        """(b, g, n): the last query's softmax weights on the earlier keys, averaged over all the query heads (not per
        key/value head: kvpress's TOVAPress.score repeats the mean for every head), the last position max + 1."""
        votes = window_votes(q, k, 1).mean(dim=1, keepdim=True)  # (b, 1, n - 1)
        scores = votes.expand(-1, k.shape[1], -1)
        return F.pad(scores, (0, 1), value=scores.max().item() + 1)

    def cost(self, shape: Shape) -> Cost:
        n = shape.n_k
        return self.prompt_cost(shape, attention_pairs=n * (n + 1) / 2, scored_pairs=n, held_scores=n)


class ObservedAttention(ScoredPress):
    """ObservedAttention: the attention each key received over the whole prompt, averaged over the queries that see
    it."""

    name = "observed-attention"
    paper = "ObservedAttention (H2O's prompt score, Zhang et al. 2023)"
    press = "ObservedAttentionPress"
    uses_queries = True
    scores_prompt_mass = True  # a model's exact prefill hands it the masses from its own pass

    def score(self, q: Tensor, k: Tensor, v: Tensor | None = None) -> Tensor:
        """(b, g, n): the mass key j received, the sum of its causal softmax weights over the queries i >= j, divided
        by their number n - j and averaged over each key/value head's query heads (kvpress's
        ObservedAttentionPress.score, from the eager attention matrix; here `prompt_mass`, 256 queries at a time)."""
        n = k.shape[-2]
        mass = prompt_mass(q, k)  # (b, g, n)
        return mass / torch.arange(n, 0, -1, device=mass.device, dtype=mass.dtype)

    def cost(self, shape: Shape) -> Cost:
        n, chunk = shape.n_k, SCORE_CHUNK
        scored = sum(min(chunk, n - start) * min(n, start + chunk) for start in range(0, n, chunk))  # rows x keys
        return self.prompt_cost(shape, attention_pairs=n * (n + 1) / 2, scored_pairs=scored,
                                held_scores=min(chunk, n) * n)  # fmt: skip
