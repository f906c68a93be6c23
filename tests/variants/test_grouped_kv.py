"""Grouped-query attention through the decode protocol: a variant declaring `grouped_kv` takes k, v with g heads for
q's h, keeps one state per key/value head and selects per key/value head (the group's mean score, kvpress's rule);
`select_per="query-head"` keeps the old per-query-head selection with its true, h / g times larger, cache. Quest
(`topk`) only reads what it selects: each query head ranks its own pages of the per-key/value-head cache (its
default, Quest's rule), and `select_per="kv-head"` ranks them once by the group's mean."""

from __future__ import annotations

import pytest
import torch
from attnbench.interface import expand_kv_heads
from attnbench.registry import registry

from attnbench.ops import generate

HEADS, KV_HEADS = 6, 2
GROUP = HEADS // KV_HEADS
PROMPT, STEPS = 150, 9


def grouped_decoders() -> list[str]:
    return [name for name in registry.names() if registry.load(name).decodes() and registry.load(name).supports.grouped_kv]


def inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, HEADS, PROMPT + STEPS, 16, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(2, KV_HEADS, PROMPT + STEPS, 16, generator=generator, dtype=torch.float64) for _ in range(2))
    return q, k, v


SMALL = {"h2o": {"budget": 40}, "snapkv": {"budget": 40, "window": 8}, "topk": {"block_size": 8, "top_k": 3},
         "band": {"window": 20, "sinks": 2}, "full": {}}


def per_head_bytes(state, heads: int) -> int:
    """Bytes of the state's tensors with a head axis of `heads` (keys, values, masses, page bounds)."""
    return sum(t.numel() * t.element_size() for t in state.tensors() if t.dim() >= 3 and t.shape[1] == heads)


def test_the_built_in_kv_cache_methods_decode_grouped() -> None:
    assert {"full", "band", "h2o", "snapkv", "topk"} <= set(grouped_decoders())


@pytest.mark.parametrize("name", grouped_decoders())
def test_grouped_state_is_per_key_value_head(name: str) -> None:
    """Grouped: the state holds g heads (h / g times less than per query head); outputs have q's h heads."""
    variant = registry.create(name, **SMALL.get(name, {}))
    q, k, v = inputs()
    out, steps, state = generate(variant, q, k, v, PROMPT)
    assert out.shape == (2, HEADS, PROMPT, 16) and steps.shape == (2, HEADS, STEPS, 16)
    assert torch.isfinite(steps).all()
    assert {t.shape[1] for t in state.tensors() if t.dim() >= 3} == {KV_HEADS}
    _, _, repeated = generate(variant, q, expand_kv_heads(k, GROUP), expand_kv_heads(v, GROUP), PROMPT)
    assert per_head_bytes(repeated, HEADS) == GROUP * per_head_bytes(state, KV_HEADS)
    assert state.nbytes < repeated.nbytes and state.read_bytes < repeated.read_bytes
    if name == "topk":  # who ranks Quest's pages: the cache stays per key/value head either way
        _, _, mean_ranked = generate(registry.create(name, **SMALL[name], select_per="kv-head"), q, k, v, PROMPT)
        assert mean_ranked.nbytes == state.nbytes
    elif "select_per" in variant.hparams:  # the labelled per-query-head setting is handed g heads and keeps h
        per_query_variant = registry.create(name, **SMALL.get(name, {}), select_per="query-head")
        _, _, per_query = generate(per_query_variant, q, k, v, PROMPT)
        assert per_query.nbytes == repeated.nbytes


@pytest.mark.parametrize("name", ["full", "band"])
def test_grouped_exact_patterns_equal_repeated_heads(name: str) -> None:
    """A pattern that selects nothing: grouped decoding equals the same call with k, v repeated per query head."""
    variant = registry.create(name, **SMALL[name])
    q, k, v = inputs(1)
    grouped = generate(variant, q, k, v, PROMPT)
    repeated = generate(variant, q, expand_kv_heads(k, GROUP), expand_kv_heads(v, GROUP), PROMPT)
    for a, b in zip(grouped[:2], repeated[:2]):
        assert (a - b).abs().max() < 1e-12


@pytest.mark.parametrize("name", ["h2o", "snapkv", "topk"])
def test_grouped_selection_is_one_per_key_value_head(name: str) -> None:
    """The group's query heads share what is kept: equal to per-query-head selection when the group's queries are one
    head's copies (the mean of equal scores is the score), and different when they differ."""
    variant = registry.create(name, **SMALL[name], select_per="kv-head")
    q, k, v = inputs(2)
    copies = expand_kv_heads(q[:, :KV_HEADS], GROUP)  # each key/value head's query heads all equal
    _, grouped, _ = generate(variant, copies, k, v, PROMPT)
    _, single, _ = generate(variant, q[:, :KV_HEADS], k, v, PROMPT)  # no grouping: one query head per key/value head
    assert (grouped - expand_kv_heads(single, GROUP)).abs().max() < 1e-10
    per_query = registry.create(name, **SMALL[name], select_per="query-head")
    _, mean_selected, _ = generate(variant, q, k, v, PROMPT)
    _, own_selected, _ = generate(per_query, q, k, v, PROMPT)
    assert (mean_selected - own_selected).abs().max() > 1e-3  # different positions kept per query head


