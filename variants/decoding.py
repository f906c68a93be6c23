"""Decode forms shared by the built-ins: one new token against what a variant kept (`attnbench.interface`'s
`prefill` / `step`). A softmax over several parts of keys without copying them together, and the states of a
sliding window (StreamingLLM: the first positions plus a ring of the last ones) and of a feature-map RNN.

b - batch, h - heads, n - kept positions, d - head dim, e - value dim, m - feature
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from attnbench.interface import DecodeState
from attnbench.kernels import usable
from attnbench.kernels.steps import parts_step
from attnbench.ops import default_scale, softmax_step
from einops import einsum, rearrange
from torch import Tensor


def softmax_over_parts(q: Tensor, parts: list[tuple[Tensor, Tensor, Tensor | None]]) -> Tensor:
    """One query per head against several sets of keys at once, one softmax over their union: q (b, h, 1, d), each
    part (k (b, g, n, d), v (b, g, n, e), visible (b|1, g|1, n) bool or None = all) -> (b, h, 1, e), h / g query heads
    sharing each key/value head. The parts are read where they lie (a ring buffer, the sinks, the new token), never
    concatenated: fused (float32 on the CPU), one C call (`parts_step`)."""
    if usable(q, *(x for k, v, _ in parts for x in (k, v))):
        return parts_step(q, parts, default_scale(q.shape[-1]))
    return attend_over_parts(q, parts)[0]


def attend_over_parts(q: Tensor, parts: list[tuple[Tensor, Tensor, Tensor | None]]) -> tuple[Tensor, list[Tensor]]:
    """`softmax_over_parts`, and the weights each part's keys received from each query head of their group,
    (b, g, r, n) per part (r = h / g; 0 where not visible): what a method that scores positions by the attention they
    get (H2O) accumulates."""
    scale = default_scale(q.shape[-1])
    grouped = rearrange(q, "b (g r) 1 d -> b g r d", g=parts[0][0].shape[1])
    scores = []  # matmuls: ~12% faster than einsum for a step's small products (3 heads x 512 keys, measured here)
    for k, _, visible in parts:
        part = torch.matmul(grouped, k.transpose(-1, -2)).mul_(scale)  # (b, g, r, n)
        scores.append(part if visible is None else part.masked_fill_(~visible[..., None, :], float("-inf")))
    weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)  # the new token is always visible: no empty row
    shares = list(weights.split([part.shape[-1] for part in scores], dim=-1))
    out = None
    for (_, v, _), share in zip(parts, shares):
        part_out = torch.matmul(share, v)  # (b, g, r, e)
        out = part_out if out is None else out.add_(part_out)
    assert out is not None
    return rearrange(out, "b g r e -> b (g r) 1 e"), shares


@dataclass
class WindowState(DecodeState):
    """StreamingLLM's cache in one buffer: `columns` slots for the first positions (the sinks), then a ring of
    `window` + 1 slots for the latest positions (position p >= columns in slot columns + p % (window + 1)), each
    slot's position beside it (-1: empty). A new token is written into its slot first; then every filled slot is
    what it sees (the sinks, the last `window` positions and itself), so a step is one softmax over the whole buffer,
    with no mask once every slot is filled.

    keys (b, h, c + w + 1, d), values (b, h, c + w + 1, e), positions (c + w + 1,)."""

    keys: Tensor
    values: Tensor
    positions: Tensor
    length: int  # positions seen so far: the next token's position
    columns: int  # slots for the first positions (a prompt shorter than them leaves later tokens to fill them)
    filled: int  # slots holding a position

    @classmethod
    def of(cls, k: Tensor, v: Tensor, *, window: int, columns: int) -> "WindowState":
        """The state after the prompt k (b, h, n, d), v (b, h, n, e)."""
        n, slots = k.shape[-2], columns + window + 1
        keys = k.new_zeros(*k.shape[:-2], slots, k.shape[-1])
        values = v.new_zeros(*v.shape[:-2], slots, v.shape[-1])
        positions = torch.full((slots,), -1, dtype=torch.long, device=k.device)
        kept = torch.cat([
            torch.arange(min(columns, n)), torch.arange(min(n, max(columns, n - window - 1)), n)  # sinks; the ring's
        ]).to(k.device)  # fmt: skip
        where = cls.slot_of(kept, columns, window)
        keys[..., where, :], values[..., where, :], positions[where] = k[..., kept, :], v[..., kept, :], kept
        return cls(keys, values, positions, n, columns, len(kept))

    @staticmethod
    def slot_of(position: Tensor | int, columns: int, window: int) -> Tensor | int:
        """A sink's own slot, or its place in the ring."""
        if isinstance(position, int):
            return position if position < columns else columns + position % (window + 1)
        return torch.where(position < columns, position, columns + position % (window + 1))

    def push(self, k: Tensor, v: Tensor) -> None:
        """Write the new token (b, h, 1, d|e) into its slot: a sink, or the ring slot of the position the new token
        no longer sees (window + 1 positions back)."""
        slot = self.take_slot()
        self.keys[..., slot, :], self.values[..., slot, :] = k[..., 0, :], v[..., 0, :]

    def take_slot(self) -> int:
        """The new token's slot (see `push`), its position recorded there: the caller writes its key and value."""
        slot = self.slot_of(self.length, self.columns, self.positions.shape[0] - self.columns - 1)
        if self.filled < self.positions.shape[0]:  # once every slot is filled none is empty again
            self.filled += int(self.positions[slot] < 0)
        self.positions[slot] = self.length
        self.length += 1
        return slot

    def visible(self) -> Tensor | None:
        """(n,) bool of the filled slots, None when every slot is (no mask needed)."""
        return None if self.filled == self.positions.shape[0] else self.positions >= 0

    def step(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The new token joins the buffer, then sees every filled slot: (b, h, 1, e) (one call where fused)."""
        slot = self.take_slot()
        return softmax_step(q, self.keys, self.values, self.visible(), new=(k, v, slot))

    evicts = True  # a step writes over the position leaving the window

    def kept(self) -> tuple[Tensor, Tensor]:
        """The sinks and the window, in position order."""
        return self.ordered()

    @property
    def held_bytes(self) -> int:
        """The filled slots' keys and values (the ring's spare slot for the next token left out)."""
        b, h = self.keys.shape[:2]
        return b * h * self.filled * (self.keys.shape[-1] * self.keys.element_size()
                                      + self.values.shape[-1] * self.values.element_size())

    @classmethod
    def stack(cls, states: list["DecodeState"]) -> "WindowState":
        """One buffer of the states' rows, in order: rows that have seen the same positions (a model's own sliding
        window in every row of a generation) fill the same slots, so they step as one."""
        windows = [s for s in states if isinstance(s, WindowState)]
        first = windows[0]
        same = (first.positions.shape, first.length, first.columns, first.filled)
        if len(windows) != len(states) or any((s.positions.shape, s.length, s.columns, s.filled) != same
                                              or not torch.equal(s.positions, first.positions) for s in windows):
            raise ValueError("windows stack only when they hold the same positions in the same slots")
        return cls(torch.cat([s.keys for s in windows]), torch.cat([s.values for s in windows]),
                   first.positions.clone(), first.length, first.columns, first.filled)  # fmt: skip

    def select_rows(self, rows: list[int]) -> "WindowState":
        index = torch.tensor(rows, device=self.keys.device)
        return WindowState(self.keys.index_select(0, index), self.values.index_select(0, index),
                           self.positions.clone(), self.length, self.columns, self.filled)  # fmt: skip

    def ordered(self) -> tuple[Tensor, Tensor]:
        """Every kept position's key and value in position order: (b, h, kept, d), (b, h, kept, e)."""
        slots = torch.argsort(self.positions)[self.positions.shape[0] - self.filled :]
        return self.keys[..., slots, :], self.values[..., slots, :]


@dataclass
class FeatureState(DecodeState):
    """A feature-map attention as an RNN: the sum of phi(k_j) [v_j 1] over the positions so far (the normalizer in
    the last column), relative to exp(scale) when the features are stabilized. state (b, h, m, e + 1), scale
    (b, h, 1, 1) (0 when unscaled). `step` is the eager form; a variant's fused step (one C call,
    attnbench.kernels.recurrent_steps) updates `state` and `scale` in place as it does."""

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
        self.length += phi_k.shape[-2]
        return normalized(einsum(phi_q, self.state, "b h i m, b h m e -> b h i e")).to(v.dtype)


@dataclass
class RecurrentState(DecodeState):
    """A linear recurrence's state after `length` positions (gated linear attention, the delta rule): state
    (b, h, d, e), in float32 or wider, constant in N. A fused step (one C call) updates `state` in place; the eager
    form replaces it."""

    state: Tensor
    length: int
