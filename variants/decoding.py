"""Decode forms shared by the built-ins: one new token against what a variant kept (`attnbench.interface`'s
`prefill` / `step`). A softmax over several parts of keys without copying them together, and the states of a
sliding window (StreamingLLM: the first positions plus a ring of the last ones) and of a feature-map RNN.

b - batch, h - heads, n - kept positions, d - head dim, e - value dim, m - feature
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from attnbench.interface import DecodeState
from attnbench.ops import default_scale
from einops import einsum
from torch import Tensor


def softmax_over_parts(q: Tensor, parts: list[tuple[Tensor, Tensor, Tensor | None]]) -> Tensor:
    """One query per head against several sets of keys at once, one softmax over their union: q (b, h, 1, d), each
    part (k (b, h, n, d), v (b, h, n, e), visible (b|1, h|1, n) bool or None = all) -> (b, h, 1, e). The parts are
    read where they lie (a ring buffer, the sinks, the new token), never concatenated."""
    return attend_over_parts(q, parts)[0]


def attend_over_parts(q: Tensor, parts: list[tuple[Tensor, Tensor, Tensor | None]]) -> tuple[Tensor, list[Tensor]]:
    """`softmax_over_parts`, and the weights each part's keys received, (b, h, 1, n) per part (0 where not visible):
    what a method that scores positions by the attention they get (H2O) accumulates."""
    scale = default_scale(q.shape[-1])
    scores = []
    for k, _, visible in parts:
        part = einsum(q, k, "b h i d, b h n d -> b h i n") * scale
        scores.append(part if visible is None else part.masked_fill(~visible[..., None, :], float("-inf")))
    weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)  # the new token is always visible: no empty row
    shares = list(weights.split([part.shape[-1] for part in scores], dim=-1))
    out = None
    for (_, v, _), share in zip(parts, shares):
        part_out = einsum(share, v, "b h i n, b h n e -> b h i e")
        out = part_out if out is None else out + part_out
    assert out is not None
    return out, shares


@dataclass
class WindowState(DecodeState):
    """StreamingLLM's cache: the first `columns` positions' keys and values (the sinks) and a ring of the last
    `window` positions' (slot p % window holds position p), with each slot's position (-1: empty).

    sink_k (b, h, c, d), sink_v (b, h, c, e), ring_k (b, h, w, d), ring_v (b, h, w, e), ring_positions (w,)."""

    sink_k: Tensor
    sink_v: Tensor
    ring_k: Tensor
    ring_v: Tensor
    ring_positions: Tensor
    length: int  # positions seen so far: the next token's position
    columns: int  # how many first positions are sinks (more than the prompt had: later tokens join them)

    @classmethod
    def of(cls, k: Tensor, v: Tensor, *, window: int, columns: int) -> "WindowState":
        """The state after the prompt k (b, h, n, d), v (b, h, n, e)."""
        n = k.shape[-2]
        ring_k = k.new_zeros(*k.shape[:-2], window, k.shape[-1])
        ring_v = v.new_zeros(*v.shape[:-2], window, v.shape[-1])
        positions = torch.full((window,), -1, dtype=torch.long, device=k.device)
        last = torch.arange(max(0, n - window), n, device=k.device)  # the prompt's last w positions
        if window:
            ring_k[..., last % window, :], ring_v[..., last % window, :] = k[..., last, :], v[..., last, :]
            positions[last % window] = last
        kept = min(columns, n)
        return cls(k[..., :kept, :].clone(), v[..., :kept, :].clone(), ring_k, ring_v, positions, n, columns)

    def step(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The new token (position `length`) sees the sinks, the ring's positions not among them, and itself;
        then it joins the state (`push`)."""
        out = softmax_over_parts(q, [
            (self.sink_k, self.sink_v, None), (self.ring_k, self.ring_v, self._in_ring()[None, None]), (k, v, None),
        ])  # fmt: skip
        self.push(k, v)
        return out

    def _in_ring(self) -> Tensor:
        """(w,) bool: slots filled with a position that is not a sink (a sink inside the window counts once)."""
        return self.ring_positions >= self.sink_k.shape[-2]

    def ordered(self) -> tuple[Tensor, Tensor]:
        """Every kept position's key and value in position order, sinks first: (b, h, kept, d), (b, h, kept, e)."""
        slots = torch.argsort(self.ring_positions.masked_fill(~self._in_ring(), -1))[int((~self._in_ring()).sum()):]
        return torch.cat([self.sink_k, self.ring_k[..., slots, :]], -2), torch.cat([self.sink_v, self.ring_v[..., slots, :]], -2)

    def push(self, k: Tensor, v: Tensor) -> None:
        """Keep the new token (b, h, 1, d|e): a sink while fewer than `columns` positions were seen, and in the ring
        slot of the position the next token no longer sees."""
        if self.length < self.columns:  # a prompt shorter than the sinks: this token is one
            self.sink_k, self.sink_v = torch.cat([self.sink_k, k], -2), torch.cat([self.sink_v, v], -2)
        window = self.ring_positions.shape[0]
        if window:
            slot = self.length % window
            self.ring_k[..., slot, :], self.ring_v[..., slot, :] = k[..., 0, :], v[..., 0, :]
            self.ring_positions[slot] = self.length
        self.length += 1

    @property
    def read_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.sink_k, self.sink_v, self.ring_k, self.ring_v))


@dataclass
class FeatureState(DecodeState):
    """A feature-map attention as an RNN: the sum of phi(k_j) [v_j 1] over the positions so far (the normalizer in
    the last column), relative to exp(scale) when the features are stabilized. state (b, h, m, e + 1), scale
    (b, h, 1, 1) (0 when unscaled)."""

    state: Tensor
    scale: Tensor
    length: int

    def step(self, phi_q: Tensor, phi_k: Tensor, v: Tensor, key_log_scale: Tensor | None = None) -> Tensor:
        """Add the new key's features phi_k (b, h, 1, m) (relative to exp(key_log_scale) (b, h, 1, 1), the running
        max up to it, when given) and read the state with phi_q (b, h, 1, m): the output (b, h, 1, e)."""
        from attnbench.variants.feature_attention import normalized, with_ones

        if key_log_scale is not None:  # rescale the state to the new running max before adding to it
            self.state.mul_((self.scale - key_log_scale).exp())
            self.scale = key_log_scale
        self.state.add_(einsum(phi_k, with_ones(v, self.state.dtype), "b h i m, b h i e -> b h m e"))
        self.length += 1
        return normalized(einsum(phi_q, self.state, "b h i m, b h m e -> b h i e")).to(v.dtype)
