"""kvpress's simple scorer presses against their references: each press's score equals a near-verbatim transcription
of kvpress's `score` (kvpress/presses/<x>_press.py, cited per reference) on random grouped-query inputs at an awkward
length, what it keeps is the reference's top budget, and the limiting cases hold (a budget covering the prompt keeps
everything and decodes exactly). ThinK (channels, not positions) holds fewer key bytes and attends as kvpress's zeroed
channels do.

b - batch, h - query heads, g - key/value heads, n - prompt positions, d - head dim
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from attnbench.generation.budgets import at_share, knob_of
from attnbench.interface import PromptContext, expand_kv_heads
from attnbench.ops import KVCache, generate
from attnbench.registry import registry
from attnbench.variants.kv_compression import gather_positions
from attnbench.variants.think import ChannelCache
from torch import Tensor

B, HEADS, KV_HEADS, N, D = 2, 6, 2, 301, 16
GROUP = HEADS // KV_HEADS
PRESSES = ["random", "knorm", "keydiff", "lagkv", "tova", "observed-attention", "cur", "compactor"]


def inputs(n: int = N, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Post-rotary-like q (b, h, n, d), k, v (b, g, n, d) in float64."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HEADS, n, D, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(B, KV_HEADS, n, D, generator=generator, dtype=torch.float64) for _ in range(2))
    return q, k, v


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """transformers' repeat_kv: (b, g, n, d) -> (b, g * groups, n, d), query head i reading head i // groups."""
    b, g, n, d = x.shape
    return x[:, :, None].expand(b, g, groups, n, d).reshape(b, g * groups, n, d)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


# ---- references: kvpress's score(), transcribed (module, hidden states and the eager matrix replaced by q, k, v) ----


