"""KVzip's context reconstruction (Kim et al. 2025, "KVzip: Query-Agnostic KV Cache Compression with Context
Reconstruction"; kvpress's KVzipPress, kvpress/presses/kvzip_press.py): once the exact prompt is prefilled, the model
reads a request to repeat it followed by the prompt again, and each prompt position is scored, per layer and
key/value head, by the most attention any of those tokens pays it (`PromptContext.pass_scores`, read by `kvzip`).

As kvzip does (its `prepare`, `_chunk_fn` and `score_kvzip`):
- the prompt is cut into chunks of 2048 tokens; chunk i's pass reads "\\n\\nRepeat the previous context exactly."
  (i = 0), or "\\n\\nRepeat the part of the previous context exactly, starting with" and the previous chunk's last 8
  tokens, then the suffix "\\n" (kvzip's for a model without a chat template: the prompts here are plain text, no
  chat template applied), then the chunk itself;
- the pass's tokens sit after the prompt (positions n, n + 1, ...: kvpress cuts its cache back to the prompt after
  each chunk) and attend to the whole exact prompt and to each other causally, so its hidden states are the model's;
- a chunk's scores are the softmax weights of the pass's queries over three sets of keys only: the prompt's first 4
  (attention sinks; none for the first chunk, which holds them), the chunk's positions, and the pass's own tokens
  (causally); the maximum over the queries and the group's query heads of the weights on the chunk's positions is
  their score. kvzip first sets the first 4 positions' scores to 1, which the first chunk overwrites when the context
  starts the prompt (no chat-template prefix), as here.
Taken SCORE_CHUNK queries at a time: never more than (SCORE_CHUNK, n + 2048 + t) weights per head held.

b - batch (1), h - query heads, g - key/value heads, r - query heads per key/value head, n - prompt positions, t - the
pass's tokens, s - keys scored, d - head dim, e - value dim
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor

from attnbench.generation.layers import ExactPrompt, self_attention_only
from attnbench.interface import default_scale, query_group
from attnbench.ops import SCORE_CHUNK

CHUNK = 2048  # kvzip's chunk_size: prompt tokens repeated per pass
PREVIOUS = 8  # kvzip's prev_postfix_size: the previous chunk's last tokens, quoted in a later chunk's request
SINKS = 4  # kvzip's n_sink: the prompt's first keys in every later chunk's softmax
FIRST = "\n\nRepeat the previous context exactly."  # kvzip's requests, word for word
LATER = "\n\nRepeat the part of the previous context exactly, starting with"
SUFFIX = "\n"  # kvzip's suffix for a model without a chat template


@dataclass(frozen=True)
class RepeatPrompt:
    """The repeat requests' tokens by the model's tokenizer, special tokens left out (as kvzip encodes them)."""

    first: tuple[int, ...]
    later: tuple[int, ...]
    suffix: tuple[int, ...]

    @classmethod
    def of(cls, encode: Callable[[str], list[int]]) -> "RepeatPrompt":
        return cls(tuple(encode(FIRST)), tuple(encode(LATER)), tuple(encode(SUFFIX)))

    def chunks(self, prompt: Tensor) -> list[tuple[int, int, Tensor]]:
        """(start, end, the pass's tokens (t,)) per chunk of the prompt (n,): its request, the suffix, the chunk."""
        out = []
        for start in range(0, len(prompt), CHUNK):
            end = min(len(prompt), start + CHUNK)
            quoted = prompt[max(0, start - PREVIOUS) : start].tolist()  # the previous chunk's last tokens
            request = list(self.first) if start == 0 else list(self.later) + quoted
            ids = torch.tensor(request + list(self.suffix), dtype=prompt.dtype, device=prompt.device)
            out.append((start, end, torch.cat([ids, prompt[start:end]])))
        return out


@dataclass
class RepeatRouter:
    """Router of one chunk's pass: each layer's tokens attend to the exact prompt and to each other, and the chunk's
    positions get their scores (`chunk_maxima`)."""

    prompt: list[tuple[Tensor, Tensor, Tensor]]  # the exact prompt's q (1, h, n, d), k (1, g, n, d), v per layer
    scores: list[Tensor]  # (1, g, n) per layer, float32: the chunk's positions written
    start: int
    end: int
    layer: int = 0

    def attend(self, query: Tensor, key: Tensor, value: Tensor, *, causal: bool, padding: Tensor | None,
               cross: bool, window: int | None = None) -> Tensor:  # fmt: skip
        self_attention_only(causal, padding, cross)
        layer, self.layer = self.layer, self.layer + 1
        _, prompt_k, prompt_v = self.prompt[layer]
        self.scores[layer][..., self.start : self.end] = chunk_maxima(query, key, prompt_k, self.start, self.end)
        return attend_after(query, key, value, prompt_k, prompt_v, window)


def attend_after(q: Tensor, k: Tensor, v: Tensor, prompt_k: Tensor, prompt_v: Tensor,
                 window: int | None = None) -> Tensor:  # fmt: skip
    """t tokens after the prompt, each attending to every prompt key and to the tokens up to itself (a sliding
    layer's: those within its one-sided `window` alone): q (1, h, t, d), k (1, g, t, d), v (1, g, t, e), the prompt's
    prompt_k (1, g, n, d), prompt_v (1, g, n, e) -> (1, h, t, e), by SDPA, SCORE_CHUNK queries at a time."""
    n, t = prompt_k.shape[-2], q.shape[-2]
    keys, values = torch.cat([prompt_k, k], dim=-2), torch.cat([prompt_v, v], dim=-2)
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    for start in range(0, t, SCORE_CHUNK):
        stop = min(t, start + SCORE_CHUNK)
        i, j = torch.arange(start, stop, device=q.device)[:, None], torch.arange(n + stop, device=q.device)[None, :]
        allowed = j <= n + i  # (stop - start, n + stop): key j sits at position j, query i at n + i
        if window is not None:
            allowed &= n + i - j <= window
        out[..., start:stop, :] = F.scaled_dot_product_attention(
            q[..., start:stop, :], keys[..., : n + stop, :], values[..., : n + stop, :], attn_mask=allowed,
            enable_gqa=query_group(q, k) > 1,
        )  # fmt: skip
    return out


def chunk_maxima(q: Tensor, k: Tensor, prompt_k: Tensor, start: int, end: int) -> Tensor:
    """kvzip's scores of the prompt positions start..end-1 in one layer (kvpress's KVzipPress.score_kvzip): the pass's
    queries q (1, h, t, d), softmaxed over the prompt's first min(4, start) keys, the chunk's keys and the pass's own
    k (1, g, t, d) (causally), their weights on the chunk's keys, the maximum over the queries and each key/value
    head's query heads -> (1, g, end - start), float32."""
    work = torch.promote_types(q.dtype, torch.float32)
    sinks, g, t = min(SINKS, start), k.shape[1], q.shape[-2]
    scored = sinks + end - start  # the prompt's keys in the softmax, then the pass's own
    keys = torch.cat([prompt_k[..., :sinks, :], prompt_k[..., start:end, :], k], dim=-2).to(work)  # (1, g, s, d)
    grouped = rearrange(q.to(work) * default_scale(q.shape[-1]), "b (g r) t d -> b g r t d", g=g)
    best = torch.zeros(q.shape[0], g, end - start, dtype=work, device=q.device)
    for first in range(0, t, SCORE_CHUNK):
        stop = min(t, first + SCORE_CHUNK)
        scores = einsum(grouped[..., first:stop, :], keys, "b g r t d, b g s d -> b g r t s")
        own = torch.arange(keys.shape[-2], device=q.device)[None, :] - scored  # a pass token's index, < 0: the prompt
        scores.masked_fill_(own > torch.arange(first, stop, device=q.device)[:, None], float("-inf"))
        weights = scores.softmax(dim=-1)[..., sinks:scored]  # (1, g, r, queries, end - start)
        best = torch.maximum(best, weights.amax(dim=(2, 3)))
    return best


def repeat_scores(forward: Callable[[RepeatRouter, Tensor, int], Tensor], exact: ExactPrompt,
                  prompt: Tensor, repeat: RepeatPrompt) -> list[Tensor]:  # fmt: skip
    """kvzip's scores (1, g, n) per layer of the prompt (n,) the exact pass `exact` holds, from one forward pass per
    chunk (`forward(router, ids (1, t), first position)`: the decoder's)."""
    n = len(prompt)
    scores = [k.new_zeros(1, k.shape[1], n, dtype=torch.promote_types(k.dtype, torch.float32))
              for _, k, _ in exact.layers]  # fmt: skip
    for start, end, ids in repeat.chunks(prompt):
        forward(RepeatRouter(exact.layers, scores, start, end), ids[None], n)
    return scores
