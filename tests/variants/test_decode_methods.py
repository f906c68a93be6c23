"""The decode forms of strided, topk (Quest), h2o and snapkv against simple references: their limiting cases equal
exact decoding, their scores and selections equal dense float64 computations at small N, and what a step reads
(`read_bytes`) is the keys its pattern selects.

b - batch, h - heads, n - prompt, t - position, d - head dim, e - value dim
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attnbench.interface import AttentionVariant, DecodeState, UnsupportedOptionError, VariantError
from attnbench.ops import KVCache
from attnbench.registry import registry
from attnbench.variants.kv_compression import HeavyHitterCache, attention_mass
from attnbench.variants.quest_cache import QuestCache
from attnbench.variants.topk import score_blocks
from torch import Tensor


def inputs(n: int, steps: int, *, batch: int = 2, heads: int = 3, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """q, k (b, h, n + steps, 16), v (b, h, n + steps, 24) in float64."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(  # type: ignore[return-value]
        torch.randn(batch, heads, n + steps, dim, generator=generator, dtype=torch.float64) for dim in (16, 16, 24)
    )


def generate(variant: AttentionVariant, q: Tensor, k: Tensor, v: Tensor, n: int) -> tuple[Tensor, Tensor, DecodeState]:
    """Prefill the first n positions, then step through the rest: (prompt outputs, step outputs, final state)."""
    prompt, state = variant.prefill(q[:, :, :n], k[:, :, :n], v[:, :, :n], room=q.shape[-2] - n)
    steps = []
    for t in range(n, q.shape[-2]):
        out, state = variant.step(state, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
        steps.append(out)
    return prompt, torch.cat(steps, dim=-2), state


def causal_weights(q: Tensor, k: Tensor) -> Tensor:
    """(b, h, i, j): the dense causal softmax weights, the reference's N x N."""
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / q.shape[-1] ** 0.5
    n = q.shape[-2]
    return scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf")).softmax(-1)


def assert_exact_decoding(variant: AttentionVariant, n: int, steps: int) -> None:
    q, k, v = inputs(n, steps)
    expected = causal_weights(q, k) @ v
    prompt, stepped, _ = generate(variant, q, k, v, n)
    torch.testing.assert_close(prompt, expected[:, :, :n], rtol=0, atol=1e-12)
    torch.testing.assert_close(stepped, expected[:, :, n:], rtol=0, atol=1e-12)


# ---- limiting cases: everything kept is exact decoding --------------------------------------------------------


@pytest.mark.parametrize("recent", [None, 0, 52])
def test_h2o_with_a_budget_for_everything_is_exact(recent: int | None) -> None:
    assert_exact_decoding(registry.create("h2o", budget=52, recent=recent), n=40, steps=12)


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_snapkv_with_a_budget_for_the_prompt_is_exact(pool: str) -> None:
    """The prompt fits: nothing is dropped, and new tokens are appended past the budget."""
    assert_exact_decoding(registry.create("snapkv", budget=40, window=8, pool=pool), n=40, steps=12)


@pytest.mark.parametrize("keep_first", [True, False])
@pytest.mark.parametrize("score", ["mean", "minmax"])
def test_quest_with_every_page_is_exact(keep_first: bool, score: str) -> None:
    """top_k at least the pages: every page is read (decode is Quest's whatever the forward's score)."""
    variant = registry.create("topk", block_size=4, top_k=16, keep_first_block=keep_first, score=score)
    assert_exact_decoding(variant, n=37, steps=12)  # 49 positions: 13 pages, 11 or 12 ranked


# ---- H2O -------------------------------------------------------------------------------------------------------


def test_h2o_masses_are_the_column_sums_of_the_causal_weights() -> None:
    """Chunked over queries, the prompt's outputs and masses equal the dense float64 ones; after the steps (nothing
    evicted) the cache's masses are the column sums over every query so far."""
    n, steps = 40, 9
    q, k, v = inputs(n, steps)
    weights = causal_weights(q, k)  # (b, h, i, j)
    out, mass = attention_mass(q[:, :, :n], k[:, :, :n], v[:, :, :n], chunk=7)
    torch.testing.assert_close(out, (weights[:, :, :n, :n] @ v[:, :, :n]), rtol=0, atol=1e-12)
    torch.testing.assert_close(mass, weights[:, :, :n, :n].sum(dim=-2), rtol=0, atol=1e-12)
    _, _, state = generate(registry.create("h2o", budget=64, recent=0), q, k, v, n)
    assert isinstance(state, HeavyHitterCache)  # no ring: positions fill the heavy slots in order
    torch.testing.assert_close(state.heavy_mass[..., : n + steps], weights.sum(dim=-2), rtol=0, atol=1e-12)


def h2o_reference(q: Tensor, k: Tensor, v: Tensor, n: int, budget: int, recent: int) -> Tensor:
    """H2O written out per head in float64 (the paper's Algorithm 1 with a recent window): the step outputs (b, h,
    steps, e). The prompt's masses are its causal column sums; every step attends to the kept positions and itself,
    adds its weights to their masses, and evicts the non-recent position of least mass while over budget."""
    b, h, total, _ = q.shape
    out = torch.zeros(b, h, total - n, v.shape[-1], dtype=q.dtype)
    weights = causal_weights(q[:, :, :n], k[:, :, :n])
    for x in range(b):
        for y in range(h):
            mass = torch.zeros(total, dtype=q.dtype)
            mass[:n] = weights[x, y].sum(dim=0)
            older = list(range(max(0, n - recent)))
            top = sorted(older, key=lambda j: -mass[j].item())[: budget - recent]
            kept = sorted(top) + list(range(max(0, n - recent), n))
            for t in range(n, total):
                visible = torch.tensor(kept + [t])
                w = torch.softmax(k[x, y, visible] @ q[x, y, t] / q.shape[-1] ** 0.5, dim=0)
                out[x, y, t - n] = w @ v[x, y, visible]
                mass[visible] += w
                kept = kept + [t]
                if len(kept) > budget:
                    candidates = [j for j in kept if j <= t - recent]  # not among the `recent` last
                    kept.remove(min(candidates, key=lambda j: mass[j].item()))
    return out


@pytest.mark.parametrize("recent", [0, 4, 12])
def test_h2o_steps_equal_the_reference_eviction(recent: int) -> None:
    n, steps, budget = 24, 12, 12
    q, k, v = inputs(n, steps, batch=1, heads=2)
    _, stepped, _ = generate(registry.create("h2o", budget=budget, recent=recent), q, k, v, n)
    torch.testing.assert_close(stepped, h2o_reference(q, k, v, n, budget, recent), rtol=0, atol=1e-12)


def test_h2o_state_has_a_fixed_size() -> None:
    """The cache holds `budget` positions whatever the prompt's length and the steps taken."""
    variant = registry.create("h2o", budget=16)
    sizes = set()
    for n in (20, 64, 128):
        q, k, v = inputs(n, 5, batch=1, heads=2)
        prompt, state = variant.prefill(q[:, :, :n], k[:, :, :n], v[:, :, :n], room=5)
        sizes.add(state.nbytes)
        for t in range(n, n + 5):
            _, state = variant.step(state, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
            sizes.add(state.nbytes)
        assert state.read_bytes <= state.nbytes
    assert len(sizes) == 1, sizes


# ---- SnapKV ----------------------------------------------------------------------------------------------------


def pooled_reference(votes: Tensor, kernel: int, pool: str) -> Tensor:
    """Pooling along the last axis written out: each position against its `kernel` neighbours (centred), the max
    over those that exist, the average over all `kernel` with the missing ones counted as zeros."""
    n, half = votes.shape[-1], kernel // 2
    out = torch.empty_like(votes)
    for j in range(n):
        lo, hi = j - half, j - half + kernel
        window = votes[..., max(0, lo) : min(n, hi)]
        out[..., j] = window.amax(dim=-1) if pool == "max" else window.sum(dim=-1) / kernel
    return out


@pytest.mark.parametrize("pool, kernel", [("max", 7), ("avg", 5), ("max", 1)])
def test_snapkv_keeps_what_the_window_votes_for(pool: str, kernel: int) -> None:
    """Per head, the window and the budget - window prefix positions with the highest pooled votes (the dense
    weights of the window's queries, summed): no dropped position has a higher one (max pooling ties neighbours)."""
    n, budget, window = 48, 20, 6
    q, k, v = inputs(n, 0)
    votes = causal_weights(q, k)[:, :, n - window :, : n - window].sum(dim=-2)  # (b, h, n - w)
    pooled = pooled_reference(votes, kernel, pool)
    variant = registry.create("snapkv", budget=budget, window=window, kernel=kernel, pool=pool)
    prompt, state = variant.prefill(q, k, v, room=3)
    torch.testing.assert_close(prompt, causal_weights(q, k) @ v, rtol=0, atol=1e-12)  # exact over the prompt
    assert isinstance(state, KVCache) and state.keys.shape[-2] == budget + 3
    kept = (state.k[:, :, :, None, :] == k[:, :, None, :, :]).all(dim=-1).any(dim=2)  # (b, h, n): which rows
    assert bool(kept[..., n - window :].all()) and bool((kept.sum(dim=-1) == budget).all())
    prefix = kept[..., : n - window]
    lowest_kept = pooled.masked_fill(~prefix, float("inf")).amin(dim=-1)
    highest_dropped = pooled.masked_fill(prefix, float("-inf")).amax(dim=-1)
    assert bool((lowest_kept >= highest_dropped - 1e-12).all())
    if pool == "avg":  # no ties: exactly the reference's top positions
        top = pooled.topk(budget - window, dim=-1).indices
        assert bool(prefix.gather(-1, top).all())


# ---- Quest -----------------------------------------------------------------------------------------------------


def test_quest_bound_is_above_every_score_in_its_page() -> None:
    """The page metadata kept through prefill and steps gives Σ_d max(q_d max_d, q_d min_d) >= q · k for every key
    of the page (Quest's claim), with equality reached by no more than the bound."""
    n, steps, page = 37, 14, 8
    q, k, v = inputs(n, steps)
    variant = registry.create("topk", block_size=page, top_k=2, score="minmax")
    _, _, state = generate(variant, q, k, v, n)
    assert isinstance(state, QuestCache)
    total = n + steps
    pages = -(-total // page)
    queries = torch.randn(2, 3, 50, 16, dtype=torch.float64)
    bounds = score_blocks(queries, (state.high[..., :pages, :], state.low[..., :pages, :]))  # (b, h, i, c)
    keys = F.pad(k, (0, 0, 0, pages * page - total)).unflatten(2, (pages, page))  # (b, h, c, j, d)
    scores = torch.einsum("bhid,bhcjd->bhicj", queries, keys)
    real = (torch.arange(pages * page) < total).view(pages, page)
    best = scores.masked_fill(~real, float("-inf")).amax(dim=-1)  # (b, h, i, c)
    assert bool((bounds >= best - 1e-12).all())
    # and it is that bound, not merely a looser one (+inf would pass the line above): the page's real keys' channel
    # extremes, each taken on the side the query's sign picks
    high = keys.masked_fill(~real[..., None], float("-inf")).amax(dim=-2)  # (b, h, c, d)
    low = keys.masked_fill(~real[..., None], float("inf")).amin(dim=-2)
    exact = torch.maximum(queries[:, :, :, None] * high[:, :, None], queries[:, :, :, None] * low[:, :, None]).sum(-1)
    torch.testing.assert_close(bounds, exact, rtol=0, atol=1e-12)


def test_quest_reads_its_chosen_pages_and_their_metadata() -> None:
    """read_bytes: the keys and values the forward (score="minmax", whose last row a step is) shows each next
    step reading, and 2 d values of metadata per ranked page."""
    n, steps, page, top_k = 37, 10, 4, 3
    q, k, v = inputs(n, steps)
    variant = registry.create("topk", block_size=page, top_k=top_k, score="minmax")
    prompt, state = variant.prefill(q[:, :, :n], k[:, :, :n], v[:, :, :n], room=steps)
    for t in range(n, n + steps):
        support = variant.support_for(q[:, :, : t + 1], k[:, :, : t + 1], causal=True)  # (b, h, i, j)
        rows = int(support[:, :, t, :t].sum())  # the held positions step t reads
        ranked = t // page - 1  # before its own page, the first one kept
        metadata = 2 * 2 * 3 * ranked * 16 * 8
        assert state.read_bytes == rows * (16 + 24) * 8 + metadata
        _, state = variant.step(state, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])


# ---- strided ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
@pytest.mark.parametrize("factorize", [False, True])
@pytest.mark.parametrize("stride", [1, 5, 23])
def test_strided_steps_are_the_forward_rows_and_read_its_pattern(pattern: str, factorize: bool, stride: int) -> None:
    """With the stride given, prefill and steps equal the causal forward; what each step reads is the keys of its
    pattern before it (factorized: each head its own part)."""
    n, steps = 23, 14
    q, k, v = inputs(n, steps)
    variant = registry.create("strided", stride=stride, pattern=pattern, factorize=factorize, summary=2)
    assert variant.decode_equals_forward
    expected = variant(q, k, v, causal=True)
    support = variant.support_for(q, k, causal=True)  # (1, h|1, i, j)
    prompt, state = variant.prefill(q[:, :, :n], k[:, :, :n], v[:, :, :n], room=steps)
    torch.testing.assert_close(prompt, expected[:, :, :n], rtol=0, atol=1e-12)
    for t in range(n, n + steps):
        rows = int(support[..., t, :t].expand(2, 3, t).sum())
        assert state.read_bytes == rows * (16 + 24) * 8, f"step at {t}"
        out, state = variant.step(state, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
        torch.testing.assert_close(out, expected[:, :, t : t + 1], rtol=0, atol=1e-12)


def test_strided_fixed_keeps_summaries_and_one_block() -> None:
    """The fixed pattern's cache: the summaries of every block and the current block, not every position."""
    variant = registry.create("strided", stride=8, pattern="fixed", summary=2)
    q, k, v = inputs(64, 0, batch=1, heads=1)
    _, state = variant.prefill(q, k, v)
    assert state.nbytes == (64 // 8 * 2 + 8) * (16 + 24) * 8


def test_strided_default_stride_is_the_prompts() -> None:
    """Without `stride` the steps keep the prompt's stride, so they are not the forward's rows at N + t."""
    assert not registry.create("strided").decode_equals_forward
    assert registry.create("strided", stride=4).decode_equals_forward


# ---- the KV-cache methods are decode only -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["h2o", "snapkv"])
def test_kv_cache_methods_refuse_a_full_sequence_call(name: str) -> None:
    variant = registry.create(name)
    options = dict(device="cpu", dtype="float32", padded=False, n_q=8, n_k=8)
    assert "--mode decode" in (variant.unsupported_reason(**options, causal=True) or "")
    assert variant.unsupported_reason(**options, causal=True, decode=True) is None
    q = torch.randn(1, 1, 8, 16)
    with pytest.raises(UnsupportedOptionError, match="KV-cache method"):
        variant(q, q, q, causal=True)


@pytest.mark.parametrize("name, params, word", [("h2o", {"budget": 8, "recent": 9}, "recent"),
                                                ("snapkv", {"budget": 8, "window": 8}, "window")])  # fmt: skip
def test_kv_cache_budgets_are_checked(name: str, params: dict, word: str) -> None:
    with pytest.raises(VariantError, match=word):
        registry.create(name, **params)


def test_quest_ranks_many_pages() -> None:
    """Past 64 pages the ranking narrows before its top k (topk's `largest`); the steps still equal the causal
    forward's last rows (score="minmax", the bound Quest ranks by)."""
    n, steps = 4 * 80 + 3, 3
    q, k, v = inputs(n, steps, batch=1, heads=2)
    variant = registry.create("topk", block_size=4, top_k=3, score="minmax")
    expected = variant(q, k, v, causal=True)
    _, stepped, _ = generate(variant, q, k, v, n)
    torch.testing.assert_close(stepped, expected[:, :, n:], rtol=0, atol=1e-12)
