"""The presses that read the model around the layer, each against a transcription of kvpress's code on random q/k/v with
grouped-query heads (h = 6, g = 2) and an awkward n: ExpectedAttention (expected_attention_press.py) from queries
rotated back by the rotary embedding (SmolLM2's theta 100000, head dim 64), and its fallback without one; Finch
(finch_press.py) with and without a question; KVzip's repeat pass (kvzip_press.py) on a tiny random Llama against a
dense computation over the whole text, and inside the decoder; on the real model (marked `model`), the queries rotated
back are q_proj's and KVzip runs in a generation.

b - batch, h - query heads, g - key/value heads, n - prompt positions, t - the repeat pass's tokens, d - head dim
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from attnbench.generation import repeat_pass
from attnbench.generation.decoder import InModelDecoder
from attnbench.generation.layers import ExactPrompt, Method
from attnbench.generation.repeat_pass import RepeatPrompt, repeat_scores
from attnbench.interface import PromptContext, UnsupportedOptionError
from attnbench.registry import registry
from attnbench.variants.kv_compression import compress
from attnbench.variants.rotary import prompt_unrotated, rotated, unrotated
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

H, G, N, D, THETA = 6, 2, 301, 64, 100000.0


def rotary(positions: torch.Tensor, dtype: torch.dtype = torch.float64, scaling: float = 1.0):
    """SmolLM2's rotary embedding: positions (n,) -> cos, sin (n, d), rotate-half convention (times `scaling`, as a
    YaRN-style rotary scales them)."""
    inv_freq = 1.0 / THETA ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = positions.double()[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def prompt(seed: int, dtype: torch.dtype = torch.float64):
    """Pre-rotary queries (1, h, n, d), post-rotary q, post-rotary keys (1, g, n, d), values (1, g, n, d)."""
    generator = torch.Generator().manual_seed(seed)
    q_pre = torch.randn(1, H, N, D, generator=generator, dtype=dtype) + 0.5  # a mean away from zero
    k_pre = torch.randn(1, G, N, D, generator=generator, dtype=dtype)
    v = torch.randn(1, G, N, D, generator=generator, dtype=dtype)
    cos, sin = rotary(torch.arange(N), dtype)
    q, k = apply_rotary_pos_emb(q_pre, k_pre, cos[None], sin[None])
    return q_pre, q, k, v


@pytest.mark.parametrize("scaling", [1.0, 1.3])
def test_queries_rotated_back_are_the_queries_before_the_rotation(scaling: float) -> None:
    q_pre, _, k_pre, _ = prompt(0, torch.float32)
    cos, sin = rotary(torch.arange(N), torch.float32, scaling)
    q, _ = apply_rotary_pos_emb(q_pre, k_pre, cos[None], sin[None])
    torch.testing.assert_close(rotated(q_pre, cos, sin), q, rtol=1e-6, atol=1e-6)  # transformers' rotation
    back = prompt_unrotated(q, lambda positions: rotary(positions, torch.float32, scaling))
    torch.testing.assert_close(back, q_pre, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(unrotated(rotated(q, cos, sin), cos, sin), q, rtol=1e-5, atol=1e-5)


# ---- ExpectedAttention --------------------------------------------------------------------------------------------


def kvpress_expected_attention(query_states: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *, rotate: bool,
                               n_future_positions: int = 512, n_sink: int = 4,
                               epsilon: float = 0.0) -> torch.Tensor:  # fmt: skip
    """ExpectedAttentionPress.get_query_statistics, apply_avg_rope and score, transcribed: `query_states` are the
    pre-rotary queries q_proj gives kvpress (the whole prompt's); `rotate` False skips apply_avg_rope (our fallback)."""
    q_len = query_states.shape[2]
    keys, values = keys[:, :, n_sink:], values[:, :, n_sink:]
    query_states = query_states[:, :, n_sink:]
    mu = query_states.mean(dim=2, keepdim=True)
    centered_states = query_states - mu
    cov = torch.einsum("bnsi,bnsj->bnij", centered_states, centered_states) / query_states.shape[2]
    mu = mu.squeeze(2)
    if rotate:
        cos, sin = rotary(torch.arange(q_len, q_len + n_future_positions), query_states.dtype)
        head_dim = cos.shape[-1]
        Id = torch.eye(head_dim, dtype=cos.dtype)
        P = torch.zeros((head_dim, head_dim), dtype=cos.dtype)
        P[head_dim // 2 :, : head_dim // 2], P[: head_dim // 2, head_dim // 2 :] = torch.eye(head_dim // 2), -torch.eye(
            head_dim // 2
        )
        R = (cos.unsqueeze(1) * Id + sin.unsqueeze(1) * P).mean(dim=0)
        mu = torch.matmul(mu, R.T)
        cov = torch.matmul(R, torch.matmul(cov, R.T))
    bsz, num_key_value_heads, k_len, d = keys.shape
    groups = H // num_key_value_heads
    keys = repeat_kv(keys, groups).transpose(2, 3)
    scores = torch.matmul(mu.unsqueeze(2), keys).squeeze(2) / math.sqrt(d)
    scores += torch.einsum("bhin, bhij, bhjn->bhn", keys, cov, keys) / d / 2
    scores = F.softmax(scores, dim=-1).view(bsz, num_key_value_heads, groups, k_len).mean(dim=2)
    scores = (scores + epsilon) * values.norm(dim=-1)
    return F.pad(scores, (n_sink, 0), value=scores.max().item() + 1)


def test_expected_attention_is_kvpress_s_from_the_queries_rotated_back() -> None:
    """kvpress reads the pre-rotary queries through q_proj; ours rotates the prompt's post-rotary queries back."""
    q_pre, q, k, v = prompt(1)
    for params in ({}, {"epsilon": 0.01, "n_future_positions": 100, "n_sink": 7}):
        press = registry.create("expected-attention", budget=50, **params)
        ours = press.for_prompt(PromptContext(rotary=lambda p: rotary(p))).score(q, k, v)
        torch.testing.assert_close(ours, kvpress_expected_attention(q_pre, k, v, rotate=True, **params),
                                   rtol=1e-5, atol=1e-8)  # fmt: skip


def test_expected_attention_without_the_model_takes_the_post_rotary_queries_as_they_are() -> None:
    _, q, k, v = prompt(2)
    ours = registry.create("expected-attention", budget=50).score(q, k, v)
    torch.testing.assert_close(ours, kvpress_expected_attention(q, k, v, rotate=False), rtol=1e-5, atol=1e-8)
    kept = registry.create("expected-attention", budget=50).prefill_state(q, k, v)
    assert kept.length == 50 and torch.equal(kept.k[..., :4, :], k[..., :4, :])  # the sinks first


# ---- Finch ----------------------------------------------------------------------------------------------------------


def kvpress_finch(q: torch.Tensor, keys: torch.Tensor, window_size: int) -> torch.Tensor:
    """FinchPress.score with SnapKVPress.compute_window_attention, transcribed (post-rotary queries given)."""
    bsz, num_key_value_heads, k_len, head_dim = keys.shape
    groups = H // num_key_value_heads
    query_states = q[:, :, -window_size:]
    key_states = repeat_kv(keys, groups)
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(head_dim)
    attention_mask = torch.triu(torch.ones_like(attn_weights) * float("-inf"), diagonal=k_len - window_size + 1)
    attn_weights = F.softmax(attn_weights + attention_mask, dim=-1, dtype=torch.float32).to(q.dtype)
    attn_weights = attn_weights[..., :-window_size]
    attn_weights = attn_weights * torch.arange(k_len - window_size, k_len)[None, None, :, None]
    scores = attn_weights.mean(dim=-2).view(bsz, num_key_value_heads, groups, k_len - window_size).mean(dim=2)
    return F.pad(scores, (0, window_size), value=scores.max().item() + 1)


def test_finch_votes_with_the_question_and_keeps_it() -> None:
    _, q, k, v = prompt(3)
    finch = registry.create("finch", budget=100).for_prompt(PromptContext(question=23))
    torch.testing.assert_close(finch.score(q, k, v), kvpress_finch(q, k, 23), rtol=1e-5, atol=1e-8)
    state = finch.prefill_state(q, k, v)
    assert state.length == 100 and torch.equal(state.k[..., -23:, :], k[..., -23:, :])


def test_finch_without_a_question_votes_with_its_window() -> None:
    _, q, k, v = prompt(4)
    alone = registry.create("finch", budget=100)
    for finch in (alone, alone.for_prompt(PromptContext())):
        torch.testing.assert_close(finch.score(q, k, v), kvpress_finch(q, k, 32), rtol=1e-5, atol=1e-8)


# ---- KVzip ----------------------------------------------------------------------------------------------------------


def test_kvzip_reads_the_pass_s_scores_and_a_per_call_run_refuses_it() -> None:
    _, q, k, v = prompt(5, torch.float32)
    kvzip = registry.create("kvzip", budget=40)
    assert "repeating the prompt" in kvzip.unsupported_reason(device="cpu", dtype="float32", causal=True, padded=False,
                                                              n_q=N, n_k=N, decode=True)  # fmt: skip
    with pytest.raises(UnsupportedOptionError, match="attnbench generate"):
        kvzip.prefill_state(q, k, v)
    scores = torch.rand(1, G, N)
    bound = kvzip.for_prompt(PromptContext(pass_scores=scores))
    sunk = scores.clone()
    sunk[..., :4] = float("inf")  # kvpress 0.5.5's KVzipPress.compress_post: the first n_sink = 4 always kept
    _, _, positions = compress(k, v, sunk, 40)
    assert torch.equal(bound.prefill_state(q, k, v).k, k.gather(2, positions[..., None].expand(-1, -1, -1, D)))
    assert bool((positions[..., :4] == torch.arange(4)).all())
    per_query_head = registry.create("kvzip", budget=40, select_per="query-head")
    per_query_head = per_query_head.for_prompt(PromptContext(pass_scores=scores))
    assert torch.equal(per_query_head.score(q, repeat_kv(k, H // G), v), repeat_kv(sunk[..., None], H // G)[..., 0])


@pytest.fixture(scope="module")
def tiny_llama():
    """A random Llama of two layers, h = 6, g = 2, head dim 16, in the decoder, with made-up repeat requests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=H, num_key_value_heads=G, head_dim=16, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    return InModelDecoder(model, set(), repeat=RepeatPrompt(first=(5, 6, 7), later=(8, 9), suffix=(10,)))


def test_the_repeat_pass_scores_are_maxima_of_the_model_s_attention_weights(tiny_llama, monkeypatch) -> None:
    """Chunk by chunk (40 tokens here, kvzip's 2048), each prompt position's score is the largest softmax weight a
    repeat token's query pays it over the sinks, the chunk and the repeat tokens: computed densely from a plain causal
    forward over the prompt and the chunk's repeat tokens (which must be the pass's queries and keys)."""
    monkeypatch.setattr(repeat_pass, "CHUNK", 40)
    decoder, n = tiny_llama, 100
    text = torch.randint(11, 64, (n,), generator=torch.Generator().manual_seed(0))
    exact = ExactPrompt()
    decoder.forward(exact, text[None], 0)
    scores = repeat_scores(decoder.forward, exact, text, decoder.repeat)
    assert [s.shape for s in scores] == [(1, G, n)] * 2
    chunks = decoder.repeat.chunks(text)
    assert [(start, end) for start, end, _ in chunks] == [(0, 40), (40, 80), (80, 100)]
    assert chunks[1][2][:11].tolist() == [8, 9, *text[32:40].tolist(), 10]  # the request, the quote, the suffix
    for start, end, ids in chunks:
        whole = ExactPrompt()
        decoder.forward(whole, torch.cat([text, ids])[None], 0)
        for layer, (q, k, _) in enumerate(whole.layers):
            sinks, t = min(4, start), len(ids)
            keys = repeat_kv(torch.cat([k[..., :sinks, :], k[..., start:end, :], k[..., n:, :]], dim=-2), H // G)
            logits = q[:, :, n:] @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (1, h, t, s)
            own = torch.ones(t, t, dtype=torch.bool).triu(1)
            logits[..., -t:] = logits[..., -t:].masked_fill(own, float("-inf"))
            weights = logits.softmax(dim=-1)[..., sinks : sinks + end - start]
            dense = weights.unflatten(1, (G, H // G)).amax(dim=(2, 3))
            torch.testing.assert_close(scores[layer][..., start:end], dense, rtol=1e-5, atol=1e-6)


def test_kvzip_generates_and_its_rows_pay_for_the_pass(tiny_llama) -> None:
    decoder = tiny_llama
    text = torch.randint(11, 64, (90,), generator=torch.Generator().manual_seed(1))
    methods = [Method(registry.create("full")), Method(registry.create("kvzip", budget=30))]
    full, kvzip = decoder.run(methods, text, new_tokens=3)
    assert decoder.phases["repeat pass"] > 0 and len(kvzip.tokens) == 3
    assert kvzip.prefill_s >= decoder.phases["exact prefill"] + decoder.phases["repeat pass"] > full.prefill_s - 0.05
    assert kvzip.cache_bytes == full.cache_bytes * 30 // 90
    without = InModelDecoder(decoder.model, set())
    with pytest.raises(ValueError, match="repeat=RepeatPrompt.of"):
        without.run(methods, text, new_tokens=1)


# ---- the real model ---------------------------------------------------------------------------------------------


@pytest.mark.model
def test_the_real_model_s_queries_rotated_back_are_q_proj_s(model_dir: Path) -> None:
    from attnbench.generation.context import rotary_of
    from attnbench.generation.unit import loaded

    model, _, decoder = loaded(str(model_dir))
    ids = torch.arange(100, 400)[None]
    exact = ExactPrompt()
    decoder.forward(exact, ids, 0)
    attention = model.model.layers[0]
    with torch.no_grad():
        hidden = attention.input_layernorm(model.model.embed_tokens(ids))
        q_pre = attention.self_attn.q_proj(hidden).unflatten(-1, (-1, 64)).transpose(1, 2)
    torch.testing.assert_close(prompt_unrotated(exact.layers[0][0], rotary_of(model)), q_pre, rtol=1e-4, atol=1e-4)


@pytest.mark.model
def test_kvzip_runs_in_a_generation_of_the_real_model(model_dir: Path) -> None:
    from attnbench.generation.tasks import build_samples
    from attnbench.generation.unit import encoder, loaded

    _, tokenizer, decoder = loaded(str(model_dir))
    (sample,) = build_samples("passkey", 300, 1, encoder(tokenizer), seed=4, indices=range(0, 1))
    methods = [Method(registry.create("full")), Method(registry.create("kvzip", budget=64))]
    full, kvzip = decoder.run(methods, torch.tensor(sample.context + sample.question), new_tokens=4)
    assert decoder.phases["repeat pass"] > 0 and kvzip.tokens and kvzip.cache_bytes < full.cache_bytes