def random_reference(q: Tensor, keys: Tensor, values: Tensor, seed: int) -> Tensor:
    """kvpress/presses/random_press.py: RandomPress.score."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return torch.rand(*keys.shape[:-1], generator=generator, device=keys.device, dtype=keys.dtype)


def knorm_reference(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """kvpress/presses/knorm_press.py: KnormPress.score."""
    return -keys.norm(dim=-1)


def keydiff_reference(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """kvpress/presses/keydiff_press.py: KeyDiffPress.score."""
    anchor = F.normalize(keys, p=2, dim=-1).mean(dim=2, keepdim=True)
    return -F.cosine_similarity(keys, anchor, dim=-1)


def lagkv_reference(q: Tensor, keys: Tensor, values: Tensor, n_sink: int = 4, lag_size: int = 128,
                    cross_scoring: bool = False) -> Tensor:  # fmt: skip
    """kvpress/presses/lagkv_press.py: LagKVPress.score and _get_states_score."""

    def get_states_score(target_v: Tensor) -> Tensor:
        ref = target_v[:, :, 1:, :, :]
        v = target_v[:, :, :-1, :, :]
        min_r = ref.min(dim=-2).values.unsqueeze(-2).expand(-1, -1, -1, lag_size, -1)
        max_r = ref.max(dim=-2).values.unsqueeze(-2).expand(-1, -1, -1, lag_size, -1)
        return ((v - min_r) / (max_r - min_r)).std(dim=-1).softmax(dim=-1)

    bsz, num_key_value_heads, q_len, d = keys.shape
    if q_len < n_sink + 2 * lag_size:
        score = torch.ones((bsz, num_key_value_heads, q_len), dtype=keys.dtype, device=keys.device)
        if q_len > n_sink:
            score[:, :, n_sink:] = (torch.arange(q_len - n_sink, device=keys.device) / (q_len - n_sink)).to(keys.dtype)
        return score
    end_idx = n_sink + ((q_len - n_sink) // lag_size) * lag_size
    tail_len = lag_size + q_len - end_idx
    key_score = get_states_score(keys[:, :, n_sink:end_idx].view(bsz, num_key_value_heads, -1, lag_size, d))
    value_score = get_states_score(values[:, :, n_sink:end_idx].view(bsz, num_key_value_heads, -1, lag_size, d))
    score = (key_score + value_score) / 2
    if not cross_scoring:
        score = score.argsort(dim=-1).argsort(dim=-1) / lag_size
        score = score.to(keys.dtype)
    sink_score = torch.ones((bsz, num_key_value_heads, n_sink), dtype=score.dtype, device=score.device)
    tail_score = torch.ones((bsz, num_key_value_heads, tail_len), dtype=score.dtype, device=score.device)
    return torch.cat((sink_score, score.reshape(bsz, num_key_value_heads, -1), tail_score), dim=-1)


def window_attention_reference(query_states: Tensor, keys: Tensor, window_size: int) -> Tensor:
    """kvpress/presses/snapkv_press.py: SnapKVPress.compute_window_attention, from the post-rotary queries."""
    bsz, _, k_len, _ = keys.shape
    query_states = query_states[:, :, -window_size:]
    key_states = repeat_kv(keys, query_states.shape[1] // keys.shape[1])
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(query_states.shape[-1])
    attention_mask = torch.ones_like(attn_weights) * float("-inf")
    attention_mask = torch.triu(attention_mask, diagonal=k_len - window_size + 1)
    attn_weights += attention_mask
    attn_weights = torch.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
    return attn_weights[..., :-window_size]


def tova_reference(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """kvpress/presses/tova_press.py: TOVAPress.score (its compute_window_attention path, the window one query)."""
    attn_weights = window_attention_reference(q, keys, 1)
    scores = attn_weights.mean(1)
    scores = scores.repeat(1, keys.shape[1], 1)
    return F.pad(scores, (0, 1), value=scores.max().item() + 1)


def observed_attention_reference(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """kvpress/presses/observed_attention_press.py: ObservedAttentionPress.score, the eager causal attention matrix
    built densely here (a small n)."""
    n = keys.shape[-2]
    scores = torch.matmul(q, repeat_kv(keys, q.shape[1] // keys.shape[1]).transpose(2, 3)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attentions = torch.softmax(scores, dim=-1)
    scores = attentions.sum(2)
    bsz, num_key_value_heads, n_tokens, _ = keys.shape
    n_tokens_in_sum = torch.arange(n_tokens, 0, -1).to(attentions.device, attentions.dtype)
    scores = scores / n_tokens_in_sum
    return scores.view(bsz, num_key_value_heads, -1, n_tokens).mean(2)


def cur_reference(q: Tensor, keys: Tensor, values: Tensor, num_sinks: int = 4, leverage_type: str = "kv_product",
                  projection: Tensor | None = None, use_local_approximation: bool = True,
                  local_window_size: int = 16) -> Tensor:  # fmt: skip
    """kvpress/presses/cur_press.py: CURPress.score (`projection`: its random G, given)."""
    if projection is not None:
        keys = keys @ projection
        values = values @ projection
    k2 = (keys**2).sum(dim=-1)
    v2 = (values**2).sum(dim=-1)
    if use_local_approximation:
        b, h, n = k2.shape
        w = local_window_size
        k2 = F.pad(k2, (0, (w - n % w) % w)).reshape(b, h, -1, w)
        k2 = (k2 / k2.sum(dim=-1, keepdim=True)).reshape(b, h, -1)[:, :, :n]
        v2 = F.pad(v2, (0, (w - n % w) % w)).reshape(b, h, -1, w)
        v2 = (v2 / v2.sum(dim=-1, keepdim=True)).reshape(b, h, -1)[:, :, :n]
    scores = {"key": k2, "value": v2, "kv_avg": (k2 + v2) / 2, "kv_product": k2 * v2}[leverage_type]
    scores /= scores.sum(dim=-1, keepdim=True)
    scores[:, :, :num_sinks] = 1.0
    return scores


def leverage_reference(key_states: Tensor, phi: Tensor) -> Tensor:
    """kvpress/presses/leverage_press.py: LeverageScorePress.compute_leverage_scores (Phi given) and score's z-norm."""
    x = key_states - key_states.mean(dim=-2, keepdim=True)
    x = torch.matmul(x, phi).to(torch.float32 if key_states.dtype != torch.float64 else torch.float64)
    xt = x.transpose(-2, -1)
    g = xt @ x
    g = 0.5 * (g + g.transpose(-2, -1))
    identity, jitter = torch.eye(g.shape[-1], dtype=g.dtype), 1e-2
    for _ in range(5):
        factor, info = torch.linalg.cholesky_ex(g + jitter * identity, upper=False)
        if bool((info == 0).all()):
            break
        jitter = max(1e-8, 1e-2 if jitter == 0.0 else 10.0 * jitter)
    inv_xt = torch.cholesky_solve(xt, factor, upper=False)
    scores = (x * inv_xt.transpose(-2, -1)).sum(dim=-1).clamp_min(0)
    return (scores - scores.mean()) / scores.std().clamp_min(1e-6)


