"""Every knob keeps (or, for Quest, reads) exactly its share: a method's state built as generation builds it
(`prefill_state` from the exact prompt's q/k/v, grouped-query heads as the model has them) at `budgets.at_share`
holds budgets.tokens_kept(share, n) positions per key/value head right after the prompt (Quest: its next step reads
tokens_kept // page pages per query head, its current page among them), or the whole prompt when that is shorter,
or the method's smallest setting when the share is below it (the floors `budgets` documents).

b - batch, h - query heads, g - key/value heads, n - prompt, d - head dim
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pytest
import torch
from attnbench.generation.budgets import at_share, knob_of, knobs, tokens_kept
from attnbench.generation.layers import kv_for
from attnbench.interface import AttentionVariant, DecodeState, PromptContext
from attnbench.registry import registry
from attnbench.variants.decoding import WindowState
from attnbench.variants.headwise import RaggedCache
from attnbench.variants.kv_compression import HeavyHitterCache
from attnbench.variants.think import ChannelCache
from attnbench.variants.quest_cache import QuestCache
from torch import Tensor

HEADS, KV_HEADS = 6, 2  # SmolLM2's grouping in small: 3 query heads a key/value head
LAYERS = 30  # SmolLM2's: DuoAttention's streaming heads are whole, counted over the model's layers
SHARES = (1 / 2, 1 / 4, 1 / 8, 1 / 16)
LENGTHS = (300, 1000, 2048)
SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("band", {"sinks": 4}),  # StreamingLLM
    ("band", {"sinks": 0}),
    ("band", {"sinks": 4, "kv_cache": False}),  # re-computation: its state per query head
    ("band", {"sinks": 2, "global_tokens": 6}),  # the first max(sinks, global_tokens) positions are kept
    ("h2o", {}),
    ("h2o", {"recent": 8}),
    ("h2o", {"select_per": "query-head"}),
    ("snapkv", {}),  # window 32: above 1/16 of 300
    ("snapkv", {"window": 8, "select_per": "query-head"}),
    ("snapkv", {"window": 16, "pool": "avg", "kernel": 5}),
    ("topk", {"score": "minmax", "block_size": 16, "keep_first_block": False, "select_per": "query-head"}),  # Quest
    ("topk", {"score": "minmax", "block_size": 16, "keep_first_block": True, "select_per": "kv-head"}),  # NSA-style
    ("topk", {"score": "minmax", "block_size": 8, "keep_first_block": False, "select_per": "kv-head"}),
    ("topk", {"score": "minmax", "block_size": 8, "keep_first_block": True, "select_per": "query-head"}),
    ("topk", {"score": "minmax", "block_size": 32, "keep_first_block": False, "select_per": "query-head"}),
    ("snapkv", {"heads": "adaptive"}),  # AdaKV: ragged heads, budget on average
    ("knorm", {"heads": "adaptive"}),
    ("duo-attention", {"sinks": 4, "recent": 28}),  # whole heads: the mean over a model's layers
]
SETTINGS += [(name, {}) for name in knobs() if name not in {n for n, _ in SETTINGS}]  # every other press, by default


@lru_cache(maxsize=len(LENGTHS))
def prompt(n: int) -> tuple[Tensor, Tensor, Tensor]:
    """A prompt's q (1, h, n + 1, 16), k, v (1, g, n + 1, 16) (the last position: the first step's token)."""
    generator = torch.Generator().manual_seed(n)
    q = torch.randn(1, HEADS, n + 1, 16, generator=generator)
    k, v = (torch.randn(1, KV_HEADS, n + 1, 16, generator=generator) for _ in range(2))
    return q, k, v


def floor(name: str, p: dict[str, Any]) -> int:
    """The fewest positions a setting holds (Quest: pages it reads), whatever the share: the budgets docstring's."""
    least = knob_of(name).floor(p)
    return least // p["block_size"] if name == "topk" else least  # Quest's in pages


