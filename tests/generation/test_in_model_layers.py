"""The in-model routing of generation, without a model: a batch whose rows each run a method, driven as the model
drives it (a prompt, then tokens), gives each row exactly what the method gives standalone on the same q/k/v; every
registered variant that can generate causally on the CPU is covered (a decode form, or a sparse prefill followed by
exact decoding)."""

from __future__ import annotations

import pytest
import torch
from attnbench.generation.kept import BUDGET_RULES, appends_after_prompt
from attnbench.generation.layers import ExactPrompt, Method, MethodRows, layer_prefill, layer_step
from attnbench.generation.step_timing import time_rows
from attnbench.interface import expand_kv_heads
from attnbench.ops import KVCache, dense_masked_attention, softmax_step
from attnbench.registry import registry

HEADS, KV_HEADS, PROMPT, STEPS, D = 6, 2, 70, 5, 16
SMALL = {"band": {"window": 12, "sinks": 2}, "h2o": {"budget": 24}, "snapkv": {"budget": 24, "window": 6},
         "topk": {"block_size": 8, "top_k": 2, "score": "minmax"}, "strided": {"stride": 8}, "bigbird": {"block_size": 8},
         "lsh": {"bucket_size": 8}, "linformer": {"k": 16}}  # fmt: skip


def generating() -> list[str]:
    """Every registered variant that can run causally on the CPU in float32 (through its decode form or not)."""
    names = []
    for name in registry.names():
        try:
            variant = registry.create(name, **SMALL.get(name, {}))
        except Exception:
            continue
        options = dict(device="cpu", dtype="float32", causal=True, padded=False, n_q=PROMPT, n_k=PROMPT)
        if variant.unsupported_reason(**options, decode=variant.decodes()) is None:
            names.append(name)
    return names


def tokens(seed: int):
    """q (1, h, prompt + steps, d), k, v (1, g, ., d): one prompt for every seed (rows share it), their own steps."""
    prompt, steps = torch.Generator().manual_seed(0), torch.Generator().manual_seed(seed + 1)
    q, k, v = (torch.cat([torch.randn(1, heads, PROMPT, D, generator=prompt), torch.randn(1, heads, STEPS, D, generator=steps)], -2)
               for heads in (HEADS, KV_HEADS, KV_HEADS))  # fmt: skip
    return q, k, v


def drive(rows: MethodRows, qkv: list[tuple], *, from_exact: bool) -> list[torch.Tensor]:
    """One layer driven as the model does: the prompt (or its exact record), the first token, then the rest at once.
    qkv: per row (q, k, v). Returns each row's outputs over the steps (1, h, STEPS, d)."""
    q, k, v = (torch.cat(parts) for parts in zip(*qkv))
    if from_exact:  # the rows share one prompt, recorded once (batch 1)
        exact = ExactPrompt()
        exact.attend(q[:1, :, :PROMPT], k[:1, :, :PROMPT], v[:1, :, :PROMPT], causal=True, padding=None, cross=False)
        rows.from_exact(exact)
    else:
        rows.layer = 0
        rows.attend(q[:, :, :PROMPT], k[:, :, :PROMPT], v[:, :, :PROMPT], causal=True, padding=None, cross=False)
    rows.layer = 0
    first = rows.attend(*(x[:, :, PROMPT : PROMPT + 1] for x in (q, k, v)), causal=True, padding=None, cross=False)
    rows.layer = 0
    rest = rows.attend(*(x[:, :, PROMPT + 1 :] for x in (q, k, v)), causal=True, padding=None, cross=False)
    return list(torch.cat([first, rest], dim=-2).split(1))


