"""Head-wise KV-cache budgets that free what they evict: each key/value head keeps its own number of the prompt's
positions, held packed in a ragged cache, where kvpress masks the evicted keys (`masked_key_indices`) and holds the
whole cache.

- `RaggedCache`: the prompt's kept positions of every (batch row, key/value head) packed along one axis with their
  offsets, and the tokens after the prompt (the same for every head) in a regular buffer; a step is one softmax per
  head over its packed part and the appended part, reading only what is held.
- `adaptive_lengths`: AdaKV's head-wise budgets (Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive
  Budget Allocation"; kvpress/presses/adakv_press.py), which a scored press runs with `heads="adaptive"`.
- `duo-attention` (Xiao et al. 2024, "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming
  Heads"; kvpress's DuoAttentionPress, kvpress/presses/duo_attention_press.py): retrieval heads keep the whole prompt,
  streaming heads its first `sinks` and last `recent` positions; the heads are scored on the fly from the prompt.

b - batch, h - query heads, g - key/value heads, r - query heads per key/value head, n - prompt positions, t - new
tokens, m - appended positions, p - kept positions of every head, packed, d - head dim, e - value dim
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from attnbench.interface import (
    Cost,
    DecodeState,
    Hyperparameter,
    PromptContext,
    Shape,
    UnsupportedOptionError,
    VariantError,
    expand_kv_heads,
    query_group,
)
from attnbench.kernels import usable
from attnbench.kernels.steps import ragged_step
from attnbench.ops import KVCache, default_scale, group_mean
from einops import einsum, rearrange
from torch import Tensor

from attnbench.variants.kv_compression import KVCompression
from attnbench.variants.rotary import Rotary, rotated, unrotated



# ---- the ragged cache --------------------------------------------------------------------------------------------


@dataclass
class RaggedCache(DecodeState):
    """Per-head caches of different lengths, packed: keys (p, d), values (p, e) of the prompt's kept positions, head
    (row, j) at offsets[row g + j] : offsets[row g + j + 1], in sequence order, and their positions (p,) in the
    prompt (for tests and comparisons; not held by a real cache); the tokens after the prompt, kept by every head, in
    `new`, a KV cache (b, g, ·, d|e) of its own."""

    keys: Tensor
    values: Tensor
    offsets: Tensor  # (b g + 1,) int64
    positions: Tensor  # (p,) int64
    new: KVCache

    evicts = False  # it only appends after the prompt

    @classmethod
    def of_scores(cls, k: Tensor, v: Tensor, scores: Tensor, lengths: Tensor, room: int = 0) -> "RaggedCache":
        """Per head, its top lengths (b, g) positions by scores (b, g, n) of k (b, g, n, d), v (b, g, n, e), with room
        for `room` later tokens."""
        order = scores.argsort(dim=-1, descending=True, stable=True)  # (b, g, n)
        places = torch.arange(order.shape[-1], device=k.device).expand_as(order)
        ranks = torch.empty_like(order).scatter_(-1, order, places)  # each position's place by score
        return cls.of_mask(k, v, ranks < lengths[..., None], room)

    @classmethod
    def of_mask(cls, k: Tensor, v: Tensor, keep: Tensor, room: int = 0) -> "RaggedCache":
        """The positions `keep` (b, g, n) marks in k (b, g, n, d), v (b, g, n, e), packed head by head."""
        b, g, n, d = k.shape
        offsets = F.pad(keep.sum(dim=-1).flatten().cumsum(0), (1, 0))
        positions = torch.arange(n, device=k.device).expand(b, g, n)[keep]
        new = KVCache.of(k.new_empty(b, g, 0, d), v.new_empty(b, g, 0, v.shape[-1]), room)
        return cls(k[keep], v[keep], offsets, positions, new)

    @cached_property
    def bounds(self) -> list[int]:
        """The offsets as numbers (read once: a step loops over the heads without a device sync)."""
        return self.offsets.tolist()

    @property
    def lengths(self) -> Tensor:
        """(b, g): the prompt's positions each head keeps."""
        return (self.offsets[1:] - self.offsets[:-1]).view(self.new.keys.shape[:2])

    @property
    def length(self) -> int:
        """Tokens after the prompt."""
        return self.new.length

    @property
    def new_k(self) -> Tensor:
        """(b, g, length, d): the tokens after the prompt."""
        return self.new.k

    @property
    def new_v(self) -> Tensor:
        return self.new.v

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """t new tokens join every head and attend: q (b, h, t, d), k (b, g, t, d), v (b, g, t, e) -> (b, h, t, e); new
        token i sees its head's kept positions and the new tokens up to itself, the head's r query heads together.

        Fused (one token, float32 on the CPU): one C call (`ragged_step`), each head's parts read where they lie.
        Eager: a loop over the b g heads, each two matrix products and a softmax over its packed part and the appended
        part.
        Measured against segment ops (scores of every packed position at once through its head's query, a scatter
        max, index_add sums) at g = 3, r = 3, d = e = 64, 800 / 1000 / 1200 kept and 40 appended, one thread
        (torch.utils.benchmark): t = 1, 143 us against 613 us (masking every head's scores over all packed positions:
        195 us); t = 5, 294 us against 2011 us (1115 us). A uniform KVCache step over 1040 positions: 85 us."""
        t, g = q.shape[-2], self.new.keys.shape[1]
        scale = default_scale(q.shape[-1])
        packed = (self.keys, self.values, self.new.keys, self.new.values)
        if t == 1 and self.length < self.new.keys.shape[-2] and usable(q, k, v, *packed):  # one call
            self.new.length += 1
            return ragged_step(q, self.keys, self.values, self.offsets, self.new.keys, self.new.values, k, v,
                               count=self.length, scale=scale)  # fmt: skip
        self.new.append(k, v)
        grouped = rearrange(q, "b (g r) t d -> b g (r t) d", g=g)
        appended = torch.matmul(grouped, self.new_k.transpose(-1, -2)).mul_(scale)  # (b, g, r t, m)
        if t > 1:  # new token i sees the appended positions up to its own
            m = self.length
            hidden = torch.arange(m, device=q.device)[None, :] > torch.arange(m - t, m, device=q.device)[:, None]
            appended = rearrange(appended, "b g (r t) m -> b g r t m", t=t).masked_fill_(hidden, float("-inf"))
            appended = rearrange(appended, "b g r t m -> b g (r t) m")
        out = q.new_empty(*grouped.shape[:-1], self.values.shape[-1])  # (b, g, r t, e)
        bounds = self.bounds
        for head in range(len(bounds) - 1):
            row, j = divmod(head, g)
            start, end = bounds[head], bounds[head + 1]
            scores = torch.matmul(grouped[row, j], self.keys[start:end].T).mul_(scale)  # (r t, s)
            weights = torch.cat([scores, appended[row, j]], dim=-1).softmax(dim=-1)  # (r t, s + m)
            kept = torch.matmul(weights[:, : end - start], self.values[start:end])
            out[row, j] = kept.addmm_(weights[:, end - start :], self.new_v[row, j])
        return rearrange(out, "b g (r t) e -> b (g r) t e", t=t)

    @property
    def held_bytes(self) -> int:
        """The packed keys and values, their offsets, and the filled part of the appended buffers."""
        packed = sum(x.numel() * x.element_size() for x in (self.keys, self.values, self.offsets))
        return packed + self.new.held_bytes

    @property
    def read_bytes(self) -> int:
        """A step reads every head's packed part and the appended tokens: what is held."""
        return self.held_bytes

    @property
    def nbytes(self) -> int:
        """Its whole allocation (the appended buffers' room included), less the kept positions' indices, which a real
        cache would not hold (they are kept for tests and the kvpress overlap table)."""
        return super().nbytes - self.positions.numel() * self.positions.element_size()

    def select_rows(self, rows: list[int]) -> "RaggedCache":
        g, bounds = self.new.keys.shape[1], self.bounds
        spans = [slice(bounds[row * g], bounds[(row + 1) * g]) for row in rows]
        index = torch.tensor(rows, device=self.keys.device)
        lengths = self.lengths.index_select(0, index).flatten()
        return RaggedCache(
            torch.cat([self.keys[span] for span in spans]),
            torch.cat([self.values[span] for span in spans]),
            F.pad(lengths.cumsum(0), (1, 0)),
            torch.cat([self.positions[span] for span in spans]),
            self.new.select_rows(rows),
        )


