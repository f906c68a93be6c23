"""`topk`'s decode as Quest publishes it (keep_first_block=False, select_per="query-head") against a transcription of
Quest's own code, per query head under grouped-query attention, at prompts that are no multiple of the page; every
setting's step is exact softmax over exactly the pages it chose; the NSA-style rule (keep_first_block=True,
select_per="kv-head") stays as its own setting; what a step reads is counted.

b - batch, h - query heads, g - key/value heads, n - prompt, t - position, d - head dim, c - page
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from attnbench.interface import expand_kv_heads
from attnbench.ops import dense_masked_attention
from attnbench.registry import registry
from attnbench.variants.quest_cache import QuestCache
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

KV_HEADS, GROUP = 2, 3
HEADS = KV_HEADS * GROUP
PUBLISHED = {"score": "minmax", "keep_first_block": False, "select_per": "query-head"}
NSA_STYLE = {"score": "minmax", "keep_first_block": True, "select_per": "kv-head"}


def quest_reference(
    q: Tensor, k: Tensor, v: Tensor, page_size: int, page_budget: int
) -> tuple[Tensor, Tensor | None]:
    """Quest's decode attention, transcribed from `_ref_self_approx_attention` in mit-han-lab/Quest,
    quest/tests/test_approx_attention.py (the reference of the kernels quest/models/QuestAttention.py decodes with;
    the sign trick, the page max and the per-head top-k are those of evaluation/quest_attention.py's `forward`):
    q (qo_len, heads, d), k, v (kv_len, heads, d), NHD, k and v already repeated per query head (`repeat_kv`, as
    quest_attention.py does). Returns the output (qo_len, heads, d) and the pages each head reads (heads, qo_len,
    page_budget), the current one last; None when every page is read. Working precision float64 where Quest's is
    `.float()` (its inputs are half precision)."""
    head_dim = q.size(2)
    qo_len = q.size(0)
    kv_len = k.size(0)
    q = q.transpose(0, 1)
    k = k.transpose(0, 1)
    v = v.transpose(0, 1)

    attn_weights = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(head_dim)
    attn_mask = torch.ones_like(attn_weights, dtype=torch.bool)
    attn_mask = attn_mask.tril(diagonal=kv_len - qo_len)

    cur_num_pages = (kv_len + page_size - 1) // page_size
    pages = None
    if cur_num_pages > page_budget:
        sign = (q > 0) + (~(q > 0)) * -1
        max_key = k * sign
        postive_query = q * sign

        padding_length = page_size - ((kv_len - 1) % page_size + 1)
        max_key = torch.cat(
            [max_key, torch.ones((max_key.shape[0], padding_length, max_key.shape[2]), dtype=max_key.dtype)
             * torch.tensor(torch.finfo(max_key.dtype).min)],
            dim=-2,
        )  # fmt: skip
        page_max_key = max_key.reshape(
            max_key.shape[0], max_key.shape[1] // page_size, page_size, max_key.shape[2]
        ).amax(dim=-2, keepdim=False)

        approx_attn_paged = torch.matmul(postive_query.double(), page_max_key.transpose(1, 2))
        approx_attn_paged = approx_attn_paged[:, :, : cur_num_pages - 1]  # remove the last page
        _, topk = approx_attn_paged.topk(page_budget - 1, dim=-1)
        topk = torch.cat([topk, torch.tensor([cur_num_pages - 1]).repeat(topk.shape[0], topk.shape[1], 1)], dim=-1)
        pages = topk.clone()

        topk = topk.unsqueeze(-1).repeat(1, 1, 1, page_size) * page_size + torch.arange(page_size)
        topk = topk.reshape(topk.shape[0], topk.shape[1], -1)
        topk = topk[:, :, : page_budget * page_size - padding_length]  # remove the padding
        mask_bottom = torch.zeros_like(attn_weights, dtype=torch.bool)
        mask_bottom.scatter_(-1, topk, True)
        attn_weights[~mask_bottom] = torch.tensor(torch.finfo(attn_weights.dtype).min)

    attn_weights[~attn_mask] = torch.tensor(torch.finfo(attn_weights.dtype).min)
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float64).to(q.dtype)
    return torch.matmul(attn_weights, v).transpose(0, 1), pages


def inputs(n: int, *, batch: int = 2, kv_heads: int = KV_HEADS, group: int = GROUP, seed: int = 0):
    """q (b, h, n, 16), k (b, g, n, 16), v (b, g, n, 24) in float64."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * group, n, 16, generator=generator, dtype=torch.float64)
    k = torch.randn(batch, kv_heads, n, 16, generator=generator, dtype=torch.float64)
    v = torch.randn(batch, kv_heads, n, 24, generator=generator, dtype=torch.float64)
    return q, k, v


def pages_read(state: QuestCache, q: Tensor) -> Tensor:
    """(b, h, pages) bool: the pages each query head read at the step just taken (every page when it ranked no more
    than top_k)."""
    t = state.length - 1
    pages = t // state.page + 1
    b, h = q.shape[:2]
    if state.reads_every_page(t):
        return torch.ones(b, h, pages, dtype=torch.bool)
    chosen, _ = state.select(q)  # (b, g, r, s)
    chosen = expand_kv_heads(chosen.flatten(1, 2), h // chosen.flatten(1, 2).shape[1])  # (b, h, s)
    assert bool((chosen.sort(dim=-1).values.diff(dim=-1) > 0).all()), "a page chosen twice"
    return torch.zeros(b, h, pages, dtype=torch.bool).scatter_(-1, chosen, True)


def masked_reference(q: Tensor, k: Tensor, v: Tensor, read: Tensor, page: int) -> Tensor:
    """Exact softmax of the new token q (b, h, 1, d) over exactly the positions of the pages it read, read (b, h, c),
    k, v (b, g, t + 1, d|e): the dense masked reference (b, h, 1, e)."""
    t = k.shape[-2] - 1
    allowed = read[..., torch.arange(t + 1) // page][:, :, None, :]  # (b, h, 1, t + 1)
    group = q.shape[1] // k.shape[1]
    return dense_masked_attention(q, expand_kv_heads(k, group), expand_kv_heads(v, group), allowed)


@pytest.mark.parametrize("n, page, page_budget", [(37, 4, 3), (61, 8, 4), (113, 16, 3), (50, 7, 5), (29, 4, 9)])
def test_a_step_reads_the_pages_quest_reads_per_query_head(n: int, page: int, page_budget: int) -> None:
    """Quest as published: top_k = page_budget - 1 ranked pages and the current one, chosen by each query head
    (2 key/value heads of 3 query heads each), the same pages and outputs as Quest's own code, step after step
    (the prompt no multiple of the page, the steps crossing page boundaries)."""
    steps = 2 * page + 1
    q, k, v = inputs(n + steps)
    variant = registry.create("topk", block_size=page, top_k=page_budget - 1, **PUBLISHED)
    state = variant.prefill_state(q[:, :, :n], k[:, :, :n], v[:, :, :n], room=steps)
    assert isinstance(state, QuestCache)
    sparse_steps = 0
    for t in range(n, n + steps):
        at = slice(t, t + 1)
        out, state = variant.step(state, q[:, :, at], k[:, :, at], v[:, :, at])
        read = pages_read(state, q[:, :, at])
        for x in range(q.shape[0]):
            keys, values = (expand_kv_heads(y[x : x + 1, :, : t + 1], GROUP)[0].transpose(0, 1) for y in (k, v))
            expected, pages = quest_reference(q[x, :, at].transpose(0, 1), keys, values, page, page_budget)
            torch.testing.assert_close(out[x], expected.transpose(0, 1), rtol=0, atol=1e-12)
            if pages is None:
                assert bool(read[x].all()), f"every page read at {t}"
                continue
            sparse_steps += 1
            quest_read = torch.zeros_like(read[x]).scatter_(-1, pages[:, 0, :], True)  # (h, c)
            assert torch.equal(read[x], quest_read), f"pages at {t}"
    assert sparse_steps > 0
    if n == 113:  # the heads of one group disagree somewhere: the selection is per query head, not per group
        assert any(not torch.equal(read[:, i], read[:, i + 1]) for i in range(0, HEADS, GROUP))


@pytest.mark.parametrize("setting", [PUBLISHED, NSA_STYLE, {**PUBLISHED, "keep_first_block": True},
                                     {**NSA_STYLE, "keep_first_block": False}],
                         ids=["published", "nsa-style", "query-head+first-page", "kv-head+no-first-page"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_setting_is_exact_softmax_over_its_chosen_pages(setting: dict[str, Any], dtype: torch.dtype) -> None:
    """Whatever the setting, a step's output is the dense masked reference over exactly the pages it chose; its
    current page is always among them; the first page is read when kept (else only when ranked); under
    select_per="kv-head" a group reads one set of pages."""
    n, steps, page, top_k = 45, 11, 4, 3
    q, k, v = (x.to(dtype) for x in inputs(n + steps, seed=1))
    variant = registry.create("topk", block_size=page, top_k=top_k, **setting)
    state = variant.prefill_state(q[:, :, :n], k[:, :, :n], v[:, :, :n], room=steps)
    first_skipped = False
    for t in range(n, n + steps):
        at = slice(t, t + 1)
        out, state = variant.step(state, q[:, :, at], k[:, :, at], v[:, :, at])
        read = pages_read(state, q[:, :, at])  # (b, h, c)
        expected = masked_reference(q[:, :, at].double(), k[:, :, : t + 1].double(), v[:, :, : t + 1].double(),
                                    read, page)  # fmt: skip
        torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-5)
        assert bool(read[..., t // page].all()), "the current page"
        assert int(read[0, 0].sum()) == top_k + 1 + int(setting["keep_first_block"])
        if setting["keep_first_block"]:
            assert bool(read[..., 0].all())
        first_skipped |= not bool(read[..., 0].all())
        if setting["select_per"] == "kv-head":
            assert torch.equal(read, expand_kv_heads(read[:, ::GROUP], GROUP))
    assert first_skipped != setting["keep_first_block"], "Quest forces no first page"


def test_the_nsa_style_rule_ranks_by_the_groups_mean_bound() -> None:
    """keep_first_block=True, select_per="kv-head" (the decode before 2026-11-28): the first page, the current one,
    and the top_k of the others by the mean over the group's query heads of Quest's bound."""
    n, page, top_k = 53, 4, 3
    q, k, v = inputs(n + 1, seed=2)
    variant = registry.create("topk", block_size=page, top_k=top_k, **NSA_STYLE)
    state = variant.prefill_state(q[:, :, :n], k[:, :, :n], v[:, :, :n], room=1)
    out, state = variant.step(state, q[:, :, n:], k[:, :, n:], v[:, :, n:])
    keys = k[:, :, : n // page * page].unflatten(2, (n // page, page))  # (b, g, c, j, d): the full pages
    high, low = keys.amax(dim=-2), keys.amin(dim=-2)  # (b, g, c, d)
    query = q[:, :, n].unflatten(1, (KV_HEADS, GROUP))[:, :, :, None, :]  # (b, g, r, 1, d)
    bound = torch.maximum(query * high[:, :, None], query * low[:, :, None]).sum(-1).mean(dim=2)  # (b, g, c)
    top = bound[..., 1:].topk(top_k, dim=-1).indices + 1  # the first page is kept, not ranked
    expected = torch.zeros(*bound.shape[:2], n // page + 1, dtype=torch.bool).scatter_(-1, top, True)
    expected[..., 0] = expected[..., n // page] = True
    read = pages_read(state, q[:, :, n:])
    assert torch.equal(read, expand_kv_heads(expected, GROUP))
    torch.testing.assert_close(out, masked_reference(q[:, :, n:], k, v, read, page), rtol=0, atol=1e-12)


@pytest.mark.parametrize("keep_first", [False, True])
def test_per_query_head_steps_are_the_causal_forwards_rows_under_grouped_heads(keep_first: bool) -> None:
    """select_per="query-head" ranks as the forward does (per query head, k and v repeated): a step is the causal
    forward's last row with grouped-query attention too (`decode_equals_forward`); the group's mean does not."""
    n, steps = 50, 30
    q, k, v = inputs(n + steps, seed=5)
    forward = None
    for select_per in ("query-head", "kv-head"):
        variant = registry.create("topk", block_size=8, top_k=3, score="minmax", keep_first_block=keep_first,
                                  select_per=select_per)  # fmt: skip
        if forward is None:
            forward = variant(q, expand_kv_heads(k, GROUP), expand_kv_heads(v, GROUP), causal=True)[:, :, n:]
        state = variant.prefill_state(q[:, :, :n], k[:, :, :n], v[:, :, :n], room=steps)
        outs = []
        for t in range(n, n + steps):
            out, state = variant.step(state, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
            outs.append(out)
        error = float((torch.cat(outs, dim=-2) - forward).abs().max())
        assert (error < 1e-12) == (select_per == "query-head"), (select_per, error)


@pytest.mark.parametrize("setting", [PUBLISHED, NSA_STYLE], ids=["published", "nsa-style"])
def test_read_bytes_count_the_metadata_and_each_choosers_pages(setting: dict[str, Any]) -> None:
    """What the next step reads: 2 d values of metadata per ranked page of each key/value head, and the keys and
    values of its chosen pages with its own page's held part, per query head when each chooses (what its gather
    reads), per key/value head when the group shares one choice; every held position while all pages are read."""
    n, steps, page, top_k = 30, 12, 4, 2
    q, k, v = inputs(n + steps, batch=1, seed=3)
    variant = registry.create("topk", block_size=page, top_k=top_k, **setting)
    state = variant.prefill_state(q[:, :, :n], k[:, :, :n], v[:, :, :n], room=steps)
    choosers = GROUP if setting["select_per"] == "query-head" else 1
    keep_first = int(setting["keep_first_block"])
    row = (16 + 24) * 8
    for t in range(n, n + steps):
        ranked = t // page - keep_first
        if ranked <= top_k:
            assert state.read_bytes == KV_HEADS * t * row
        else:
            rows = (top_k + keep_first) * page + t % page
            assert state.read_bytes == KV_HEADS * (choosers * rows * row + ranked * 2 * 16 * 8)
        _, state = variant.step(state, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])


class OperatorCount(TorchDispatchMode):
    """Counts the aten operators run."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def test_a_step_is_a_few_operators_whatever_the_heads() -> None:
    """Per-query-head selection without a loop over heads: a step dispatches the same operators for 1 or 8 key/value
    heads of 1 or 4 query heads each (~50 with views and copies: the ~20 of a profile's top level, as the NSA-style
    step before it)."""
    counts = set()
    for kv_heads, group in ((1, 1), (8, 4)):
        q, k, v = inputs(301, batch=1, kv_heads=kv_heads, group=group, seed=4)
        variant = registry.create("topk", block_size=16, top_k=4, **PUBLISHED)
        state = variant.prefill_state(q[:, :, :300], k[:, :, :300], v[:, :, :300], room=1)
        with OperatorCount() as ops:
            variant.step(state, q[:, :, 300:], k[:, :, 300:], v[:, :, 300:])
        counts.add(ops.count)
    assert len(counts) == 1 and counts.pop() <= 80
