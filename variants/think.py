"""ThinK (Xu et al. 2024, "ThinK: Thinner Key Cache by Query-Driven Pruning"; kvpress's ThinKPress,
kvpress/presses/think_press.py): prunes the prompt's KEY CHANNELS, not its tokens. When the prompt ends, each
key/value head scores its channels by mean(q²) over the last `window` queries (averaged over the head's query heads)
times mean(k²) over the prompt's keys, and keeps the `key_channels` share of highest score; every token is kept, its
value whole.

kvpress zeroes the pruned channels and keeps the cache's shape (no memory saved); here the cache HOLDS fewer
channels: the prompt's keys on the kept channels and those channels' indices (`ChannelCache`), and a step dots each
query sliced to them, which gives what the zeroed channels give (the scale stays 1/sqrt(d)). As in kvpress (whose
press acts on the context alone) and ThinK's own code, keys of later tokens (the question, the answer) are held whole;
`prune_new=True` prunes them to the prompt's channels too (one key width: less memory, a departure from both).

Not a scored press (`attnbench.variants.press.ScoredPress`): it ranks channels, not positions, and keeps every token,
so it has no `budget`; its share knob is `key_channels` (`attnbench.generation.budgets`), as kvpress's evaluation
sets ThinK's key_channel_compression_ratio apart from the compression ratio.

b - batch, h - query heads, g - key/value heads, r - query heads per key/value head, n - positions, d - head dim,
c - kept channels, e - value dim, t - positions held with whole keys
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from attnbench.interface import (
    Cost,
    DecodeState,
    Hyperparameter,
    Shape,
    UnsupportedOptionError,
    VariantError,
    query_group,
)
from attnbench.kernels import usable
from attnbench.kernels.steps import two_keys_step
from attnbench.ops import default_scale, group_mean
from einops import rearrange
from torch import Tensor

from attnbench.variants.kv_compression import KVCompression


def channel_scores(q: Tensor, k: Tensor, window: int) -> Tensor:
    """ThinK's channel importance (kvpress's ThinKPress.compress): mean(q²) over the last `window` queries, averaged
    over each key/value head's query heads, times mean(k²) over the keys: q (b, h, n, d), k (b, g, n, d) -> (b, g, d),
    in float32 at least."""
    work = torch.promote_types(q.dtype, torch.float32)
    queries = group_mean(q[..., -window:, :].to(work).pow(2).mean(dim=-2), query_group(q, k))  # (b, g, d)
    return queries * k.to(work).pow(2).mean(dim=-2)


def kept_channels(scores: Tensor, share: float) -> Tensor:
    """The channels kept (b, g, c), ascending: all but the int(d * (1 - share)) of lowest score (kvpress prunes
    int(head_dim * key_channel_compression_ratio))."""
    d = scores.shape[-1]
    pruned = int(d * (1 - share))
    return scores.topk(d - pruned, dim=-1).indices.sort(dim=-1).values


def grown(buffer: Tensor, length: int, more: int) -> Tensor:
    """`buffer` (b, g, capacity, x) with room for `more` positions after its first `length` (doubled when full, as
    `KVCache.append`)."""
    if length + more <= buffer.shape[-2]:
        return buffer
    room = max(2 * buffer.shape[-2], length + more) - length
    return torch.cat([buffer[..., :length, :], buffer.new_empty(*buffer.shape[:-2], room, buffer.shape[-1])], dim=-2)


def filled_bytes(buffer: Tensor, length: int) -> int:
    """Bytes of the first `length` positions of a buffer (b, g, capacity, x)."""
    return buffer[..., :length, :].numel() * buffer.element_size()


@dataclass
class ChannelCache(DecodeState):
    """Every position's value, the prompt's keys on their kept channels, and later keys whole (or pruned too): pruned
    (b, g, capacity, c) filled up to `pruned_length`, channels (b, g, c), whole (b, g, capacity', d) filled up to
    `length - pruned_length`, values (b, g, capacity'', e) up to `length`."""

    pruned: Tensor
    channels: Tensor
    whole: Tensor
    values: Tensor
    pruned_length: int
    length: int
    prune_new: bool = False

    @classmethod
    def of(cls, k: Tensor, v: Tensor, channels: Tensor, room: int, prune_new: bool) -> "ChannelCache":
        """The prompt's k (b, g, n, d) on `channels` (b, g, c), and v (b, g, n, e), with room for `room` steps."""
        (b, g, n, d), c = k.shape, channels.shape[-1]
        pruned = k.new_empty(b, g, n + (room if prune_new else 0), c)
        pruned[..., :n, :] = k.gather(-1, channels[..., None, :].expand(b, g, n, c))
        values = v.new_empty(b, g, n + room, v.shape[-1])
        values[..., :n, :] = v
        whole = k.new_empty(b, g, 0 if prune_new else room, d)
        return cls(pruned, channels, whole, values, n, n, prune_new)

    def append(self, k: Tensor, v: Tensor) -> None:
        """t new positions k (b, g, t, d), v (b, g, t, e): their keys whole, or on the kept channels (`prune_new`)."""
        t = k.shape[-2]
        if self.prune_new:
            self.pruned = grown(self.pruned, self.pruned_length, t)
            index = self.channels[..., None, :].expand(*k.shape[:-1], self.channels.shape[-1])
            self.pruned[..., self.pruned_length : self.pruned_length + t, :] = k.gather(-1, index)
            self.pruned_length += t
        else:
            start = self.length - self.pruned_length
            self.whole = grown(self.whole, start, t)
            self.whole[..., start : start + t, :] = k
        self.values = grown(self.values, self.length, t)
        self.values[..., self.length : self.length + t, :] = v
        self.length += t

    def attend(self, q: Tensor) -> Tensor:
        """One query per head against every position held: q (b, h, 1, d) -> (b, h, 1, e); the query sliced to each
        head's kept channels for the pruned keys, whole for the others; one softmax over all, at the scale 1/sqrt(d).
        Fused (float32 on the CPU): one C call (`two_keys_step`) after the query's channels are gathered."""
        grouped = rearrange(q, "b (g r) 1 d -> b g r d", g=self.channels.shape[1])
        sliced = grouped.gather(-1, self.channels[:, :, None, :].expand(*grouped.shape[:-1], self.channels.shape[-1]))
        pruned, later = self.pruned[..., : self.pruned_length, :], self.whole[..., : self.length - self.pruned_length, :]
        if usable(q, pruned, later, self.values):  # one call: both runs of keys read where they lie
            values = self.values[..., : self.length, :]
            return two_keys_step(sliced, q, pruned, later, values, scale=default_scale(q.shape[-1]))
        scores = torch.matmul(sliced, self.pruned[..., : self.pruned_length, :].transpose(-1, -2))  # (b, g, r, n)
        if self.length > self.pruned_length:
            later = self.whole[..., : self.length - self.pruned_length, :]
            scores = torch.cat([scores, torch.matmul(grouped, later.transpose(-1, -2))], dim=-1)
        weights = torch.softmax(scores.mul_(default_scale(q.shape[-1])), dim=-1)
        out = torch.matmul(weights, self.values[..., : self.length, :])  # (b, g, r, e)
        return rearrange(out, "b g r e -> b (g r) 1 e")

    @property
    def held_bytes(self) -> int:
        """The filled keys (pruned and whole), values, and the channels' indices."""
        later = self.length - self.pruned_length
        keys = filled_bytes(self.pruned, self.pruned_length) + filled_bytes(self.whole, later)
        return keys + filled_bytes(self.values, self.length) + self.channels.numel() * self.channels.element_size()

    @property
    def read_bytes(self) -> int:
        """A step reads everything held."""
        return self.held_bytes

    def select_rows(self, rows: list[int]) -> "ChannelCache":
        index = torch.tensor(rows, device=self.values.device)
        pick = lambda x: x.index_select(0, index)  # noqa: E731
        return ChannelCache(pick(self.pruned), pick(self.channels), pick(self.whole), pick(self.values),
                            self.pruned_length, self.length, self.prune_new)  # fmt: skip


class ThinK(KVCompression):
    """ThinK: the prompt's keys keep their `key_channels` share of channels of highest query-key magnitude."""

    name = "think"
    paper: ClassVar[str] = "ThinK (Xu et al. 2024)"  # for `attnbench list`, as a scored press's
    press: ClassVar[str] = "ThinKPress"
    hyperparameters = {
        "key_channels": Hyperparameter(0.6, "the share of each key/value head's key channels kept, in (0, 1] (0.6: "
                                       "ThinK's code prunes 0.4; kvpress's key_channel_compression_ratio is 1 - it, "
                                       "default 0: none pruned)", kind=float, minimum=0.0),
        "window": Hyperparameter(32, "the prompt's last queries that score the channels (kvpress's window_size: "
                                 "32)", minimum=1),
        "prune_new": Hyperparameter(False, "also hold later tokens' keys on the prompt's channels (kvpress and "
                                    "ThinK's code keep them whole)", kind=bool),
    }  # fmt: skip

    def __init__(self, seed: int = 0, **hyperparams: Any) -> None:
        super().__init__(seed, **hyperparams)
        if not 0 < self.key_channels <= 1:
            raise VariantError(
                f"Invalid hyperparameters for variant 'think': key_channels: {self.key_channels} must be a share in "
                "(0, 1] (the key channels kept; 1 keeps every channel)"
            )

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """Exact causal attention over the prompt (kvpress prunes after it), then the cache of its pruned keys."""
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=query_group(q, k) > 1)
        return out, self.prefill_state(q, k, v, room=room)

    def prefill_state(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> DecodeState:
        channels = kept_channels(channel_scores(q, k, self.window), self.key_channels)
        return ChannelCache.of(k, v, channels, room, self.prune_new)

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        if not isinstance(state, ChannelCache):
            raise UnsupportedOptionError(f"think cannot step from a {type(state).__name__}")
        state.append(k, v)
        return state.attend(q), state

    def cost(self, shape: Shape) -> Cost:
        n = shape.n_k
        return self.prompt_cost(shape, attention_pairs=n * (n + 1) / 2, scored_pairs=0, held_scores=0)