@pytest.mark.parametrize("name", ["h2o", "snapkv"])
def test_grouped_scores_are_the_mean_over_the_group(name: str) -> None:
    """kvpress's rule: a key/value head's score of a position is the mean of its query heads' scores (SnapKV's
    pooled per query head first: with max pooling that differs from pooling the mean)."""
    from attnbench.variants.kv_compression import attention_mass

    q, k, v = inputs(3)
    if name == "h2o":
        grouped, per_query = attention_mass(q, k, v)[1], attention_mass(q, expand_kv_heads(k, GROUP), expand_kv_heads(v, GROUP))[1]
    else:
        snapkv = registry.create("snapkv", **SMALL["snapkv"], pool="max")
        grouped, per_query = snapkv.score(q, k), snapkv.score(q, expand_kv_heads(k, GROUP))
    assert torch.allclose(grouped, per_query.unflatten(1, (KV_HEADS, GROUP)).mean(2))


def kvpress_snapkv_score(query_states, keys, window_size: int, kernel_size: int, pool: str = "avg"):
    """kvpress's SnapKVPress.score with its compute_window_attention (NVIDIA/kvpress,
    kvpress/presses/snapkv_press.py), transcribed: query_states (bsz, num_heads, window_size, d), the window's
    post-rotary queries (kvpress projects them from the hidden states), keys (bsz, num_key_value_heads, k_len, d).
    Softmax in float64 where kvpress's is float32; `pool="max"` swaps its avg_pool1d for max_pool1d (the
    KVCache-Factory pooling, in kvpress's order: per query head, then the group's mean)."""
    import math

    from torch.nn import functional as F

    bsz, num_key_value_heads, k_len, head_dim = keys.shape
    num_key_value_groups = query_states.shape[1] // num_key_value_heads
    key_states = expand_kv_heads(keys, num_key_value_groups)  # repeat_kv
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(head_dim)
    attention_mask = torch.ones_like(attn_weights) * float("-inf")
    attention_mask = torch.triu(attention_mask, diagonal=k_len - window_size + 1)
    attn_weights += attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float64).to(query_states.dtype)
    attn_weights = attn_weights[..., :-window_size]

    scores = attn_weights.mean(dim=-2)
    pool1d = F.avg_pool1d if pool == "avg" else F.max_pool1d
    scores = pool1d(scores, kernel_size=kernel_size, padding=kernel_size // 2, stride=1)
    scores = scores.view(bsz, num_key_value_heads, num_key_value_groups, k_len - window_size)
    scores = scores.mean(2)
    return F.pad(scores, (0, window_size), value=scores.max().item() + 1)


@pytest.mark.parametrize("pool, kernel", [("avg", 5), ("max", 7), ("max", 3)])
def test_snapkv_scores_and_keeps_as_kvpress_does(pool: str, kernel: int) -> None:
    """Per key/value head, SnapKV's prefix scores are kvpress's (the window's weights averaged) and it keeps kvpress's top positions; with max pooling, pooling
    the group's mean instead (SnapKV before 2026-11-28) ranks differently."""
    from attnbench.variants.kv_compression import pooled, window_votes

    window, budget = 8, 40
    q, k, v = inputs(4)
    q, k, v = q[:, :, :PROMPT], k[:, :, :PROMPT], v[:, :, :PROMPT]
    snapkv = registry.create("snapkv", budget=budget, window=window, kernel=kernel, pool=pool)
    ours = snapkv.score(q, k)[..., : PROMPT - window]
    theirs = kvpress_snapkv_score(q[:, :, -window:], k, window, kernel, pool)
    torch.testing.assert_close(ours, theirs[..., : PROMPT - window], rtol=1e-12, atol=1e-15)
    state = snapkv.prefill_state(q, k, v)
    kept = (state.k[:, :, :, None, :] == k[:, :, None, :, :]).all(dim=-1).any(dim=2)  # (b, g, n): which positions
    assert bool((kept.sum(dim=-1) == budget).all())
    lowest_kept = theirs.masked_fill(~kept, float("inf")).amin(dim=-1)
    highest_dropped = theirs.masked_fill(kept, float("-inf")).amax(dim=-1)
    assert bool((lowest_kept >= highest_dropped).all())  # kvpress's compress: its top `budget` (max pooling ties)
    if pool == "max":
        mean_first = pooled(window_votes(q, k, window).unflatten(1, (KV_HEADS, GROUP)).mean(2), kernel, pool)
        assert not torch.allclose(mean_first, ours)
