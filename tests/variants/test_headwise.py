"""Head-wise budgets that free memory (`attnbench.variants.headwise`): a ragged cache's steps against exact attention
over the whole k/v with the evicted positions masked per head (kvpress's `masked_key_indices`), AdaKV's budgets and
DuoAttention's heads against transcriptions of kvpress's code, and the bytes held measured on the states.

b - batch, h - query heads, g - key/value heads, n - prompt, t - new tokens, d - head dim, e - value dim
"""

from __future__ import annotations

import pytest
import torch
from attnbench.interface import PromptContext, VariantError
from attnbench.ops import KVCache
from attnbench.registry import registry
from attnbench.variants.headwise import (
    RaggedCache,
    adaptive_lengths,
    on_the_fly_scores,
    standard_rotary,
    streaming_count,
)
from torch import Tensor

B, HEADS, KV_HEADS, N, D, E = 2, 6, 2, 301, 16, 24  # awkward sizes: 3 query heads a key/value head, an odd prompt
BUDGET = 50


def inputs(total: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HEADS, total, D, generator=generator)
    k = torch.randn(B, KV_HEADS, total, D, generator=generator)
    v = torch.randn(B, KV_HEADS, total, E, generator=generator)
    return q, k, v


def masked_reference(q: Tensor, k: Tensor, v: Tensor, keep: Tensor, start: int) -> Tensor:
    """Exact attention of the queries q (b, h, t, d) at positions start.. over every key k (b, g, N, d) before them
    and themselves, the prompt's positions not in keep (b, g, n) masked per head: (b, h, t, e)."""
    group, n, t = q.shape[1] // k.shape[1], keep.shape[-1], q.shape[-2]
    position = torch.arange(start + t)
    visible = (position[None, :] <= torch.arange(start, start + t)[:, None]).expand(*keep.shape[:2], t, start + t)
    visible = visible.clone()
    visible[..., :n] &= keep[:, :, None, :]
    keys, values = (x[:, :, : start + t].repeat_interleave(group, dim=1) for x in (k, v))
    scores = q @ keys.transpose(-1, -2) / D**0.5
    scores = scores.masked_fill(~visible.repeat_interleave(group, dim=1), float("-inf"))
    return scores.softmax(dim=-1) @ values


def top_mask(scores: Tensor, lengths: Tensor) -> Tensor:
    """(b, g, n): each head's top lengths positions by score, one head at a time."""
    keep = torch.zeros_like(scores, dtype=torch.bool)
    for row in range(scores.shape[0]):
        for head in range(scores.shape[1]):
            keep[row, head, scores[row, head].topk(int(lengths[row, head])).indices] = True
    return keep


def adaptive_cache(room: int = 2) -> tuple[RaggedCache, Tensor, tuple[Tensor, Tensor, Tensor]]:
    q, k, v = inputs(N + 8)
    scores = torch.randn(B, KV_HEADS, N, generator=torch.Generator().manual_seed(1))
    lengths = adaptive_lengths(scores, BUDGET, 0.2)
    state = RaggedCache.of_scores(k[:, :, :N], v[:, :, :N], scores, lengths, room)
    return state, top_mask(scores, lengths), (q, k, v)


# ---- the ragged cache -------------------------------------------------------------------------------------------


def test_steps_and_a_chunk_equal_exact_attention_with_the_evicted_positions_masked() -> None:
    state, keep, (q, k, v) = adaptive_cache(room=2)  # the third step grows the buffers
    assert not (keep.sum(-1) == BUDGET).all()  # ragged: heads keep different numbers
    for index in range(3):  # t = 1
        at = slice(N + index, N + index + 1)
        out = state.attend(q[:, :, at], k[:, :, at], v[:, :, at])
        assert (out - masked_reference(q[:, :, at], k, v, keep, N + index)).abs().max() < 1e-5
    at = slice(N + 3, N + 8)  # a chunk of t = 5: token i sees the tokens 0..i of the chunk
    out = state.attend(q[:, :, at], k[:, :, at], v[:, :, at])
    assert out.shape == (B, HEADS, 5, E)
    assert (out - masked_reference(q[:, :, at], k, v, keep, N + 3)).abs().max() < 1e-5


def test_the_kept_positions_are_each_heads_top_ones_in_sequence_order() -> None:
    state, keep, _ = adaptive_cache()
    assert state.lengths.tolist() == keep.sum(-1).tolist()
    assert state.positions.tolist() == keep.nonzero()[:, 2].tolist()  # (row, head) by (row, head), in order
    assert state.keys.shape == (int(keep.sum()), D) and state.offsets.shape == (B * KV_HEADS + 1,)


