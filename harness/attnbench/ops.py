"""The public helpers for variant authors — what a built-in variant or a plugin may use besides the interface:
which keys a query may see (dense patterns for references, small row masks for variants), the key padding rule,
the dense masked reference and the exactness check against it with its tolerance, SDPA's default scale, the cost
helpers of softmax attention, and device synchronization. Built-in variants import only `attnbench.interface`,
this module and each other.

b - batch, h - heads, i - query position, j - key position
"""

from __future__ import annotations

import torch
from einops import einsum, rearrange
from torch import Tensor

import weakref
from dataclasses import dataclass
from typing import Any

from attnbench.interface import (
    AttentionVariant,
    DecodeState,
    default_scale,
    expand_kv_heads,
    query_group,
    dense_attention_cost,
    saved_scores_bytes,
    softmax_attention_flops,
)
from attnbench.kernels import usable
from attnbench.kernels.steps import softmax_step as fused_softmax_step

__all__ = [
    "KVCache",
    "TOLERANCE",
    "allowed_keys",
    "attention_mass",
    "attention_and_masses",
    "attention_with_lse",
    "masses_from_lse",
    "group_mean",
    "prompt_mass",
    "remember_mass",
    "band_allows",
    "causal_allows",
    "default_scale",
    "dense_attention_cost",
    "dense_masked_attention",
    "softmax_step",
    "DECODE_CHECK",
    "decode_exactness_error",
    "generate",
    "exactness_error",
    "max_abs_difference",
    "padding_mask",
    "rows_with_visible_key",
    "saved_scores_bytes",
    "softmax_attention_flops",
    "synchronize",
]


def causal_allows(i: Tensor, j: Tensor) -> Tensor:
    """The causal rule at query positions i and key positions j (broadcast): a query sees keys j <= i. The one
    predicate behind `allowed_keys` and every variant's causal pattern."""
    return j <= i


def band_allows(i: Tensor, j: Tensor, window: int) -> Tensor:
    """The band rule at query positions i and key positions j (broadcast): |i - j| <= window. Band attention's
    support, strided's local run, and the input statistic of attention mass near the diagonal all read it."""
    offset = i - j
    return (offset <= window) & (offset >= -window)


def allowed_keys(
    n_q: int,
    n_k: int,
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    device: torch.device | str = "cpu",
    query_offset: int = 0,
) -> Tensor:
    """Dense (b or 1, 1, i, j) bool, True where query `query_offset + i` may see key j.

    Quadratic in size: for references and checks, never for a sub-quadratic variant's forward pass.
    """
    rows = torch.arange(query_offset, query_offset + n_q, device=device)[:, None]  # (i, 1)
    cols = torch.arange(n_k, device=device)[None, :]  # (1, j)
    allowed = causal_allows(rows, cols) if causal else torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    allowed = allowed[None, None]  # (1, 1, i, j)
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]  # (b, 1, i, j)
    return allowed


def rows_with_visible_key(
    batch: int, n_q: int, *, causal: bool, key_padding_mask: Tensor | None, device: torch.device | str = "cpu"
) -> Tensor | None:
    """(b, 1, i, 1) bool, True where query i sees at least one key; None when every query does.

    O(b * (i + j)): used by variants to zero rows that see nothing (the interface's convention).
    """
    if key_padding_mask is None:
        return None  # with no padding, every query sees key 0 (causal) or all keys
    real = ~key_padding_mask  # (b, j)
    any_real = real.any(dim=-1)  # (b,)
    if not causal:
        visible = any_real[:, None].expand(batch, n_q)
    else:
        first_real = torch.where(any_real, real.int().argmax(dim=-1), torch.full_like(any_real, n_q, dtype=torch.long))
        visible = torch.arange(n_q, device=device)[None, :] >= first_real[:, None]  # (b, i)
    if bool(visible.all()):
        return None
    return visible[:, None, :, None]


