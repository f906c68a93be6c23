"""The budget rule inside the model (`attnbench.generation.kept`), on random post-rotary q/k/v without the model:
under kvpress's rule every KV method's cache grows by exactly the tokens that follow the context (question, answer)
and its outputs are exact attention over what it kept plus those tokens; under fixed-total a window and H2O stay at
their size; the batched step of several rows equals each row's step alone."""

from __future__ import annotations

import pytest
import torch
from attnbench.generation.kept import BUDGET_RULES, attend_appended, batched
from attnbench.generation.layers import ExactPrompt, Method, MethodRows
from attnbench.ops import KVCache, attention_and_masses, attention_mass, softmax_step
from attnbench.registry import registry

H, G, D, N, LAYERS = 6, 2, 16, 203, 2  # 3 query heads per key/value head; N not a multiple of any block
FOLLOW = 7  # the question's tokens, then single answer tokens
KV_METHODS = [("full", {}), ("band", {"sinks": 4, "window": 45}), ("h2o", {"budget": 50}), ("snapkv", {"budget": 50})]


def exact_prompt(seed: int = 0) -> ExactPrompt:
    generator = torch.Generator().manual_seed(seed)
    exact = ExactPrompt(with_masses=True)
    for _ in range(LAYERS):
        q, k, v = (torch.randn(1, heads, N, D, generator=generator) for heads in (H, G, G))
        exact.attend(q, k, v, causal=True, padding=None, cross=False)
    return exact


def rows_for(rule: str, methods=KV_METHODS) -> MethodRows:
    rows = MethodRows([Method(registry.create(name, **params)) for name, params in methods], room=FOLLOW + 4, rule=rule)
    rows.from_exact(exact_prompt())
    return rows


def tokens(t: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, t, D, generator=generator) for heads in (H, G, G))  # type: ignore[return-value]


def forward(rows: MethodRows, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
    rows.layer = 0
    return [rows.attend(q, k, v, causal=True, padding=None, cross=False) for _ in range(LAYERS)]


def test_kvpress_rule_every_cache_grows_by_what_follows_and_attends_to_it() -> None:
    rows = rows_for("kvpress")
    kept = [[rows.states[layer][row].kept() for row in range(len(KV_METHODS))] for layer in range(LAYERS)]
    before = [rows.row_bytes(row)[0] for row in range(len(KV_METHODS))]
    question = tokens(FOLLOW, len(KV_METHODS), 1)
    outs = forward(rows, *question)
    answer = [tokens(1, len(KV_METHODS), 2 + i) for i in range(3)]
    steps = [forward(rows, *one) for one in answer]
    per_token = LAYERS * G * 2 * D * 4  # keys and values of every layer, float32
    for row, (name, _) in enumerate(KV_METHODS):
        assert rows.row_bytes(row)[0] - before[row] == (FOLLOW + 3) * per_token, name
        for layer in range(LAYERS):
            k0, v0 = kept[layer][row]
            reference = KVCache.of(k0, v0, room=FOLLOW + 3)
            q, k, v = (x[row : row + 1] for x in question)
            for t in range(FOLLOW):  # the question, token by token against what was kept and the tokens before it
                reference.append(k[:, :, t : t + 1], v[:, :, t : t + 1])
                expected = softmax_step(q[:, :, t : t + 1], reference.k, reference.v)
                torch.testing.assert_close(outs[layer][row : row + 1, :, t : t + 1], expected, atol=1e-5, rtol=1e-5)
            for one, out in zip(answer, steps):
                q, k, v = (x[row : row + 1] for x in one)
                reference.append(k, v)
                torch.testing.assert_close(out[layer][row : row + 1], softmax_step(q, reference.k, reference.v),
                                           atol=1e-5, rtol=1e-5)  # fmt: skip
    held = [rows.row_bytes(row)[0] for row in range(len(KV_METHODS))]
    assert held[2] == held[3] == held[1] < held[0]  # at one size after the prompt, one size after: 50 kept each


def test_fixed_total_keeps_a_window_and_h2o_at_their_size() -> None:
    """(H2O's ring has a slot for the newest token, filled by the first step: it holds its budget and that token.)"""
    rows = rows_for("fixed-total")
    forward(rows, *tokens(1, len(KV_METHODS), 1))
    before = [rows.row_bytes(row)[0] for row in range(len(KV_METHODS))]
    forward(rows, *tokens(FOLLOW, len(KV_METHODS), 2))
    after = [rows.row_bytes(row)[0] for row in range(len(KV_METHODS))]
    grown = {name: after[row] - before[row] for row, (name, _) in enumerate(KV_METHODS)}
    assert grown["band"] == 0 and grown["h2o"] == 0
    assert grown["full"] == grown["snapkv"] == FOLLOW * LAYERS * G * 2 * D * 4


def test_rows_that_kept_as_many_positions_step_as_one_batch() -> None:
    rows = rows_for("kvpress")
    forward(rows, *tokens(1, len(KV_METHODS), 1))
    sizes = sorted(len(member.rows) for member in rows.members[0])
    assert sizes == [1, 3] and all(member.batched for member in rows.members[0])  # full; band, h2o, snapkv (50 each)


def test_the_batched_step_equals_each_rows_step_alone() -> None:
    generator = torch.Generator().manual_seed(3)
    parts = [tuple(torch.randn(1, G, 40, D, generator=generator) for _ in range(2)) for _ in range(3)]
    states = [KVCache.of(k, v) for k, v in parts]
    together = batched(states, room=9)
    q, k, v = tokens(5, 3, 4)
    out = attend_appended(together, q, k, v)
    for row, (k0, v0) in enumerate(parts):
        alone = KVCache.of(k0, v0, room=9)
        torch.testing.assert_close(out[row : row + 1], attend_appended(alone, *(x[row : row + 1] for x in (q, k, v))))


@pytest.mark.parametrize("shape", [(9, 3, 300), (4, 4, 37), (6, 2, 513)])
def test_masses_from_the_fused_kernels_log_sum_exp_equal_the_softmax_weights_sums(shape) -> None:
    """The exact prefill's outputs are SDPA's own (the exact model's answers do not move) and H2O's masses equal
    the sums of the softmax weights."""
    heads, kv_heads, n = shape
    generator = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, h, n, 16, generator=generator) for h in (heads, kv_heads, kv_heads))
    out, mass = attention_and_masses(q, k, v, chunk=64)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                     enable_gqa=True), atol=0, rtol=0)  # fmt: skip
    torch.testing.assert_close(mass, attention_mass(q, k, v, chunk=64)[1], atol=1e-5, rtol=1e-5)


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="budget rule must be one of kvpress, fixed-total"):
        MethodRows([], room=0, rule="kvpres")
    assert BUDGET_RULES == ("kvpress", "fixed-total")