def test_a_chunk_equals_its_tokens_stepped_one_by_one() -> None:
    state, _, (q, k, v) = adaptive_cache(room=0)
    one_by_one = state.clone()
    at = slice(N, N + 5)
    chunk = state.attend(q[:, :, at], k[:, :, at], v[:, :, at])
    steps = torch.cat([one_by_one.attend(*(x[:, :, i : i + 1] for x in (q, k, v))) for i in range(N, N + 5)], dim=-2)
    assert (chunk - steps).abs().max() < 1e-5
    assert one_by_one.length == state.length == 5 and torch.equal(one_by_one.new_k, state.new_k)


def test_held_bytes_are_the_kept_positions_and_below_the_masked_cache() -> None:
    state, keep, (q, k, v) = adaptive_cache()
    kept = int(keep.sum())
    offsets = (B * KV_HEADS + 1) * 8
    assert kept == BUDGET * KV_HEADS * B
    assert state.held_bytes == state.read_bytes == kept * (D + E) * 4 + offsets
    state.attend(q[:, :, N : N + 3], k[:, :, N : N + 3], v[:, :, N : N + 3])
    assert state.held_bytes == (kept + 3 * B * KV_HEADS) * (D + E) * 4 + offsets
    masked = B * KV_HEADS * (N + 3) * (D + E) * 4  # kvpress holds every position and masks the evicted ones
    assert state.held_bytes < masked / 5


def test_a_clone_shares_nothing() -> None:
    state, _, (q, k, v) = adaptive_cache()
    copy = state.clone()
    assert len(state.tensors()) == 6  # the packed four and the appended cache's two: a nested state is counted
    assert {t.data_ptr() for t in copy.tensors()}.isdisjoint(t.data_ptr() for t in state.tensors())
    first = state.attend(q[:, :, N : N + 1], k[:, :, N : N + 1], v[:, :, N : N + 1])
    state.keys.zero_()
    assert copy.length == 0 and copy.keys.abs().sum() > 0
    assert torch.equal(copy.attend(q[:, :, N : N + 1], k[:, :, N : N + 1], v[:, :, N : N + 1]), first)


def test_selected_rows_step_as_they_did_in_the_batch() -> None:
    state, _, (q, k, v) = adaptive_cache()
    alone = state.select_rows([1])
    at = slice(N, N + 1)
    both = state.attend(q[:, :, at], k[:, :, at], v[:, :, at])
    assert torch.equal(alone.lengths, state.lengths[1:])
    assert (alone.attend(q[1:, :, at], k[1:, :, at], v[1:, :, at]) - both[1:]).abs().max() < 1e-6


# ---- AdaKV's budgets ----------------------------------------------------------------------------------------------


def kvpress_adakv_kept(scores: Tensor, n_kept: int, alpha_safeguard: float) -> Tensor:
    """kvpress's AdaKVPress.compress (kvpress/presses/adakv_press.py), transcribed: the positions it leaves unmasked,
    (b, g, n)."""
    scores = scores.clone()
    bsz, num_key_value_heads, k_len = scores.shape
    n_safe = int(n_kept * alpha_safeguard)
    top_indices = torch.topk(scores, n_safe, dim=-1).indices
    scores.scatter_(-1, top_indices, torch.finfo(scores.dtype).max)
    n_pruned = num_key_value_heads * (k_len - n_kept)
    indices = torch.topk(-scores.reshape(bsz, -1), n_pruned, dim=1).indices.flatten()
    batch_indices = torch.arange(bsz).repeat_interleave(n_pruned)
    head_indices = indices // k_len
    seq_indices = indices % k_len
    kept = torch.ones(bsz, num_key_value_heads, k_len, dtype=torch.bool)
    kept[batch_indices, head_indices, seq_indices] = False
    return kept


@pytest.mark.parametrize("safeguard", [0.0, 0.2, 1.0])
@pytest.mark.parametrize("window", [0, 8])  # SnapKV's window: +inf scores, always kept
def test_adaptive_lengths_are_kvpress_adakv(safeguard: float, window: int) -> None:
    generator = torch.Generator().manual_seed(2)
    scores = torch.randn(B, 3, N, generator=generator) * torch.rand(B, 3, 1, generator=generator) * 4  # heads differ
    scores[..., N - window :] = float("inf")
    lengths = adaptive_lengths(scores, BUDGET, safeguard)
    expected = kvpress_adakv_kept(scores, BUDGET, safeguard)
    assert lengths.sum(-1).tolist() == [BUDGET * 3] * B
    assert (lengths >= max(int(BUDGET * safeguard), window)).all()
    assert lengths.tolist() == expected.sum(-1).tolist()
    k, v = torch.randn(B, 3, N, D), torch.randn(B, 3, N, E)
    state = RaggedCache.of_scores(k, v, scores, lengths)
    assert state.positions.tolist() == expected.nonzero()[:, 2].tolist()  # the same positions as kvpress keeps
    if safeguard == 1.0:
        assert (lengths == BUDGET).all()  # every head its uniform budget


