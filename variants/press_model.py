"""Presses that read the model around the layer (`attnbench.interface.PromptContext`): the rotary embedding, or a
pass of the model of their own.

- `expected-attention` (Devoto et al. 2025, "Expected Attention: KV Cache Compression by Estimating Attention from
  Future Queries Distribution"; kvpress's ExpectedAttentionPress, kvpress/presses/expected_attention_press.py): the
  queries to come are modelled as a Gaussian, the mean and covariance of the prompt's queries before the rotary
  embedding (past its `n_sink` first positions), rotated by the rotation averaged over the next `n_future_positions`
  positions; a key's expected attention is exp(mu . k / sqrt(d) + k^T Sigma k / (2 d)), softmaxed over the prompt,
  averaged over each key/value head's query heads, times ||v|| (+ epsilon); the sinks are kept. kvpress projects
  the layer's input hidden states through q_proj for these queries; the prompt's post-rotary queries rotated back
  (`rotary.prompt_unrotated`) are the same vectors, so ours reads them from the exact prompt.
  Without a context (a per-call decode run on synthetic inputs), the documented fallback: the statistics of the
  post-rotary queries as given, with no rotation averaged over future positions.
- `kvzip` (Kim et al. 2025, "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction"; kvpress's
  KVzipPress, kvzip_press.py): each position is scored by the most attention it receives (over the queries and the
  group's query heads) when the model is asked to repeat the prompt, a pass of the model run by the generation
  (`attnbench.generation.repeat_pass`) and handed over as `PromptContext.pass_scores`; a per-call run cannot score
  it (`needs_model`). kvpress's default (layerwise=False) spreads one budget over every layer and head of the model;
  here every layer keeps `budget` per head (kvpress's layerwise=True is `heads="adaptive", safeguard=0`: one top-k
  over a layer's heads, no safeguard).

b - batch, h - query heads, g - key/value heads, n - prompt positions, f - future positions, d - head dim, e - value
dim
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from attnbench.interface import (
    Cost,
    Hyperparameter,
    Shape,
    UnsupportedOptionError,
    expand_kv_heads,
    query_group,
)
from attnbench.ops import SCORE_CHUNK, group_mean
from einops import einsum
from torch import Tensor

from attnbench.variants.press import ScoredPress
from attnbench.variants.rotary import mean_rotation, prompt_unrotated

class ExpectedAttention(ScoredPress):
    """Expected Attention: the attention the queries to come are expected to pay, from the prompt's query statistics,
    times ||v||; the first `n_sink` positions kept."""

    name = "expected-attention"
    paper = "Expected Attention (Devoto et al. 2025)"
    press = "ExpectedAttentionPress"
    uses_queries = True
    hyperparameters = {
        **ScoredPress.hyperparameters,
        "n_future_positions": Hyperparameter(512, "the rotation averaged over this many positions after the prompt "
                                             "(kvpress: 512)", minimum=1),
        "n_sink": Hyperparameter(4, "the first positions, always kept and left out of the statistics (kvpress: 4)",
                                 minimum=0),
        "use_covariance": Hyperparameter(True, "the queries' covariance in the expected attention (else the mean "
                                         "alone)", kind=bool),
        "use_vnorm": Hyperparameter(True, "scores times ||v|| (kvpress: True; its CriticalKV runs use False)",
                                    kind=bool),
        "epsilon": Hyperparameter(0.0, "(score + epsilon) ||v|| (kvpress: 0; its leaderboard's AdaKV runs 0.01)",
                                  kind=float, minimum=0.0),
    }  # fmt: skip

    @classmethod
    def smallest_budget(cls, hparams: dict[str, Any]) -> int:
        return hparams["n_sink"] + 1

    def score(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(b, g, n): kvpress's ExpectedAttentionPress.score, the query statistics from the prompt's queries rotated
        back (`rotary.prompt_unrotated`), the sinks max + 1 (without a rotary embedding, the module's fallback)."""
        n, d, sinks = k.shape[-2], k.shape[-1], self.n_sink
        work = torch.promote_types(q.dtype, torch.float32)
        rotary = self.context.rotary if self.context is not None else None
        queries = prompt_unrotated(q.to(work), rotary) if rotary is not None else q.to(work)
        queries = queries[:, :, sinks:]  # (b, h, n - sinks, d)
        mean = queries.mean(dim=-2)  # (b, h, d)
        centred = queries - mean[..., None, :]
        cov = einsum(centred, centred, "b h n i, b h n j -> b h i j") / queries.shape[-2]
        if rotary is not None:
            turn = mean_rotation(rotary, n, self.n_future_positions, work).to(q.device)  # (d, d)
            mean, cov = mean @ turn.T, turn @ cov @ turn.T
        keys = expand_kv_heads(k[:, :, sinks:].to(work), query_group(q, k))  # (b, h, n - s, d)
        scores = einsum(mean, keys, "b h d, b h n d -> b h n") / math.sqrt(d)
        if self.use_covariance:
            scores = scores + einsum(keys @ cov, keys, "b h n d, b h n d -> b h n") / d / 2
        scores = group_mean(scores.softmax(dim=-1), query_group(q, k))  # (b, g, n - s)
        if self.use_vnorm:
            scores = (scores + self.epsilon) * v[:, :, sinks:].to(work).norm(dim=-1)
        return F.pad(scores, (sinks, 0), value=scores.max().item() + 1)

    def cost(self, shape: Shape) -> Cost:
        n, d = shape.n_k, shape.head_dim
        return self.prompt_cost(shape, attention_pairs=n * (n + 1) / 2, scored_pairs=2 * n * d, held_scores=d * d)


