"""Presses that score the prompt's positions from its keys and values alone (kvpress's query-free scorers): no
attention is computed to choose what is kept.

- `random` (kvpress's RandomPress, kvpress/presses/random_press.py): a uniform draw per position, seeded from the
  variant's `seed`: the floor any method must beat.
- `knorm` (Devoto et al. 2024, "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression"; kvpress's
  KnormPress, knorm_press.py): -||k||: the keys of smallest norm are kept (they draw the most attention).
- `keydiff` (Park et al. 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
  Resource-Constrained Environments"; kvpress's KeyDiffPress, keydiff_press.py): minus the cosine similarity of each
  key to the mean of the head's normalised keys: the most distinctive keys are kept. (KeyDiff's own block-wise
  eviction is kvpress's BlockPress around it; here, as KeyDiffPress, one pass over the prompt.)
- `lagkv` (Liang et al. 2025, "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are Important";
  kvpress's LagKVPress, lagkv_press.py): after `n_sink` sinks the prompt is cut into partitions of `lag_size`; each
  token of a partition is scored by the spread (std over channels) of its key and of its value min-max normalised by
  the next partition's range, softmaxed within the partition, then ranked within it (`cross_scoring=False`); the
  sinks and the tail (the last partition and the remainder) score 1, above every rank. A prompt shorter than
  n_sink + 2 lag_size is scored as a window: the sinks, then the newest first. No `smallest_budget`: as in kvpress,
  a budget below the sinks and the tail keeps some of them (the tied top scores), not all.

Every score is computed in float32 at least (kvpress computes in the keys' dtype; the ranking is the same but for
ties in low precision).

b - batch, g - key/value heads, n - prompt positions, d - head dim, e - value dim, p - partitions, l - lag
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from attnbench.interface import Hyperparameter
from einops import rearrange
from torch import Tensor

from attnbench.variants.press import ScoredPress


def widened(x: Tensor) -> Tensor:
    """x in float32 at least (float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class RandomPress(ScoredPress):
    """Random: every position scored by a uniform draw from the variant's seed; the floor of the presses."""

    name = "random"
    paper = "Random (kvpress's baseline)"
    press = "RandomPress"

    def score(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(b, g, n) uniform in [0, 1), the same for the same seed and shape (kvpress's RandomPress draws
        torch.rand(*keys.shape[:-1]) from a generator seeded with its `seed`)."""
        generator = torch.Generator().manual_seed(self.seed)  # on the CPU: the same draw on every device
        return torch.rand(k.shape[:-1], generator=generator, dtype=widened(k).dtype).to(k.device)


class KnormPress(ScoredPress):
    """Knorm: the keys of smallest L2 norm are kept."""

    name = "knorm"
    paper = "Knorm (Devoto et al. 2024)"
    press = "KnormPress"

    def score(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(b, g, n): -||k|| (kvpress's KnormPress.score)."""
        return -widened(k).norm(dim=-1)


class KeyDiffPress(ScoredPress):
    """KeyDiff: the keys least similar to the head's mean normalised key are kept."""

    name = "keydiff"
    paper = "KeyDiff (Park et al. 2025)"
    press = "KeyDiffPress"

    def score(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(b, g, n): -cos(k, anchor), the anchor the mean over the prompt of the normalised keys (kvpress's
        KeyDiffPress.score)."""
        k = widened(k)
        anchor = F.normalize(k, p=2, dim=-1).mean(dim=-2, keepdim=True)  # (b, g, 1, d)
        return -F.cosine_similarity(k, anchor, dim=-1)


class LagKVPress(ScoredPress):
    """LagKV: each partition's tokens ranked by how much their keys and values spread relative to the next
    partition's range; the sinks and the tail kept first."""

    name = "lagkv"
    paper = "LagKV (Liang et al. 2025)"
    press = "LagKVPress"
    hyperparameters = {
        **ScoredPress.hyperparameters,
        "n_sink": Hyperparameter(4, "the first positions, scored above every other (kvpress's n_sink: 4)", minimum=0),
        "lag_size": Hyperparameter(128, "the partition's length: each is scored against the next (kvpress's "
                                   "lag_size: 128)", minimum=2),
        "cross_scoring": Hyperparameter(False, "score by the softmaxed spread itself, comparable across partitions "
                                        "(kvpress's cross_scoring, False: ranks within each partition)", kind=bool),
    }  # fmt: skip

    def score(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(b, g, n): kvpress's LagKVPress.score: 1 for the sinks and the tail, each partition's ranks / lag_size (or
        its softmaxed spreads) between them."""
        (b, g, n, _), sinks, lag = k.shape, self.n_sink, self.lag_size
        work = torch.promote_types(k.dtype, torch.float32)
        scores = torch.ones(b, g, n, dtype=work, device=k.device)
        if n < sinks + 2 * lag:  # too short to partition: the sinks, then the newest first (a window)
            if n > sinks:
                scores[..., sinks:] = torch.arange(n - sinks, device=k.device, dtype=work) / (n - sinks)
            return scores
        end = sinks + ((n - sinks) // lag) * lag  # the tail: the last partition and the remainder, lag to 2 lag - 1
        spread = (lag_spread(k[..., sinks:end, :], lag) + lag_spread(v[..., sinks:end, :], lag)) / 2  # (b, g, p-1, l)
        if not self.cross_scoring:
            spread = spread.argsort(dim=-1).argsort(dim=-1).to(work) / lag
        scores[..., sinks : end - lag] = rearrange(spread, "b g p l -> b g (p l)")
        return scores


def lag_spread(x: Tensor, lag: int) -> Tensor:
    """LagKV's lag-relative information (kvpress's LagKVPress._get_states_score): x (b, g, p l, d) in partitions of
    `lag`; each of the first p - 1 partitions min-max normalised per channel by the next one's range, the std over
    channels of each token, softmaxed within the partition -> (b, g, p - 1, l)."""
    parts = rearrange(widened(x), "b g (p l) d -> b g p l d", l=lag)
    reference, scored = parts[:, :, 1:], parts[:, :, :-1]
    low, high = reference.min(dim=-2, keepdim=True).values, reference.max(dim=-2, keepdim=True).values
    return ((scored - low) / (high - low)).std(dim=-1).softmax(dim=-1)