def test_snapkv_adaptive_keeps_a_ragged_cache_and_steps_it() -> None:
    q, k, v = inputs(N + 5)
    press = registry.create("snapkv", budget=BUDGET, window=8, heads="adaptive")
    state = press.prefill_state(q[:, :, :N], k[:, :, :N], v[:, :, :N], room=4)
    assert isinstance(state, RaggedCache) and state.kept() is None and not state.evicts
    assert state.lengths.sum(-1).tolist() == [BUDGET * KV_HEADS] * B
    scores = press.kept_scores(q[:, :, :N], k[:, :, :N], v[:, :, :N], BUDGET)
    keep = top_mask(scores, adaptive_lengths(scores, BUDGET, press.safeguard))
    out, state = press.step(state, q[:, :, N : N + 1], k[:, :, N : N + 1], v[:, :, N : N + 1])
    assert (out - masked_reference(q[:, :, N : N + 1], k, v, keep, N)).abs().max() < 1e-5
    out, state = press.steps(state, q[:, :, N + 1 :], k[:, :, N + 1 :], v[:, :, N + 1 :])
    assert (out - masked_reference(q[:, :, N + 1 :], k, v, keep, N + 1)).abs().max() < 1e-5


# ---- DuoAttention -------------------------------------------------------------------------------------------------


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """transformers' apply_rotary_pos_emb for one tensor (rotate-half)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def kvpress_duo_scores(q: Tensor, k: Tensor, rotary, q_len: int = 500) -> Tensor:
    """kvpress's duo_attention_on_the_fly (kvpress/presses/duo_attention_press.py), transcribed for one layer and one
    text, from its pre-rotary projections q (b, h, n, d), k (b, g, n, d) -> (b, g)."""
    num_key_value_groups, d = q.shape[1] // k.shape[1], q.shape[-1]
    q = q.mean(dim=2, keepdim=True).repeat(1, 1, q_len, 1)  # the mean query repeated q_len times
    k = k.mean(dim=2, keepdim=True).repeat(1, 1, q_len, 1)
    cos, sin = rotary(torch.arange(q_len))
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    k = k.repeat_interleave(num_key_value_groups, dim=1)
    attn_weights = torch.matmul(q[:, :, -1:, :], k.transpose(2, 3)) / (d**0.5)
    attn_weights = attn_weights.softmax(dim=-1, dtype=torch.float32).squeeze(2)  # (b, h, q_len)
    s = torch.cumsum(attn_weights, dim=-1).mean(-1)
    return s.view(s.shape[0], -1, num_key_value_groups).mean(-1)


def rotated_inputs(total: int, theta: float = 10000.0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, object]:
    """Pre-rotary q, k (with a per-head bias, so heads differ), their post-rotary forms at 0..total-1, v, the rotary."""
    rotary = standard_rotary(D, theta)
    q, k, v = inputs(total, seed=3)
    q, k = q + torch.randn(1, HEADS, 1, D), k + 2 * torch.randn(1, KV_HEADS, 1, D)
    cos, sin = rotary(torch.arange(total))
    return q, k, rotate(q, cos, sin), rotate(k, cos, sin), v, rotary


def test_duo_head_scores_are_kvpress_on_the_fly_scores() -> None:
    q, k, q_rot, k_rot, _, rotary = rotated_inputs(N, theta=100000.0)  # SmolLM2's base: the model's own rotary
    expected = kvpress_duo_scores(q, k, rotary)
    assert (on_the_fly_scores(q_rot, k_rot, rotary) - expected).abs().max() < 1e-5
    assert expected.std() > 1e-3  # the heads are told apart


def test_duo_streaming_heads_hold_sinks_and_recent_and_retrieval_heads_all() -> None:
    sinks, recent = 4, 16
    q, k, q_rot, k_rot, v, rotary = rotated_inputs(N + 6)
    duo = registry.create("duo-attention", head_compression_ratio=0.5, sinks=sinks, recent=recent)
    duo = duo.for_prompt(PromptContext(0, 1, rotary))
    state = duo.prefill_state(q_rot[:, :, :N], k_rot[:, :, :N], v[:, :, :N], room=6)
    assert isinstance(state, RaggedCache)
    streaming = on_the_fly_scores(q_rot[:, :, :N], k_rot[:, :, :N], rotary).argmin(dim=-1)  # 1 of 2 heads per row
    keep = torch.ones(B, KV_HEADS, N, dtype=torch.bool)  # kvpress: masked_keys[:, streaming, sinks:-recent] = True
    keep[torch.arange(B), streaming, sinks:-recent] = False
    expected = [[sinks + recent if head == streaming[row] else N for head in range(KV_HEADS)] for row in range(B)]
    assert state.lengths.tolist() == expected
    assert state.positions.tolist() == keep.nonzero()[:, 2].tolist()
    assert state.held_bytes == (B * (N + sinks + recent)) * (D + E) * 4 + (B * KV_HEADS + 1) * 8  # measured
    out, state = duo.step(state, q_rot[:, :, N : N + 1], k_rot[:, :, N : N + 1], v[:, :, N : N + 1])
    assert (out - masked_reference(q_rot[:, :, N : N + 1], k_rot, v, keep, N)).abs().max() < 1e-5
    out, state = duo.steps(state, q_rot[:, :, N + 1 :], k_rot[:, :, N + 1 :], v[:, :, N + 1 :])
    assert (out - masked_reference(q_rot[:, :, N + 1 :], k_rot, v, keep, N + 1)).abs().max() < 1e-5


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.6, 1.0])
def test_duo_streams_kvpress_count_of_heads_over_the_layers(ratio: float) -> None:
    layers, heads = 30, 3  # SmolLM2: 30 layers of 3 key/value heads
    counts = [streaming_count(ratio, heads, layer) for layer in range(layers)]
    assert sum(counts) == round(layers * heads * ratio) and set(counts) <= {0, 1, 2, 3}
    _, _, q_rot, k_rot, v, rotary = rotated_inputs(N)
    duo = registry.create("duo-attention", head_compression_ratio=ratio, sinks=4, recent=16)
    for layer in range(4):
        state = duo.for_prompt(PromptContext(layer, 4, rotary)).prefill_state(q_rot, k_rot, v)
        lengths = state.lengths if isinstance(state, RaggedCache) else torch.full((B, KV_HEADS), N)
        assert ((lengths == 20).sum(-1) == streaming_count(ratio, KV_HEADS, layer)).all()


def test_duo_keeps_a_plain_cache_when_no_head_streams() -> None:
    _, _, q_rot, k_rot, v, _ = rotated_inputs(N)
    no_streaming = registry.create("duo-attention", head_compression_ratio=0.0)
    assert isinstance(no_streaming.prefill_state(q_rot, k_rot, v), KVCache)
    assert isinstance(registry.create("duo-attention").prefill_state(q_rot, k_rot, v), KVCache)  # N <= 128 + 256
    state = registry.create("duo-attention", sinks=4, recent=16).prefill_state(q_rot, k_rot, v)  # no model: fallback
    assert isinstance(state, RaggedCache) and (state.lengths == 20).sum() == B


def test_duo_refuses_the_downloaded_patterns_by_name() -> None:
    with pytest.raises(VariantError, match="never downloads weights at run time"):
        registry.create("duo-attention", on_the_fly_scoring=False)
    with pytest.raises(VariantError, match="at most 1"):
        registry.create("duo-attention", head_compression_ratio=1.5)


# ---- inside the model ---------------------------------------------------------------------------------------------


@pytest.mark.model
def test_head_wise_methods_generate_inside_the_model(model_dir) -> None:
    """AdaKV's budgets (a press with heads="adaptive") and DuoAttention through SmolLM2 (30 layers of 3 key/value
    heads, d = 64): a few greedy tokens each, and what their ragged caches hold, counted from the kept positions."""
    from attnbench.generation.layers import Method
    from attnbench.generation.unit import loaded

    _, tokenizer, decoder = loaded(str(model_dir))
    text = "The passkey is 71432. Remember it. " + "The grass is green. The sky is blue. " * 20 + "The passkey is"
    prompt = torch.tensor(tokenizer.encode(text, add_special_tokens=False))
    methods = [Method(registry.create("full")), Method(registry.create("snapkv", budget=64, heads="adaptive")),
               Method(registry.create("duo-attention", head_compression_ratio=0.5, sinks=16, recent=48))]  # fmt: skip
    full, adaptive, duo = decoder.run(methods, prompt, new_tokens=4, stop_lines=False)
    assert len(full.tokens) == len(adaptive.tokens) == len(duo.tokens) == 4
    assert duo.tokens[:1] == full.tokens[:1]  # the retrieval heads keep the passkey in reach
    layers, heads, n = 30, 3, len(prompt)
    position = full.cache_bytes // (layers * heads * n)  # a key and a value
    offsets = layers * (heads + 1) * 8
    assert adaptive.cache_bytes == layers * heads * 64 * position + offsets  # 64 a head on average
    streaming = round(layers * heads * 0.5)  # DuoAttention: 45 heads of 16 + 48 positions, 45 of the whole prompt
    assert duo.cache_bytes == (streaming * 64 + (layers * heads - streaming) * n) * position + offsets