# ---- AdaKV's head-wise budgets -------------------------------------------------------------------------------------


def adaptive_lengths(scores: Tensor, budget: int, safeguard: float) -> Tensor:
    """AdaKV's budgets of a layer's heads (kvpress's AdaKVPress.compress, kvpress/presses/adakv_press.py): each head's
    top int(budget * safeguard) positions are raised to the dtype's largest score, then one top-k over the scores of
    all the layer's heads keeps budget * g positions (kvpress prunes the g (n - budget) lowest: the same set). scores
    (b, g, n) -> the positions each head keeps (b, g), budget * g per batch row."""
    if not 0 <= safeguard <= 1:
        raise VariantError(f"safeguard: {safeguard} must lie in [0, 1] (a share of the uniform budget per head)")
    b, g, n = scores.shape
    if budget >= n:
        return torch.full((b, g), n, dtype=torch.long, device=scores.device)
    raised = scores.clone()
    raised.scatter_(-1, scores.topk(int(budget * safeguard), dim=-1).indices, torch.finfo(scores.dtype).max)
    kept = raised.flatten(1).topk(budget * g, dim=-1).indices  # (b, budget g) of (g n)
    lengths = torch.zeros(b, g, dtype=torch.long, device=scores.device)
    return lengths.scatter_add_(1, kept // n, torch.ones_like(kept))


# ---- DuoAttention ------------------------------------------------------------------------------------------------

ON_THE_FLY_LENGTH = 500  # kvpress's duo_attention_on_the_fly q_len: the mean query and key repeated at 500 positions
FALLBACK_THETA = 10000.0  # the rotary base taken without the model (Llama's default)


def standard_rotary(head_dim: int, theta: float = FALLBACK_THETA) -> Rotary:
    """Llama's default rotary embedding (base theta over the whole head dim), in the PromptContext's form."""
    inverse = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)

    def at(positions: Tensor) -> tuple[Tensor, Tensor]:
        angles = positions.to(torch.float64)[:, None] * inverse.to(positions.device)[None, :]  # (n, d / 2)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().float(), angles.sin().float()

    return at