def held(variant: AttentionVariant, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> list[int]:
    """Positions held per head right after the prompt (Quest: the pages its next step reads per query head; ThinK,
    which holds every position: the key channels)."""
    if isinstance(state, WindowState):
        return [int((state.positions >= 0).sum())] * state.keys.shape[1]
    if isinstance(state, HeavyHitterCache):
        return (state.mass > float("-inf")).sum(dim=-1).flatten().tolist()
    if isinstance(state, QuestCache):
        n = q.shape[-2] - 1
        _, state = variant.step(state, q[:, :, n:], k[:, :, n:], v[:, :, n:])
        assert isinstance(state, QuestCache)
        if state.reads_every_page(n):
            return [n // state.page + 1] * q.shape[1]
        chosen, _ = state.select(q[:, :, n:])  # (b, g, r, s): r = 1 when the group shares one choice
        per_chooser = [len(set(pages)) for pages in chosen.flatten(0, 2).tolist()]
        return per_chooser * (q.shape[1] // (chosen.shape[1] * chosen.shape[2]))  # per query head
    if isinstance(state, ChannelCache):
        assert state.length == q.shape[-2] - 1  # every position of the prompt
        return [state.channels.shape[-1]] * state.channels.shape[1]
    if isinstance(state, RaggedCache):  # head-wise budgets: each head its own count
        return state.lengths.flatten().tolist()
    return [state.length] * state.keys.shape[1]  # KVCache (SnapKV)


def layer_context(n: int) -> PromptContext:
    """What the model hands a press about a layer of a prompt of n: here random scores of a pass of its own (KVzip's
    repeat pass, `PromptContext.pass_scores`)."""
    return PromptContext(pass_scores=torch.rand(1, KV_HEADS, n, generator=torch.Generator().manual_seed(n)))


def held_over_layers(variant: AttentionVariant, q: Tensor, k: Tensor, v: Tensor) -> list[int]:
    """Positions held per head in each of a model's LAYERS layers (DuoAttention rounds its heads per layer)."""
    states = [variant.for_prompt(PromptContext(layer, LAYERS)).prefill_state(q, k, v) for layer in range(LAYERS)]
    return [count for state in states for count in held(variant, state, q, k, v)]


@pytest.mark.parametrize("name, setting", SETTINGS, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in s.items())}"
                                                         for n, s in SETTINGS])  # fmt: skip
def test_a_knob_keeps_exactly_its_share(name: str, setting: dict[str, Any]) -> None:
    resolved = registry.create(name, **setting).hparams
    floored = 0
    for n in LENGTHS:
        q, k, v = prompt(n)
        for share in SHARES:
            tokens = tokens_kept(share, n)
            variant = registry.create(name, **at_share(name, resolved, share, n))
            if name == "duo-attention":
                got = held_over_layers(variant, q[:, :, :n], k[:, :, :n], v[:, :, :n])
            else:
                bound = variant.for_prompt(layer_context(n))
                state = bound.prefill_state(q[:, :, :n], *kv_for(variant, q[:, :, :n], k[:, :, :n], v[:, :, :n]))
                got = held(variant, state, q, *kv_for(variant, q, k, v))
            if name == "topk":  # Quest's token budget: whole pages, its current page among them, all while no more
                expected = min(n // variant.block_size + 1, max(tokens // variant.block_size, floor(name, resolved)))
                floored += tokens // variant.block_size < floor(name, resolved)
            elif name == "think":  # its share of the key channels (16 a head), as kvpress prunes int(d * (1 - share))
                expected = 16 - int(16 * (1 - share))
            else:
                expected = min(n, max(tokens, floor(name, resolved)))
                floored += tokens < floor(name, resolved)
            if setting.get("heads") == "adaptive" or name == "duo-attention":  # head-wise: the mean is the share
                whole_heads = (n - floor(name, resolved)) / (2 * len(got)) if name == "duo-attention" else 0
                assert abs(sum(got) / len(got) - expected) <= whole_heads, f"n={n} share={share}: {got} held"
            else:
                assert set(got) == {expected}, f"n={n} share={share}: {got} held, {expected} expected ({tokens} tokens)"
    assert floored <= 1, "the floor is the exception: at 1/16 of the shortest prompt at most"


def test_every_knob_is_covered() -> None:
    assert {name for name, _ in SETTINGS} == set(knobs())


def test_a_share_below_the_smallest_setting_is_clamped_and_said() -> None:
    """kvpress's #264: a ratio that would evict the whole cache; here the method's smallest setting, said."""
    from attnbench.generation.budgets import clamp_note

    snapkv = registry.create("snapkv").hparams
    note = clamp_note("snapkv", snapkv, 1e-4, 2048)
    assert note is not None and "clamped to 33" in note  # its window of 32, plus one
    assert clamp_note("snapkv", snapkv, 0.5, 2048) is None
    assert "clamped to 1" in (clamp_note("h2o", registry.create("h2o").hparams, 1e-4, 2048) or "")
    assert clamp_note("full", {}, 1e-4, 2048) is None  # no knob: nothing to clamp