def non_causal_reference(q: Tensor, keys: Tensor, values: Tensor, chunk_size: int) -> Tensor:
    """kvpress/presses/non_causal_attention_press.py: NonCausalAttnPress.non_causal_chunked_attn and score (after its
    re-rotated queries, which are the post-rotary q)."""
    k = repeat_kv(keys, q.shape[1] // keys.shape[1])
    B_, H, S, d = k.shape
    S_pad = math.ceil(S / chunk_size) * chunk_size
    pad_len = S_pad - S
    if pad_len > 0:
        q_padded = torch.cat([q, torch.zeros(B_, H, pad_len, d, dtype=q.dtype)], dim=2)
        k_padded = torch.cat([k, torch.zeros(B_, H, pad_len, d, dtype=k.dtype)], dim=2)
        last_chunk_start = (S // chunk_size) * chunk_size
    else:
        q_padded, k_padded = q, k
        last_chunk_start = ((S - 1) // chunk_size) * chunk_size
    in_valid = torch.arange(last_chunk_start, S_pad) >= S
    query_mask = key_mask = in_valid.view(1, 1, chunk_size).expand(B_, H, chunk_size)
    num_chunks = S_pad // chunk_size
    dots = torch.matmul(q_padded.view(B_, H, num_chunks, chunk_size, d),
                        k_padded.view(B_, H, num_chunks, chunk_size, d).transpose(-2, -1))  # fmt: skip
    dots[:, :, -1].masked_fill_(query_mask.unsqueeze(-1), 0)
    dots[:, :, -1].masked_fill_(key_mask.unsqueeze(-2), -1e-9)
    attn = torch.softmax(dots.to(torch.float64), dim=-1)
    A = attn.sum(dim=-2).view(B_, H, S_pad)[..., :S]
    A = A.view(A.shape[0], values.shape[1], -1, A.shape[-1]).mean(dim=-2)
    scores = F.avg_pool1d(A * values.norm(dim=-1), kernel_size=3, padding=1, stride=1)
    return (scores - scores.mean()) / scores.std().clamp_min(1e-6)


def compactor_reference(q: Tensor, keys: Tensor, values: Tensor, phi: Tensor, blending: float,
                        pre_rope_keys: Tensor | None = None, chunk_size: int = 256) -> Tensor:  # fmt: skip
    """kvpress/presses/compactor_press.py: CompactorPress.score (sink_size_start 8, sink_size_end 4; `phi` its
    leverage's Gaussian sketch, given; `pre_rope_keys`: the keys kvpress re-projects from the hidden states)."""
    n_queries = keys.shape[-2]
    left_keep = min(8, n_queries)
    right_keep = min(4, max(0, n_queries - left_keep))
    start_idx, end_idx = left_keep, (None if right_keep == 0 else -right_keep)
    pre = keys if pre_rope_keys is None else pre_rope_keys
    l_scores = leverage_reference(pre[..., start_idx:end_idx, :], phi)
    attn_scores = non_causal_reference(q[..., start_idx:end_idx, :], keys[..., start_idx:end_idx, :],
                                       values[..., start_idx:end_idx, :], chunk_size)  # fmt: skip
    scores = blending * l_scores + attn_scores
    return F.pad(scores, (left_keep, right_keep), value=scores.detach().max())


def sketch(seed: int, columns: int = 48) -> Tensor:
    """The compactor's Gaussian sketch (b, g, d, k) as the variant draws it from its seed."""
    drawn = torch.randn(B, KV_HEADS, D, columns, generator=torch.Generator().manual_seed(seed))
    return drawn.double() / math.sqrt(columns)


# ---- the cases: (press, its hyperparameters, the reference) --------------------------------------------------------

Reference = Callable[[Tensor, Tensor, Tensor], Tensor]
BUDGET = 100
CASES: list[tuple[str, dict[str, Any], Reference]] = [
    ("random", {"seed": 3}, lambda q, k, v: random_reference(q, k, v, 3)),
    ("knorm", {}, knorm_reference),
    ("keydiff", {}, keydiff_reference),
    ("lagkv", {}, lagkv_reference),  # one partition scored against the next, a tail of 169
    ("lagkv", {"lag_size": 32}, lambda q, k, v: lagkv_reference(q, k, v, lag_size=32)),
    ("lagkv", {"lag_size": 32, "cross_scoring": True}, lambda q, k, v: lagkv_reference(q, k, v, 4, 32, True)),
    ("lagkv", {"lag_size": 160}, lambda q, k, v: lagkv_reference(q, k, v, lag_size=160)),  # too short: a window
    ("tova", {}, tova_reference),
    ("observed-attention", {}, observed_attention_reference),
    ("cur", {}, cur_reference),
    ("cur", {"leverage_type": "kv_avg", "use_local_approximation": False, "num_sinks": 2},
     lambda q, k, v: cur_reference(q, k, v, 2, "kv_avg", use_local_approximation=False)),
    ("cur", {"use_random_leverage": True, "seed": 5, "leverage_type": "key"},
     lambda q, k, v: cur_reference(q, k, v, leverage_type="key", projection=torch.randn(
         D, 20, generator=torch.Generator().manual_seed(5)).double() / math.sqrt(20))),
    ("compactor", {"seed": 7}, lambda q, k, v: compactor_reference(q, k, v, sketch(7), 1 - BUDGET / N)),
    ("compactor", {"seed": 1, "chunk_size": 64, "blending": 0.35, "sketch_dimension": 12},
     lambda q, k, v: compactor_reference(q, k, v, sketch(1, 12), 0.35, chunk_size=64)),
]  # fmt: skip
IDS = [f"{name}{params or ''}" for name, params, _ in CASES]


def create(name: str, params: dict[str, Any], **more: Any):
    params = dict(params)
    seed = params.pop("seed", 0)
    return registry.load(name)(seed=seed, **params, **more)


def test_every_press_is_registered_with_its_paper_and_kvpress_press() -> None:
    for name in [*PRESSES, "think"]:
        cls = registry.load(name)
        assert cls.paper and cls.press.endswith("Press"), name
    assert {name for name, _, _ in CASES} == set(PRESSES)


@pytest.mark.parametrize("name, params, reference", CASES, ids=IDS)
def test_score_equals_kvpress_s(name: str, params: dict[str, Any], reference: Reference) -> None:
    q, k, v = inputs()
    press = create(name, params, budget=BUDGET)
    expected = reference(q, k, v)
    got = press.score(q, k, v)
    assert got.shape == (B, KV_HEADS, N)
    assert (got - expected).abs().max() < 1e-5


@pytest.mark.parametrize("name, params, reference", CASES, ids=IDS)
def test_kept_positions_are_the_reference_s_top_budget(name: str, params: dict[str, Any], reference: Reference) -> None:
    """The cache after the prompt holds, per key/value head, the keys and values of the reference's top budget."""
    q, k, v = inputs(seed=1)
    state = create(name, params, budget=BUDGET).prefill_state(q, k, v)
    assert isinstance(state, KVCache) and state.length == BUDGET
    positions = reference(q, k, v).topk(BUDGET, dim=-1).indices.sort(dim=-1).values
    assert torch.equal(state.k, gather_positions(k, positions)) and torch.equal(state.v, gather_positions(v, positions))


@pytest.mark.parametrize("name", [*PRESSES, "think"])
def test_a_budget_covering_the_prompt_keeps_everything_and_decodes_exactly(name: str) -> None:
    """Prompt and steps within the budget (ThinK: every key channel): exact causal attention throughout."""
    q, k, v = inputs(120)
    variant = registry.create(name, **({"key_channels": 1.0} if name == "think" else {"budget": 200}))
    prompt, steps, _ = generate(variant, q, k, v, 100)
    expected = F.scaled_dot_product_attention(q, expand_kv_heads(k, GROUP), expand_kv_heads(v, GROUP), is_causal=True)
    assert (torch.cat([prompt, steps], dim=-2) - expected).abs().max() < 1e-10


def test_random_is_reproducible_from_its_seed_and_differs_across_seeds() -> None:
    q, k, v = inputs()
    first, again, other = (registry.create("random", seed=seed).score(q, k, v) for seed in (4, 4, 5))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert 0 <= float(first.min()) and float(first.max()) < 1


def test_knorm_keeps_the_keys_of_smallest_norm() -> None:
    q, k, v = inputs()
    state = registry.create("knorm", budget=BUDGET).prefill_state(q, k, v)
    kept = state.k.norm(dim=-1).sort(dim=-1).values  # (b, g, budget)
    assert torch.equal(kept, k.norm(dim=-1).sort(dim=-1).values[..., :BUDGET])


def test_tova_and_compactor_keep_their_protected_positions_at_their_smallest_budget() -> None:
    q, k, v = inputs()
    tova = registry.create("tova", budget=2).prefill_state(q, k, v)
    assert torch.equal(tova.k[..., -1, :], k[..., -1, :])  # the last position
    compactor = registry.create("compactor", budget=13).prefill_state(q, k, v)
    assert torch.equal(compactor.k[..., :8, :], k[..., :8, :]) and torch.equal(compactor.k[..., -4:, :], k[..., -4:, :])


def test_compactor_scores_the_pre_rotary_keys_given_the_model_s_rotary_embedding() -> None:
    """In the model (`PromptContext.rotary`), the leverage is of the keys before the rotary embedding, as kvpress
    re-projects them from the hidden states: undoing the rotation gives them back."""
    q, pre, v = inputs()
    frequencies = 10000 ** -(torch.arange(D // 2, dtype=torch.float64) / (D // 2))
    angles = torch.arange(N, dtype=torch.float64)[:, None] * frequencies
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)  # (n, d)
    k = pre * cos + rotate_half(pre) * sin
    context = PromptContext(rotary=lambda positions: (cos[positions], sin[positions]))
    press = registry.create("compactor", seed=7, budget=BUDGET).for_prompt(context)
    expected = compactor_reference(q, k, v, sketch(7), 1 - BUDGET / N, pre_rope_keys=pre)
    assert (press.score(q, k, v) - expected).abs().max() < 1e-5
    without = registry.create("compactor", seed=7, budget=BUDGET).score(q, k, v)  # post-rotary keys: differs
    assert (without - expected).abs().max() > 1e-3


# ---- ThinK: key channels --------------------------------------------------------------------------------------------


def think_reference(q: Tensor, keys: Tensor, ratio: float, window_size: int = 32) -> Tensor:
    """kvpress/presses/think_press.py: ThinKPress.compress on the keys (the last window's post-rotary queries given):
    the pruned channels zeroed."""
    bsz, num_key_value_heads, k_len, head_dim = keys.shape
    queries = q[:, :, -window_size:]
    queries_norm = torch.pow(queries, 2).mean(dim=2)
    queries_norm = queries_norm.view(bsz, num_key_value_heads, q.shape[1] // num_key_value_heads, head_dim).mean(2)
    keys_norm = torch.pow(keys, 2).mean(dim=2)
    key_scores = queries_norm * keys_norm
    n_pruned = int(head_dim * ratio)
    indices = key_scores.topk(n_pruned, dim=-1, largest=False).indices
    indices = indices.unsqueeze(2).expand(-1, -1, k_len, -1)
    return keys.clone().scatter_(-1, indices, 0)


@pytest.mark.parametrize("share", [0.5, 0.25, 0.6])
def test_think_holds_only_its_channels_and_they_are_kvpress_s(share: float) -> None:
    q, k, v = inputs()
    state = registry.create("think", key_channels=share).prefill_state(q, k, v)
    assert isinstance(state, ChannelCache)
    kept = D - int(D * (1 - share))
    assert state.channels.shape == (B, KV_HEADS, kept) and state.pruned.shape[-1] == kept
    zeroed = think_reference(q, k, 1 - share)
    nonzero = (zeroed != 0).any(dim=-2)  # (b, g, d): the channels kvpress keeps
    assert torch.equal(nonzero, torch.zeros_like(nonzero).scatter_(-1, state.channels, True))
    whole = registry.create("think", key_channels=1.0).prefill_state(q, k, v)
    index_bytes = state.channels.numel() * state.channels.element_size()
    shrunk = B * KV_HEADS * N * (D - kept) * k.element_size()
    assert state.held_bytes == whole.held_bytes - shrunk - (whole.channels.numel() * 8) + index_bytes
    assert state.read_bytes == state.held_bytes


@pytest.mark.parametrize("prune_new", [False, True])
def test_think_steps_equal_exact_attention_over_kvpress_s_zeroed_channels(prune_new: bool) -> None:
    """The prompt's keys with their pruned channels zeroed (kvpress), later keys whole (kvpress: its press acts on
    the context alone) or zeroed on the same channels (`prune_new`): exact attention over them is what ThinK's steps
    give, holding fewer channels. Several steps, so later tokens see the earlier ones."""
    q, k, v = inputs(120)
    prompt = 100
    variant = registry.create("think", key_channels=0.5, prune_new=prune_new)
    out, steps, state = generate(variant, q, k, v, prompt)
    zeroed = think_reference(q[:, :, :prompt], k[:, :, :prompt], 0.5)
    later = k[:, :, prompt:]
    if prune_new:
        mask = (zeroed != 0).any(dim=-2, keepdim=True)  # (b, g, 1, d)
        later = later * mask
    keys = torch.cat([zeroed, later], dim=-2)
    expected = F.scaled_dot_product_attention(q, *(expand_kv_heads(x, GROUP) for x in (keys, v)), is_causal=True)
    assert (steps - expected[:, :, prompt:]).abs().max() < 1e-10
    exact = F.scaled_dot_product_attention(q, expand_kv_heads(k, GROUP), expand_kv_heads(v, GROUP), is_causal=True)
    assert (out - exact[:, :, :prompt]).abs().max() < 1e-10  # the prompt itself is exact (kvpress prunes after it)
    assert isinstance(state, ChannelCache) and state.length == 120
    assert state.pruned_length == (120 if prune_new else prompt)


def test_think_s_knob_is_its_key_channels_share() -> None:
    knob = knob_of("think")
    assert knob is not None and knob.parameter == "key_channels"
    hparams = registry.create("think").hparams
    assert at_share("think", hparams, 0.25, 1000)["key_channels"] == 0.25
    assert at_share("think", hparams, 1 / 16, 300, reserve=50)["key_channels"] == 1 / 16  # every token kept: no reserve


def test_think_rows_can_be_selected() -> None:
    q, k, v = inputs(120)
    _, _, state = generate(registry.create("think", key_channels=0.5), q, k, v, 100)
    one = state.select_rows([1])
    assert torch.equal(one.values[0, :, : one.length], state.values[1, :, : state.length])
    assert one.held_bytes * 2 == state.held_bytes


def test_list_names_each_press_s_paper_and_kvpress_press() -> None:
    """`attnbench list` prints this line under a press's row (the class attributes `paper` and `press`)."""
    from attnbench.commands.listing import method_source

    assert method_source(registry.load("knorm")) == "paper: Knorm (Devoto et al. 2024); kvpress: KnormPress"
    assert method_source(registry.load("think")) == "paper: ThinK (Xu et al. 2024); kvpress: ThinKPress"
    assert method_source(registry.load("band")) == ""  # not a KV-cache press