def dense_masked_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None) -> Tensor:
    """softmax(QK^T / sqrt(d)) V, restricted to `allowed` (broadcastable to (b, h, i, j)) when given.

    The textbook computation, N x N in memory. A query with no allowed key outputs zeros.
    """
    scores = einsum(q, k, "b h i d, b h j d -> b h i j") * default_scale(q.shape[-1])
    if allowed is None:
        return einsum(torch.softmax(scores, dim=-1), v, "b h i j, b h j e -> b h i e")
    any_allowed = allowed.any(dim=-1, keepdim=True)  # (b, h, i, 1)
    # rows with no allowed key get all-zero scores (no NaN), then zero weights
    scores = scores.masked_fill(~allowed & any_allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).masked_fill(~allowed, 0.0)
    return einsum(weights, v, "b h i j, b h j e -> b h i e")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a clock read after a call counts it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# max abs difference an exact variant may show against the float64 dense reference: the one tolerance of the
# run's self-check and of `attnbench check`
TOLERANCE = {torch.float64: 1e-9, torch.float32: 2e-5, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def max_abs_difference(a: Tensor, b: Tensor) -> float:
    """The largest |a - b| over all elements, in float64."""
    return (a.to(torch.float64) - b.to(torch.float64)).abs().max().item()


def real_lengths(batch: int, n: int, fraction: float) -> list[int]:
    """The real (unpadded) keys of each batch element under `padding_mask`'s rule: element b pads
    round(fraction * n * (b + 1) / batch) keys at the end, at least one stays real; the last is the shortest."""
    return [n - min(n - 1, round(fraction * n * (index + 1) / batch)) for index in range(batch)]


def padding_mask(batch: int, n: int, fraction: float, device: torch.device | str = "cpu") -> Tensor | None:
    """(b, j) bool, True = padding. Right padding as in a real batch (`real_lengths`): each element pads a different
    amount, and at least one key per element stays real. None when `fraction` is 0. The one padding rule of inputs
    and checks."""
    if fraction <= 0:
        return None
    lengths = torch.tensor(real_lengths(batch, n, fraction), device=device)
    return torch.arange(n, device=device)[None, :] >= lengths[:, None]


def exactness_error(
    variant: AttentionVariant,
    *,
    n: int,
    causal: bool,
    padded: bool,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
) -> float:
    """Max abs difference between an exact variant and the dense masked reference of its own pattern."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, n, 16, generator=generator).to(device, dtype) for _ in range(3))
    mask = padding_mask(2, n, 0.5, device) if padded else None  # a quarter and a half of the keys
    support = variant.support_for(q, k, causal=causal, key_padding_mask=mask)  # (b|1, h|1, i, j)
    if support is None:
        raise ValueError(f"{variant.name} is declared exact but gives no support (support_mask returned None)")
    allowed = support.to(device)
    if mask is not None:
        allowed = allowed & ~mask[:, None, None, :]
    expected = dense_masked_attention(q.double(), k.double(), v.double(), allowed)
    return max_abs_difference(variant(q, k, v, causal=causal, key_padding_mask=mask), expected)


@dataclass
class KVCache(DecodeState):
    """Keys and values of every position so far, in buffers with room for later tokens (a step writes in place; a
    full buffer doubles). The state of exact decoding, and the storage of methods that keep a subset (SnapKV).

    keys, values: (b, h, capacity, d|e), filled up to `length`.
    """

    keys: Tensor
    values: Tensor
    length: int

    @classmethod
    def of(cls, k: Tensor, v: Tensor, room: int = 0) -> "KVCache":
        """A cache holding k (b, h, n, d) and v (b, h, n, e), with room for `room` more positions."""
        n = k.shape[-2]
        keys = k.new_empty(*k.shape[:-2], n + room, k.shape[-1])
        values = v.new_empty(*v.shape[:-2], n + room, v.shape[-1])
        keys[..., :n, :], values[..., :n, :] = k, v
        return cls(keys, values, n)

    @property
    def k(self) -> Tensor:
        """(b, h, length, d): the filled part."""
        return self.keys[..., : self.length, :]

    @property
    def v(self) -> Tensor:
        return self.values[..., : self.length, :]

    def append(self, k: Tensor, v: Tensor) -> "KVCache":
        """Add positions k (b, h, t, d), v (b, h, t, e) in place; the buffers double when they are full."""
        t = k.shape[-2]
        if self.length + t > self.keys.shape[-2]:
            grown = max(2 * self.keys.shape[-2], self.length + t)
            self.keys = torch.cat([self.k, self.keys.new_empty(*k.shape[:-2], grown - self.length, k.shape[-1])], -2)
            self.values = torch.cat([self.v, self.values.new_empty(*v.shape[:-2], grown - self.length, v.shape[-1])], -2)
        self.keys[..., self.length : self.length + t, :] = k
        self.values[..., self.length : self.length + t, :] = v
        self.length += t
        return self

    def step(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Exact decoding's step: the new token k (b, h, 1, d), v (b, h, 1, e) appended, then q (b, h', 1, d) attends to
        every position (`softmax_step`: the write and the read in one call where fused) -> (b, h', 1, e)."""
        if self.length == self.keys.shape[-2]:
            self.append(k, v)
            return softmax_step(q, self.k, self.v)
        self.length += 1
        return softmax_step(q, self.k, self.v, new=(k, v, self.length - 1))

    @property
    def read_bytes(self) -> int:
        """A step reads the filled part of both buffers."""
        return (self.k.numel() * self.k.element_size()) + (self.v.numel() * self.v.element_size())

    @property
    def held_bytes(self) -> int:
        """The filled part of both buffers (their room for later tokens left out)."""
        return KVCache.read_bytes.fget(self)  # type: ignore[attr-defined]

    def kept(self) -> tuple[Tensor, Tensor] | None:
        return self.k, self.v

    def select_rows(self, rows: list[int]) -> "KVCache":
        if type(self) is not KVCache:  # a subclass's own tensors would be left whole
            return super().select_rows(rows)  # type: ignore[return-value]
        index = torch.tensor(rows, device=self.keys.device)
        return KVCache(self.keys.index_select(0, index), self.values.index_select(0, index), self.length)


SCORE_CHUNK = 256  # prompt queries whose weights `attention_mass` holds at once: (b, h, 256, n), never n x n


def group_mean(x: Tensor, group: int) -> Tensor:
    """Per-query-head scores (b, h, ...) averaged over each key/value head's `group` query heads: (b, h / group, ...)."""
    return x if group == 1 else x.unflatten(1, (x.shape[1] // group, group)).mean(dim=2)


def attention_mass(
    q: Tensor, k: Tensor, v: Tensor, chunk: int = SCORE_CHUNK, outputs: bool = True
) -> tuple[Tensor | None, Tensor]:
    """Causal softmax attention, and the mass each key received, the sum over queries i >= j of weight(i, j) (H2O's
    and ObservedAttention's score of a prompt). q (b, h, n, d), k (b, g, n, d), v (b, g, n, e) -> out (b, h, n, e),
    mass (b, g, n) in float32 at least (averaged over each key/value head's query heads). Taken `chunk` queries at a
    time: (b, h, chunk, n) weights held, never n x n. `outputs=False`: the masses alone (out None)."""
    group = query_group(q, k)
    k, v = expand_kv_heads(k, group), expand_kv_heads(v, group)
    b, h, n, _ = q.shape
    work = torch.promote_types(q.dtype, torch.float32)
    out = v.new_empty(b, h, n, v.shape[-1]) if outputs else None
    mass = torch.zeros(b, h, n, dtype=work, device=q.device)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        scores = einsum(q[:, :, start:stop].to(work), k[:, :, :stop].to(work), "b h i d, b h j d -> b h i j")
        i, j = torch.arange(start, stop, device=q.device)[:, None], torch.arange(stop, device=q.device)[None, :]
        weights = (scores * default_scale(q.shape[-1])).masked_fill_(~causal_allows(i, j), float("-inf")).softmax(-1)
        mass[..., :stop] += weights.sum(dim=-2)
        if out is not None:
            out[:, :, start:stop] = einsum(weights, v[:, :, :stop].to(work), "b h i j, b h j e -> b h i e").to(v.dtype)
    return out, group_mean(mass, group)


def attention_and_masses(q: Tensor, k: Tensor, v: Tensor, chunk: int = SCORE_CHUNK) -> tuple[Tensor, Tensor]:
    """Causal softmax attention by the fused kernel (SDPA's own outputs), and `attention_mass`'s masses (b, g, n)
    from the kernel's log-sum-exp (`attention_with_lse`, then `masses_from_lse`); where the kernel does not serve,
    `attention_mass` (its own pass)."""
    fused = attention_with_lse(q, k, v)
    if fused is None:
        out, mass = attention_mass(q, k, v, chunk)
        assert out is not None
        return out, mass
    return fused[0], masses_from_lse(q, k, fused[1], chunk)


def attention_with_lse(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor] | None:
    """Causal softmax attention by the fused kernel: out (b, h, n, e) and each query's log-sum-exp (b, h, n); None
    off the CPU or with values not as wide as keys (the kernel's condition)."""
    if q.device.type != "cpu" or v.shape[-1] != q.shape[-1]:
        return None
    group = query_group(q, k)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out, lse = flash(q, expand_kv_heads(k, group), expand_kv_heads(v, group), 0.0, True)[:2]
    return out, lse


def masses_from_lse(q: Tensor, k: Tensor, lse: Tensor, chunk: int = SCORE_CHUNK) -> Tensor:
    """`attention_mass`'s masses (b, g, n) from the queries' log-sum-exp (b, h, n): each chunk of queries' scores
    minus their log-sum-exp, exponentiated, summed over the queries (a key's weight from each later query, without the
    softmax's own max and sum passes)."""
    group = query_group(q, k)
    work = torch.promote_types(q.dtype, torch.float32)
    grouped = rearrange(q.to(work) * default_scale(q.shape[-1]), "b (g r) n d -> b g r n d", g=k.shape[1])
    lse = rearrange(lse.to(work), "b (g r) n -> b g r n", g=k.shape[1])
    n = q.shape[-2]
    mass = torch.zeros(k.shape[0], k.shape[1], n, dtype=work, device=q.device)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        weights = torch.matmul(grouped[:, :, :, start:stop], k[:, :, None, :stop].to(work).transpose(-1, -2))
        weights.sub_(lse[:, :, :, start:stop, None]).exp_()  # (b, g, r, chunk, stop): softmax weights
        later = torch.ones(stop - start, stop - start, dtype=torch.bool, device=q.device).triu_(1)
        weights[..., start:stop].masked_fill_(later, 0.0)  # keys after the query
        mass[..., :stop] += weights.sum(dim=(2, 3))
    return mass / group


_LAST_MASS: list[tuple[Any, Any, tuple[int, int], Tensor]] = []  # weak q, weak k, their versions, their masses


def remember_mass(q: Tensor, k: Tensor, mass: Tensor) -> None:
    """Keep `mass` (b, g, n) as the prompt masses of (q, k) while both tensors live and are not written: a caller
    that computed them with the prompt's attention (the in-model exact prefill) spares `prompt_mass` a second pass."""
    _LAST_MASS[:] = [(weakref.ref(q), weakref.ref(k), (q._version, k._version), mass)]


def prompt_mass(q: Tensor, k: Tensor) -> Tensor:
    """`attention_mass`'s masses alone, (b, g, n), kept for the last (q, k) asked or remembered (while both tensors
    live): H2O at several budgets over one prompt (a generation grid's shares) scores it once."""
    if _LAST_MASS:
        q_ref, k_ref, seen, mass = _LAST_MASS[0]
        if q_ref() is q and k_ref() is k and seen == (q._version, k._version):
            return mass
    mass = attention_mass(q, k, k[..., :1], outputs=False)[1]  # v unused without outputs
    remember_mass(q, k, mass)
    return mass


def softmax_step(
    q: Tensor, k: Tensor, v: Tensor, visible: Tensor | None = None, new: tuple[Tensor, Tensor, int] | None = None
) -> Tensor:
    """One query per head against every key given: q (b, h, 1, d), k (b, g, n, d), v (b, g, n, e) -> (b, h, 1, e),
    softmax attention at SDPA's scale, h / g query heads sharing each key/value head (g = h without grouped-query
    attention); `visible` (b|1, g|1, n) bool leaves keys out (None: every key is visible to the new token); `new` =
    (k (b, g, 1, d), v (b, g, 1, e), slot): the new token's key and value written into position `slot` of k and v
    first. Fused (float32 on the CPU, `attnbench.kernels`): one C call, reading each key/value head's positions once
    for its query heads, split across threads. Eager: two matrix products and a softmax over n, the group's queries
    together (on the CPU ~1.3x the rate of SDPA's one-query path, measured at n = 8192 and 16384)."""
    if usable(q, k, v, *(new[:2] if new else ())):
        return fused_softmax_step(q, k, v, visible, default_scale(q.shape[-1]), new)
    if new is not None:
        new_k, new_v, slot = new
        k[..., slot : slot + 1, :], v[..., slot : slot + 1, :] = new_k, new_v
    grouped = rearrange(q, "b (g r) 1 d -> b g r d", g=k.shape[1])
    scores = torch.matmul(grouped, k.transpose(-1, -2)).mul_(default_scale(q.shape[-1]))  # (b, g, r, n)
    if visible is not None:
        scores.masked_fill_(~visible[..., None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v)  # (b, g, r, e)
    return rearrange(out, "b g r e -> b (g r) 1 e")


DECODE_CHECK = (37, 6)  # prompt and steps of decode checks: not a multiple of any block, chunk or page


def generate(variant: AttentionVariant, q: Tensor, k: Tensor, v: Tensor, prompt: int) -> tuple[Tensor, Tensor, DecodeState]:
    """Prefill the first `prompt` positions of q, k, v (b, h, n, d|e), then step through the rest one at a time:
    (the prompt's outputs (b, h, prompt, e), the steps' outputs (b, h, n - prompt, e), the final state)."""
    n = q.shape[-2]
    with torch.no_grad():
        out, state = variant.prefill(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], room=n - prompt)
        steps = []
        for t in range(prompt, n):
            step, state = variant.step(state, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
            steps.append(step)
    return out, torch.cat(steps, dim=-2), state


def decode_exactness_error(
    variant: AttentionVariant,
    *,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
) -> float | None:
    """Max abs difference between an exact variant's decoding (prefill, then steps: `DECODE_CHECK`) and the dense
    masked reference of its own causal pattern; None when it has no static pattern to check against (a support
    chosen from q and k) or does not promise that its steps equal its forward (`decode_equals_forward`)."""
    prompt, steps = DECODE_CHECK
    n = prompt + steps
    pattern = variant.support_mask(n, n, True) if variant.decode_equals_forward else None
    if pattern is None:
        return None
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, n, 16, generator=generator).to(device, dtype) for _ in range(3))
    pattern = pattern.to(device)
    if pattern.dim() == 3:  # one pattern per head, cycling
        pattern = pattern[torch.arange(2) % pattern.shape[0]]
    expected = dense_masked_attention(q.double(), k.double(), v.double(), pattern)
    out, stepped, _ = generate(variant, q, k, v, prompt)
    return max_abs_difference(torch.cat([out, stepped], dim=-2), expected)