def standalone(variant, q, k, v, *, from_exact: bool, rule: str = "fixed-total") -> torch.Tensor:
    """The method alone on the same q/k/v: its prefill (or its state from the prompt), then one step per token; under
    kvpress's rule a state of kept positions becomes exact attention over them and every later token, and one that
    selects (Quest) ranks the context's pages alone."""
    prompt = (x[:, :, :PROMPT] for x in (q, k, v))
    if from_exact and variant.decodes():
        group = HEADS // KV_HEADS
        kk, vv = (k, v) if variant.supports.grouped_kv else (expand_kv_heads(k, group), expand_kv_heads(v, group))
        state = variant.prefill_state(q[:, :, :PROMPT], kk[:, :, :PROMPT], vv[:, :, :PROMPT], room=STEPS)
    else:
        _, state = layer_prefill(variant, *prompt, STEPS)
    kept = KVCache.of(*state.kept(), room=STEPS) if appends_after_prompt(state, rule) else None  # type: ignore[misc]
    if rule == "kvpress":
        state.close_context()
    outs = []
    for t in range(PROMPT, PROMPT + STEPS):
        one = (q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
        if kept is not None:
            kept.append(*(expand_kv_heads(x, kept.keys.shape[1] // KV_HEADS) for x in one[1:]))
            out = softmax_step(one[0], kept.k, kept.v)
        else:
            out, state = layer_step(variant, state, *one)
        outs.append(out)
    return torch.cat(outs, dim=-2)


def ways_to_meet_the_prompt() -> list[tuple[str, bool]]:
    """(variant, from the exact prompt?): a variant with a decode form both ways, one without it by its own prefill
    only (the grid refuses it with an exact prompt: it would be exact decoding)."""
    return [(name, exact) for name in generating() for exact in (True, False)
            if not exact or registry.load(name).decodes()]  # fmt: skip


@pytest.mark.parametrize("rule", BUDGET_RULES)
@pytest.mark.parametrize("name, from_exact", ways_to_meet_the_prompt(),
                         ids=[f"{n}-{'exact-prompt' if e else 'own-prefill'}" for n, e in ways_to_meet_the_prompt()])
def test_each_row_gets_what_its_method_gives_alone(name: str, from_exact: bool, rule: str) -> None:
    variant = registry.create(name, **SMALL.get(name, {}))
    methods = [Method(registry.create("full")), Method(variant, "dense" if from_exact else "own")]
    qkv = [tokens(0), tokens(1)]
    rows = drive(MethodRows(methods, room=STEPS, rule=rule), qkv, from_exact=from_exact)
    expected = [standalone(m.variant, *x, from_exact=True, rule=rule) for m, x in zip(methods, qkv)]
    for got, want in zip(rows, expected):
        assert (got - want).abs().max() < 1e-5


def test_the_exact_row_is_exact_causal_attention_with_grouped_heads() -> None:
    q, k, v = tokens(2)
    (out,) = drive(MethodRows([Method(registry.create("full"))], room=STEPS), [(q, k, v)], from_exact=True)
    full_k, full_v = expand_kv_heads(k, HEADS // KV_HEADS), expand_kv_heads(v, HEADS // KV_HEADS)
    n = PROMPT + STEPS
    expected = dense_masked_attention(q, full_k, full_v, torch.ones(n, n, dtype=torch.bool).tril())
    assert (out - expected[:, :, PROMPT:]).abs().max() < 1e-5


def test_a_dense_first_layer_stays_exact() -> None:
    """dense_layers = 1: layer 0 is exact decoding whatever the method; layer 1 is the method's."""
    method = Method(registry.create("h2o", budget=8), dense_layers=1)
    rows = MethodRows([method], room=STEPS)
    assert rows.variant_at(0, 0) is None and rows.variant_at(0, 1) is method.variant


@pytest.mark.parametrize("name", [n for n in generating() if not registry.load(n).decodes()])
def test_a_method_without_a_decode_form_is_its_prefill_then_the_whole_cache(name: str) -> None:
    """A sparse prefill's state is the whole cache: exact decoding after it."""
    variant = registry.create(name, **SMALL.get(name, {}))
    assert not variant.decodes()
    q, k, v = tokens(3)
    out, state = layer_prefill(variant, q[:, :, :PROMPT], k[:, :, :PROMPT], v[:, :, :PROMPT], STEPS)
    assert state.k.shape == (1, KV_HEADS, PROMPT, D)  # the whole prompt, per key/value head
    expected = variant(q[:, :, :PROMPT], expand_kv_heads(k[:, :, :PROMPT], 3), expand_kv_heads(v[:, :, :PROMPT], 3), causal=True)
    assert (out - expected).abs().max() < 1e-6


def test_each_rows_step_is_timed_alone_in_turns_with_the_exact_one() -> None:
    """After generation every row's layer step is timed (a fresh copy each round, the states left as they were):
    the exact row's ratio to itself is 1, a window over a fifth of the cache is cheaper per token."""
    rows = MethodRows([Method(registry.create("full")), Method(registry.create("band", window=4)),
                       Method(registry.create("topk", block_size=8, top_k=1, score="minmax"))],
                      room=STEPS + 20)  # fmt: skip
    drive(rows, [tokens(4), tokens(5), tokens(6)], from_exact=True)
    held = [rows.row_bytes(row) for row in range(3)]
    times = time_rows(rows, exact_row=0, layers=1, shapes=(HEADS, KV_HEADS, D, D), rounds=6)
    assert [rows.row_bytes(row) for row in range(3)] == held  # timing stepped copies
    assert times[0].ratio == times[0].low == times[0].high == 1.0
    assert all(t.step_s > 0 and t.attention_s > 0 and t.low <= t.ratio <= t.high for t in times)
    assert all(t.attention_s == t.step_s for t in times)  # one layer, none kept dense


def test_a_sparse_prefill_with_exact_decoding() -> None:
    """decode = "exact": the variant's own (sparse) forward over the prompt — MoBA's topk, not its Quest decode form —
    then exact steps against every key; the grid names it and does not sweep its knob."""
    from attnbench.generation.grid import parse_grid

    variant = registry.create("topk", block_size=8, top_k=1)
    q, k, v = tokens(6)
    (steps,) = drive(MethodRows([Method(variant, "own", decode="exact")], room=STEPS), [(q, k, v)], from_exact=False)
    full_k, full_v = expand_kv_heads(k, HEADS // KV_HEADS), expand_kv_heads(v, HEADS // KV_HEADS)
    n = PROMPT + STEPS
    expected = dense_masked_attention(q, full_k, full_v, torch.ones(n, n, dtype=torch.bool).tril())
    assert (steps - expected[:, :, PROMPT:]).abs().max() < 1e-5
    grid = parse_grid({"name": "g", "tasks": ["passkey"], "seq_lens": [256], "keep": [0.5, 0.25],
                       "methods": [{"name": "topk", "prefill": "own", "decode": "exact"}]})  # fmt: skip
    assert [s.label() for s in grid.settings(256)] == ["full", "topk [own prefill, exact decoding]"]
