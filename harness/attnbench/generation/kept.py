"""kvpress's budget rule inside the model: a method compresses the context once, when it ends, and from then on keeps
what it kept and appends every later token (the question, then the answer), as kvpress's presses do.

After that moment a KV-cache method's state is only the positions it kept: the rows of one layer that kept the same
number of positions (the methods at one share: StreamingLLM, H2O, SnapKV; the exact model apart) become one batched
KV cache, stepped together by one attention call per layer instead of one per row. A state that cannot be reduced to
kept positions (Quest's pages, an RNN state) steps on its own.

Two rules (`BUDGET_RULES`):
- "kvpress" (the default): compressed once; the question and the answer are appended for every method, so
  StreamingLLM's window and H2O's heavy hitters grow by them (H2O becomes kvpress's ObservedAttention: its prompt's
  masses decide once);
- "fixed-total": every method stays at its share throughout: a sliding window and H2O evict as they step (their own
  rules), SnapKV compresses to its share less the tokens that will follow, Quest reads its share at every step.

A method may also quantize what it kept (`QUANTIZE`: KIVI's cache, `attnbench.variants.quantized`, taken from the
registry): at that moment its kept positions become a quantized cache instead, the rows of one quantization and one
kept shape stacked into one, stepped by the cache's own `attend`.

b - rows, g - key/value heads, r - query heads per key/value head, t - new tokens, n - kept positions, d - head dim,
e - value dim
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor

from attnbench.interface import AttentionVariant, DecodeState, expand_kv_heads
from attnbench.ops import KVCache, default_scale
from attnbench.registry import registry

BUDGET_RULES = ("kvpress", "fixed-total")
# a method's kept positions quantized after the prompt: none, or KIVI's cache at 4 or 2 bits (its group of 32 and
# residual of 128, the authors' LongBench setting)
QUANTIZE: dict[str, dict[str, int] | None] = {"none": None, "kivi-4": {"bits": 4}, "kivi-2": {"bits": 2}}


def appends_after_prompt(state: DecodeState, rule: str) -> bool:
    """The state is reduced to its kept positions and appends from now on: every state that can say what it kept
    under kvpress's rule; under fixed-total, only those whose own steps never evict (SnapKV, exact decoding)."""
    return state.kept() is not None and (rule == "kvpress" or not state.evicts)


def quantizer(quantize: str) -> AttentionVariant:
    """The variant whose `quantized(k, v, room)` makes a quantized cache of kept positions (`QUANTIZE`)."""
    return registry.create("kivi", **(QUANTIZE[quantize] or {}))


def batched(states: list[DecodeState], room: int, quantize: str = "none") -> DecodeState:
    """One cache of several rows' kept positions (each (1, g, n, d|e), the same n), with room for `room` more: a
    KVCache, or the quantized cache `quantize` names."""
    parts = [state.kept() for state in states]
    keys = torch.cat([k for k, _ in parts])  # type: ignore[misc]
    values = torch.cat([v for _, v in parts])  # type: ignore[misc]
    if quantize == "none":
        return KVCache.of(keys, values, room)
    return quantizer(quantize).quantized(keys, values, room)  # type: ignore[attr-defined]


def attend_batched(cache: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """A batched cache's rows through t new tokens (`attend_appended`'s shapes): a KVCache by `attend_appended`, a
    quantized one by its own `attend` (the same rule over its dequantized positions)."""
    if isinstance(cache, KVCache):
        return attend_appended(cache, q, k, v)
    return cache.attend(q, k, v)  # type: ignore[attr-defined]


def attend_appended(cache: KVCache, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """t new tokens of every row join the cache and attend to every kept position and to the new tokens up to
    themselves: q (b, h, t, d), k (b, g, t, d), v (b, g, t, e) -> (b, h, t, e). Two matrix products and a softmax,
    each key/value head's query heads together, so its cache is read once for all of them. A cache kept per query
    head (a method that does not keep key/value heads) takes the new keys and values repeated for each."""
    repeat = cache.keys.shape[1] // k.shape[1]
    cache.append(expand_kv_heads(k, repeat), expand_kv_heads(v, repeat))
    keys, values, t = cache.k, cache.v, q.shape[-2]
    g = keys.shape[1]
    grouped = rearrange(q, "b (g r) t d -> b g (r t) d", g=g)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).mul_(default_scale(q.shape[-1]))  # (b, g, r t, n)
    if t > 1:  # new token i sees the kept positions and new tokens 0..i
        n = keys.shape[-2]
        later = torch.arange(n - t, n, device=q.device)[None, :] > torch.arange(n - t, n, device=q.device)[:, None]
        hidden = torch.zeros(t, n, dtype=torch.bool, device=q.device)
        hidden[:, n - t :] = later
        scores = rearrange(scores, "b g (r t) n -> b g r t n", t=t).masked_fill_(hidden, float("-inf"))
        scores = rearrange(scores, "b g r t n -> b g (r t) n")
    out = torch.matmul(torch.softmax(scores, dim=-1), values)  # (b, g, r t, e)
    return rearrange(out, "b g (r t) e -> b (g r) t e", t=t)


def row_held_bytes(cache: DecodeState) -> int:
    """What one row of a batched cache holds (its rows hold alike, every tensor's first axis the rows): its filled
    keys and values, or its codes, scales, zero points and residual."""
    return cache.held_bytes // cache.tensors()[0].shape[0]