def on_the_fly_scores(q: Tensor, k: Tensor, rotary: Rotary, length: int = ON_THE_FLY_LENGTH) -> Tensor:
    """kvpress's duo_attention_on_the_fly for one layer, from the prompt: the mean pre-rotary query and key (the
    prompt's post-rotary q (b, h, n, d), k (b, g, n, d) turned back), repeated at positions 0..length-1 and rotated;
    the last query's softmax weights over those keys; the area under their cumulated curve (low: the attention stays
    near the query, a streaming head), averaged over each key/value head's query heads -> (b, g)."""
    work = torch.promote_types(q.dtype, torch.float32)
    cos, sin = (x.to(q.device, work) for x in rotary(torch.arange(q.shape[-2], device=q.device)))
    mean_q = unrotated(q.to(work), cos, sin).mean(dim=-2)  # (b, h, d)
    mean_k = unrotated(k.to(work), cos, sin).mean(dim=-2)  # (b, g, d)
    cos, sin = (x.to(q.device, work) for x in rotary(torch.arange(length, device=q.device)))
    last = rotated(mean_q, cos[-1], sin[-1])  # (b, h, d): the query at position length - 1
    keys = expand_kv_heads(rotated(mean_k[:, :, None, :], cos, sin), query_group(q, k))  # (b, h, length, d)
    weights = (einsum(last, keys, "b h d, b h j d -> b h j") / math.sqrt(q.shape[-1])).softmax(dim=-1)
    return group_mean(weights.cumsum(dim=-1).mean(dim=-1), query_group(q, k))


def streaming_count(ratio: float, heads: int, layer: int) -> int:
    """Streaming heads of layer `layer`: round(heads * ratio) on average, the rounding carried over the layers, so
    that layers 0..L-1 hold round(L * heads * ratio) of them, kvpress's count over the whole model."""
    return round(heads * ratio * (layer + 1)) - round(heads * ratio * layer)