class KVzip(ScoredPress):
    """KVzip: the most attention each position receives while the model repeats the prompt (a pass of the model)."""

    name = "kvzip"
    paper = "KVzip (Kim et al. 2025)"
    press = "KVzipPress"
    needs_model = "a pass of the model repeating the prompt (KVzip's context reconstruction)"
    repeat_pass: ClassVar[bool] = True  # the generation runs `attnbench.generation.repeat_pass` for its rows
    hyperparameters = {**ScoredPress.hyperparameters, "n_sink": Hyperparameter(
        4, "the first positions always kept (kvpress's KVzipPress n_sink, 4: kvzip_press.py compress_post sets their "
        "scores above every other)", minimum=0)}  # fmt: skip

    @classmethod
    def smallest_budget(cls, hparams: dict[str, Any]) -> int:
        return hparams["n_sink"] + 1

    def score(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(b, g, n): the repeat pass's scores of this layer (`PromptContext.pass_scores`, per key/value head: the
        maximum over its query heads, as kvpress's KVzipPress.score_kvzip); kept per query head, each query head
        takes its key/value head's."""
        scores = self.context.pass_scores if self.context is not None else None
        if scores is None:
            raise UnsupportedOptionError(
                f"{self.name} scores each position by a pass of the model repeating the prompt: run it inside the "
                "model (attnbench generate), whose decoder runs that pass given the repeat prompt's tokens "
                "(InModelDecoder(..., repeat=RepeatPrompt.of(encode)))"
            )
        scores = expand_kv_heads(scores.to(k.device), k.shape[1] // scores.shape[1]).clone()
        scores[..., : self.n_sink] = float("inf")  # kvpress 0.5.5's compress_post: the first n_sink always kept
        return scores

    def cost(self, shape: Shape) -> Cost:
        """The prompt's attention and the repeat pass's in this layer: ~n repeat queries over the n prompt keys and
        each other, then the scores over a chunk's keys (its MLPs and projections are not attention's)."""
        n = shape.n_k
        causal = n * (n + 1) / 2
        chunk = min(n, 2048)
        return self.prompt_cost(shape, attention_pairs=causal + n * n + causal, scored_pairs=n * 2 * chunk,
                                held_scores=SCORE_CHUNK * 2 * chunk)  # fmt: skip
