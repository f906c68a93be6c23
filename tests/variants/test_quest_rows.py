"""Quest's cache taking several tokens at once and several budgets at once, as the in-model grid steps it: a chunk
(`steps`: the question after a compressed context, a teacher-forced continuation) equals its tokens stepped one by one;
rows of several budgets stacked into one cache (`QuestCache.stack`) step as each row's own cache would, keep doing so
after rows are dropped (`select_rows`), and count what each row reads. Over both selection rules, the forced first
page or not, before and after the context closes (kvpress's budget rule), at a prompt that is no multiple of the page.

b - rows, h - query heads, g - key/value heads, n - prompt, t - chunk, d - head dim
"""

from __future__ import annotations

from itertools import product

import pytest
import torch
from attnbench.registry import registry
from attnbench.variants.quest_cache import QuestCache

KV_HEADS, GROUP, D, PAGE, PROMPT = 2, 3, 8, 4, 37
RULES = [("query-head", False), ("query-head", True), ("kv-head", True), ("kv-head", False)]


def cache(top_k: int, select_per: str, keep_first: bool, q, k, v, closed: bool) -> QuestCache:
    variant = registry.create("topk", score="minmax", block_size=PAGE, top_k=top_k, keep_first_block=keep_first,
                              select_per=select_per)  # fmt: skip
    state = variant.prefill_state(q, k, v, room=3)
    if closed:
        state.close_context()
    assert isinstance(state, QuestCache)
    return state


def prompt(rows: int = 1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, KV_HEADS * GROUP, PROMPT, D, generator=g, dtype=torch.float64)
    k = torch.randn(rows, KV_HEADS, PROMPT, D, generator=g, dtype=torch.float64)
    v = torch.randn(rows, KV_HEADS, PROMPT, D, generator=g, dtype=torch.float64)
    return q, k, v


def tokens(rows: int, t: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, KV_HEADS * GROUP, t, D, generator=g, dtype=torch.float64),
            torch.randn(rows, KV_HEADS, t, D, generator=g, dtype=torch.float64),
            torch.randn(rows, KV_HEADS, t, D, generator=g, dtype=torch.float64))  # fmt: skip


def one_by_one(state: QuestCache, q, k, v) -> torch.Tensor:
    return torch.cat([state.step(*(x[..., i : i + 1, :] for x in (q, k, v))) for i in range(q.shape[-2])], dim=-2)


@pytest.mark.parametrize(("select_per", "keep_first"), RULES)
@pytest.mark.parametrize("closed", [True, False], ids=["kvpress-rule", "fixed-total"])
@pytest.mark.parametrize("top_k", [1, 3, 20])
def test_a_chunk_equals_its_tokens_stepped_one_by_one(select_per, keep_first, closed, top_k) -> None:
    """13 tokens (past a page boundary and the buffer's room) at once equal 13 single steps, the cache after them
    too (its keys, values and page bounds); top_k=20 ranks every page (exact attention)."""
    q, k, v = prompt()
    chunk = tokens(1, 13)
    stepped, whole = (cache(top_k, select_per, keep_first, q, k, v, closed) for _ in range(2))
    expected = one_by_one(stepped, *chunk)
    got = whole.steps(*chunk)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert whole.length == stepped.length == PROMPT + 13
    for a, b in ((whole.k, stepped.k), (whole.v, stepped.v), (whole.bounds[..., :13, :], stepped.bounds[..., :13, :])):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(whole.step(*tokens(1, 1, 5)), stepped.step(*tokens(1, 1, 5)), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("select_per", "keep_first"), RULES)
@pytest.mark.parametrize("closed", [True, False], ids=["kvpress-rule", "fixed-total"])
def test_rows_of_several_budgets_step_as_their_own_caches(select_per, keep_first, closed) -> None:
    """Three rows of one prompt at top_k 1, 2 and 5, stacked: a chunk, then single steps, equal each row's own cache;
    so does the stack once the middle row is dropped; each row reads what its own cache reads."""
    q, k, v = prompt()
    budgets = (1, 5, 2)
    own = [cache(b, select_per, keep_first, q, k, v, closed) for b in budgets]
    stacked = QuestCache.stack([cache(b, select_per, keep_first, q, k, v, closed) for b in budgets])
    assert stacked.budgets() == budgets
    assert stacked.read_bytes == sum(c.read_bytes for c in own)
    chunk = tokens(3, 6)
    torch.testing.assert_close(stacked.steps(*chunk), torch.cat([c.steps(*(x[r : r + 1] for x in chunk))
                                                                for r, c in enumerate(own)]), rtol=1e-10, atol=1e-12)  # fmt: skip
    for seed in range(3):
        step = tokens(3, 1, seed + 10)
        expected = torch.cat([c.step(*(x[r : r + 1] for x in step)) for r, c in enumerate(own)])
        torch.testing.assert_close(stacked.step(*step), expected, rtol=1e-10, atol=1e-12)
    assert stacked.read_bytes == sum(c.read_bytes for c in own)
    kept = stacked.select_rows([0, 2])
    assert kept.budgets() == (1, 2)
    step = tokens(2, 1, 99)
    expected = torch.cat([c.step(*(x[r : r + 1] for x in step)) for r, c in enumerate([own[0], own[2]])])
    torch.testing.assert_close(kept.step(*step), expected, rtol=1e-10, atol=1e-12)


def test_stacked_rows_hold_what_their_own_caches_hold() -> None:
    q, k, v = prompt()
    own = [cache(b, "query-head", False, q, k, v, True) for b in (2, 4)]
    stacked = QuestCache.stack([cache(b, "query-head", False, q, k, v, True) for b in (2, 4)])
    assert stacked.held_bytes == sum(c.held_bytes for c in own)
    assert stacked.select_rows([1]).top_k == 4 and stacked.select_rows([1]).row_top_k == ()


@pytest.mark.parametrize(("first", "second"), list(product([True, False], repeat=2))[1:])
def test_caches_of_other_rules_do_not_stack(first, second) -> None:
    """A forced first page or a closed context is part of the rule: such caches never share one step."""
    q, k, v = prompt()
    a = cache(2, "query-head", True, q, k, v, True)
    b = cache(2, "query-head", first, q, k, v, second)
    assert a.stack_key() != b.stack_key()