class DuoAttention(KVCompression):
    """DuoAttention: the heads whose attention stays nearest (scored on the fly) become streaming heads, keeping the
    first `sinks` and last `recent` positions of the prompt; the others, retrieval heads, keep all of it.

    kvpress's rule (DuoAttentionPress with on_the_fly_scoring), with these departures: the heads are scored from the
    prompt's own queries and keys (kvpress: 50 BookSum samples, which attnbench does not download), and ranked within
    each layer, `streaming_count` of them per layer (kvpress ranks all the model's heads at once; here a layer meets
    its prompt before the next is computed). Without the model's rotary embedding (a per-call decode run on synthetic
    inputs) the score turns q and k by Llama's default one (`standard_rotary`). As in kvpress the cache is compressed
    once after the prompt and every later token appended to every head (DuoAttention's own decoding slides the
    streaming heads' window)."""

    name = "duo-attention"
    paper: ClassVar[str] = "DuoAttention (Xiao et al. 2024)"
    press: ClassVar[str] = "DuoAttentionPress"
    hyperparameters = {
        "head_compression_ratio": Hyperparameter(
            0.5, "the share of key/value heads made streaming heads (kvpress's head_compression_ratio); the others, "
            "retrieval heads, keep the whole prompt", kind=float, minimum=0.0,
        ),
        "sinks": Hyperparameter(128, "a streaming head's first positions, kept (the authors' sink_size: 128)",
                                minimum=0),
        "recent": Hyperparameter(256, "a streaming head's last positions, kept (the authors' recent_size: 256)",
                                 minimum=0),
        "on_the_fly_scoring": Hyperparameter(
            True, "score the heads from the prompt (kvpress's on_the_fly_scoring); false would load the authors' "
            "trained patterns, which kvpress downloads: refused", kind=bool,
        ),
    }  # fmt: skip
    context: PromptContext | None = None

    def __init__(self, seed: int = 0, **hyperparams: Any) -> None:
        super().__init__(seed, **hyperparams)
        if not self.on_the_fly_scoring:
            raise VariantError(
                "Invalid hyperparameters for variant 'duo-attention': on_the_fly_scoring=False asks for the "
                "DuoAttention authors' trained head patterns, which kvpress downloads from GitHub; attnbench never "
                "downloads weights at run time. Leave on_the_fly_scoring at true (the heads scored from the prompt)"
            )
        if self.head_compression_ratio > 1:
            raise VariantError(
                f"Invalid hyperparameters for variant 'duo-attention': head_compression_ratio: "
                f"{self.head_compression_ratio} is a share of the heads, at most 1"
            )

    def for_prompt(self, context: PromptContext) -> "DuoAttention":
        bound = copy.copy(self)
        bound.context = context
        return bound

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """Exact causal attention over the prompt, then the cache of what the heads keep."""
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=query_group(q, k) > 1)
        return out, self.prefill_state(q, k, v, room=room)

    def prefill_state(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> DecodeState:
        """A ragged cache: the streaming heads' sinks and recent positions, the retrieval heads' whole prompt (a plain
        KVCache when every head keeps it all)."""
        (b, g, n, _), context = k.shape, self.context or PromptContext()
        count = streaming_count(self.head_compression_ratio, g, context.layer)
        if count == 0 or n <= self.sinks + self.recent:
            return KVCache.of(k, v, room)
        scores = on_the_fly_scores(q, k, context.rotary or standard_rotary(q.shape[-1]))  # (b, g)
        order = scores.argsort(dim=-1, stable=True)  # the lowest scores first (kvpress: np.argsort)
        streaming = torch.zeros(b, g, dtype=torch.bool, device=k.device).scatter_(-1, order[:, :count], True)
        position = torch.arange(n, device=k.device)
        middle = (position >= self.sinks) & (position < n - self.recent)  # (n,)
        return RaggedCache.of_mask(k, v, ~(streaming[..., None] & middle), room)

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        if isinstance(state, KVCache):
            return state.step(q, k, v), state
        if isinstance(state, RaggedCache):
            return state.attend(q, k, v), state
        raise UnsupportedOptionError(f"{self.name} cannot step from a {type(state).__name__}")

    def steps(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        if isinstance(state, RaggedCache):
            return state.attend(q, k, v), state
        return super().steps(state, q, k, v)

    def cost(self, shape: Shape) -> Cost:
        n = shape.n_k
        return self.prompt_cost(shape, attention_pairs=n * (n + 1) / 2, scored_pairs=ON_THE_FLY_LENGTH,
                                held_scores=ON_THE_FLY_LENGTH)  # fmt: skip