@pytest.mark.parametrize("rule", BUDGET_RULES)
def test_a_row_that_finished_leaves_the_batch_and_the_others_step_as_before(rule: str) -> None:
    """`retain`: rows whose answer ended take no more steps; the rest get exactly what they got in the whole batch."""
    methods = KV_METHODS + [("topk", {"block_size": 8, "top_k": 2, "score": "minmax"})]
    whole, part = rows_for(rule, methods), rows_for(rule, methods)
    question = tokens(FOLLOW, len(methods), 1)
    forward(whole, *question), forward(part, *question)
    kept = [0, 2, 4]  # full, h2o, topk stay; band and snapkv ended (one of a batched cache, one alone)
    part.retain(kept)
    for seed in range(3):
        one = tokens(1, len(methods), 5 + seed)
        expected = forward(whole, *one)
        got = forward(part, *(x[kept] for x in one))
        for layer in range(LAYERS):
            torch.testing.assert_close(got[layer], expected[layer][kept])
    with pytest.raises(KeyError, match="its answer ended"):
        part.row_bytes(1)


def test_a_reply_looping_on_one_token_is_cut() -> None:
    from attnbench.generation.decoder import LOOP, looping

    assert looping([7] * LOOP) and looping([1, 2] + [0] * LOOP)
    assert not looping([7] * (LOOP - 1)) and not looping([1, 2] * LOOP) and not looping([3] * (LOOP - 1) + [4])


@pytest.mark.parametrize("rule", BUDGET_RULES)
def test_quest_at_several_budgets_steps_as_one_stacked_cache_equal_to_each_alone(rule: str) -> None:
    """Quest's rows of one grid (one rule, several top_k) step as one stacked cache: the question as one chunk, then
    single tokens, then with a row dropped (`retain`); each row gets what it gets in a batch of its own."""
    quest = [("topk", {"block_size": 8, "top_k": top_k, "score": "minmax", "keep_first_block": False,
                       "select_per": "query-head"}) for top_k in (1, 4, 2)]  # fmt: skip
    methods = [KV_METHODS[0], *quest]
    together = rows_for(rule, methods)
    alone = [rows_for(rule, [method]) for method in quest]
    question = tokens(FOLLOW, len(methods), 1)
    outs = forward(together, *question)
    assert [member.rows for member in together.members[0] if not member.batched] == [[1, 2, 3]]
    for row, single in enumerate(alone, 1):
        expected = forward(single, *(x[row : row + 1] for x in question))
        for layer in range(LAYERS):
            torch.testing.assert_close(outs[layer][row : row + 1], expected[layer], atol=1e-5, rtol=1e-5)
    for seed in range(4):
        if seed == 2:
            together.retain([0, 1, 3])  # the row at top_k=4 ended
        live = [0, 1, 2, 3] if seed < 2 else [0, 1, 3]
        one = tokens(1, len(methods), 5 + seed)
        got = forward(together, *(x[live] for x in one))
        for place, row in enumerate(live):
            if row == 0:
                continue
            expected = forward(alone[row - 1], *(x[row : row + 1] for x in one))
            for layer in range(LAYERS):
                torch.testing.assert_close(got[layer][place : place + 1], expected[layer], atol=1e-5, rtol=1e-5)
    for row in (1, 3):
        assert together.row_bytes(row) == alone[row - 1].row_bytes(0)
