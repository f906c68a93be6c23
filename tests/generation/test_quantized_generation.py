"""A method composed with KIVI's quantized cache inside the model (`quantize` on a grid's method): the grid reads it
and refuses what cannot compose, the row keeps its key when it does not quantize, and at the first call after the
prompt the method's kept positions become a quantized cache (rows of one quantization and kept shape stacked into
one) whose steps are exact attention over what it dequantizes, counted at its codes', scales', zero points' and
residual's bytes. A marked `model` test compares `full + kivi-4` on SmolLM2-135M with transformers' own quantized
cache (optimum-quanto)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from attnbench.generation.decoder import InModelDecoder
from attnbench.generation.grid import Unit, parse_grid, row_key
from attnbench.generation.layers import ExactPrompt, Method, MethodRows
from attnbench.generation.step_timing import time_rows
from attnbench.generation.unit import exact_index, setting_row
from attnbench.ops import KVCache
from attnbench.plan.config import ConfigError
from attnbench.registry import registry
from attnbench.runfolder.generations import COLUMNS, TEXT_COLUMNS
from attnbench.variants.quantized import QuantizedCache

HEADS, KV_HEADS, PROMPT, STEPS, D = 6, 2, 400, 5, 64
BUDGET = 300  # kept by SnapKV: more than KIVI's residual of 128, so most of it is quantized
BASE = {"name": "q", "tasks": ["passkey"], "seq_lens": [1024], "samples": 2, "keep": [0.25]}


def grid(methods: list, **keys) -> object:
    return parse_grid({**BASE, "methods": methods, **keys})


def test_a_grid_composes_a_method_with_kivi() -> None:
    parsed = grid([{"name": "snapkv", "quantize": "kivi-2"}, "snapkv", {"name": "full", "quantize": "kivi-4"}])
    labels = [m.label() for m in parsed.methods]
    assert labels == ["full", "snapkv + kivi-2", "snapkv", "full + kivi-4"]
    assert [m.quantize for m in parsed.methods] == ["none", "kivi-2", "none", "kivi-4"]
    settings = parsed.settings(1000)
    assert [s.label() for s in settings] == ["full", "snapkv + kivi-2 @ 0.25", "snapkv @ 0.25", "full + kivi-4"]
    assert exact_index(settings) == 0  # full + kivi-4 is the pure quantization row, not the exact model


def test_kivi_itself_meets_the_exact_prompt_as_a_kv_cache_method_does() -> None:
    (_, kivi) = grid(["kivi"]).methods
    assert kivi.prefill == "dense" and kivi.label() == "kivi" and not kivi.swept  # run once, whatever the share


def test_row_keys_change_only_for_rows_that_quantize() -> None:
    parsed = grid(["snapkv", {"name": "snapkv", "quantize": "kivi-2"}])
    unit = parsed.units()[0]
    plain, quantized = (s for s in parsed.settings(1000) if s.method.variant.name == "snapkv")
    assert row_key(unit, 0, plain) == json.dumps([unit.task, unit.seq_len, unit.protocol, 0, "snapkv", {}, "dense", 0,
                                                  "own", 0.25])  # the key rows had before `quantize` existed
    assert json.loads(row_key(unit, 0, quantized))[-1] == {"quantize": "kivi-2"}


def test_generations_csv_has_a_quantize_column() -> None:
    parsed = grid([{"name": "snapkv", "quantize": "kivi-2"}])
    unit = Unit("passkey", 1024, "question-agnostic", (0,))
    rows = [setting_row(unit, 0, setting) for setting in parsed.settings(1000)]
    assert [row.quantize for row in rows] == ["", "kivi-2"]
    assert "quantize" in COLUMNS and "quantize" in TEXT_COLUMNS


@pytest.mark.parametrize("method, rule, says", [
    ({"name": "snapkv", "quantize": "kivi-3"}, "kvpress", "quantize must be one of none, kivi-4, kivi-2"),
    ({"name": "h2o", "quantize": "kivi-2"}, "fixed-total", "under the fixed-total rule it evicts as it steps"),
    ({"name": "band", "sinks": 4, "quantize": "kivi-4"}, "fixed-total", "budget_rule = \"kvpress\""),
    ({"name": "topk", "quantize": "kivi-2"}, "kvpress", "not a set of kept positions"),
    ({"name": "gla", "quantize": "kivi-2"}, "kvpress", "not a set of kept positions"),
    ({"name": "snapkv", "heads": "adaptive", "quantize": "kivi-2"}, "kvpress", "a ragged cache"),
])  # fmt: skip
def test_the_grid_refuses_what_cannot_be_quantized(method: dict, rule: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        grid([method], budget_rule=rule)


def test_what_kvpress_freezes_composes_and_a_press_under_either_rule() -> None:
    """Under kvpress's rule a window and H2O are frozen to what they kept when the context ends; a press only appends
    under either rule."""
    frozen = grid([{"name": "h2o", "quantize": "kivi-4"}, {"name": "band", "sinks": 4, "quantize": "kivi-2"}])
    assert [m.label() for m in frozen.methods[1:]] == ["h2o + kivi-4", "band(sinks=4) + kivi-2"]
    fixed = grid([{"name": "snapkv", "quantize": "kivi-2"}], budget_rule="fixed-total")
    assert fixed.methods[1].quantize == "kivi-2"


def tokens(seed: int, n: int = PROMPT + STEPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (1, h, n, d), k, v (1, g, n, d): one prompt for every seed (rows share it), their own steps."""
    prompt, steps = torch.Generator().manual_seed(0), torch.Generator().manual_seed(seed + 1)
    return tuple(torch.cat([torch.randn(1, heads, PROMPT, D, generator=prompt), torch.randn(1, heads, n - PROMPT, D,
                                                                                           generator=steps)], -2)
                 for heads in (HEADS, KV_HEADS, KV_HEADS))  # type: ignore[return-value]  # fmt: skip


def drive(rows: MethodRows, qkv: list[tuple]) -> torch.Tensor:
    """One layer as the model drives it: the exact prompt, the first token, then the rest at once -> (rows, h, STEPS,
    d)."""
    q, k, v = (torch.cat(parts) for parts in zip(*qkv))
    exact = ExactPrompt()
    exact.attend(q[:1, :, :PROMPT], k[:1, :, :PROMPT], v[:1, :, :PROMPT], causal=True, padding=None, cross=False)
    rows.from_exact(exact)
    outs = []
    for span in (slice(PROMPT, PROMPT + 1), slice(PROMPT + 1, None)):
        rows.layer = 0
        outs.append(rows.attend(q[:, :, span], k[:, :, span], v[:, :, span], causal=True, padding=None, cross=False))
    return torch.cat(outs, dim=-2)


def methods() -> list[Method]:
    snapkv = registry.create("snapkv", budget=BUDGET, window=8)
    return [Method(registry.create("full")), Method(snapkv), Method(snapkv, quantize="kivi-2"),
            Method(registry.create("h2o", budget=BUDGET), quantize="kivi-2"), Method(registry.create("full"), quantize="kivi-4")]


def test_snapkv_with_kivi_attends_over_snapkvs_kept_positions_quantized() -> None:
    """The quantized row holds SnapKV's kept positions (its residual exactly, the rest within half a step) and steps
    as a QuantizedCache of them would; SnapKV and H2O at one budget stack into one cache; `full + kivi-4` quantizes
    the whole prompt."""
    rows = MethodRows(methods(), room=STEPS)
    qkv = [tokens(seed) for seed in (0, 1, 1, 3, 4)]  # SnapKV's rows take the same tokens
    outs = drive(rows, qkv)
    plain, _ = rows.row_states(0, 1)
    stacked, index = rows.row_states(0, 2)
    assert isinstance(plain, KVCache) and isinstance(stacked, QuantizedCache) and index == 0
    h2o, index = rows.row_states(0, 3)
    assert h2o is stacked and index == 1  # H2O's kept positions (its budget's shape) in the same cache
    keys, values = stacked.select_rows([0]).dequantized()
    assert keys.shape == plain.k.shape and stacked.keys > 0 and stacked.values > 0
    assert torch.equal(keys[..., stacked.keys :, :], plain.k[..., stacked.keys :, :])  # residual: SnapKV's own keys
    key_scales, _, _, value_scales = stacked.filled()[1:5]
    assert (keys - plain.k).abs().max() <= key_scales.max() / 2 * 1.001
    assert (values - plain.v).abs().max() <= value_scales.max() / 2 * 1.001
    whole, _ = rows.row_states(0, 4)
    assert isinstance(whole, QuantizedCache) and whole.length == PROMPT + STEPS
    # standalone: SnapKV's cache after the prompt, quantized, stepped the same way
    snapkv = methods()[1].variant
    q, k, v = qkv[2]
    kept = snapkv.prefill_state(q[:, :, :PROMPT], k[:, :, :PROMPT], v[:, :, :PROMPT])
    alone = QuantizedCache.of(*kept.kept(), 2, 32, 128)
    expected = torch.cat([alone.attend(*(x[:, :, PROMPT : PROMPT + 1] for x in (q, k, v))),
                          alone.attend(*(x[:, :, PROMPT + 1 :] for x in (q, k, v)))], dim=-2)  # fmt: skip
    assert (outs[2] - expected).abs().max() < 1e-5


def test_snapkv_with_kivi_2_holds_about_2_16ths_of_snapkvs_bytes() -> None:
    """In float32 (the model's dtype here) kivi-2's codes are 2/32 of the cache and its scales and zero points 2/32
    (two a group of 32): about 2/16 of SnapKV's bytes, plus the full-precision residual (the keys' last kept mod 128,
    the values' last 128)."""
    rows = MethodRows(methods()[:3], room=STEPS)
    drive(rows, [tokens(seed) for seed in range(3)])
    plain, quantized = rows.row_bytes(1)[0], rows.row_bytes(2)[0]
    state, _ = rows.row_states(0, 2)
    n = BUDGET + STEPS
    keys_residual, values_residual = n - state.keys, n - state.values
    share = (2 / 32 + 2 / 32) + (keys_residual + values_residual) / (2 * n) * (1 - 4 / 32)
    assert quantized / plain == pytest.approx(share, rel=1e-6)
    assert rows.row_bytes(2)[1] == quantized  # a step reads what it holds


def test_quantized_rows_retire_and_are_timed_like_any_other() -> None:
    """Each row's step is timed alone (a row of a stacked quantized cache on its own copy); a row dropped from the
    stack leaves the others theirs."""
    rows = MethodRows(methods(), room=STEPS)
    drive(rows, [tokens(seed) for seed in range(5)])
    before = rows.row_bytes(3)
    timed = time_rows(rows, 0, 1, (HEADS, KV_HEADS, D, D), rounds=2)
    assert len(timed) == 5 and all(t.step_s > 0 for t in timed) and rows.row_bytes(3) == before
    rows.retain([0, 1, 3, 4])
    assert rows.row_bytes(3) == before and rows.row_states(0, 3)[1] == 0


def test_a_state_that_cannot_be_quantized_is_refused_when_it_is_sorted() -> None:
    """Under fixed-total H2O evicts as it steps: the grid refuses it first, and the layer says so if it gets there."""
    rows = MethodRows([Method(registry.create("h2o", budget=BUDGET), quantize="kivi-2")], room=STEPS, rule="fixed-total")
    with pytest.raises(ValueError, match="cannot be quantized"):
        drive(rows, [tokens(0)])


# ---- against transformers' quantized cache on the real model --------------------------------------------------


@pytest.mark.model
@pytest.mark.slow
def test_full_with_kivi_4_against_transformers_quantized_cache(model_dir: Path) -> None:
    """`full + kivi-4` on SmolLM2-135M against transformers' QuantizedCache with the quanto backend at the same bits,
    group (32) and residual (128), keys per channel (axis_key=-1) and values per token (axis_value=0) as KIVI: the
    same greedy answer, and next-token logits closer to each other than either is to the exact model's. They differ
    in details: transformers quantizes the whole prompt at once (no residual until the first step) and re-quantizes
    everything each time its residual fills, quanto rounds its own way; KIVI keeps the prompt's last n mod 128 keys
    and last 128 values in full precision. Measured (576 tokens, 8 greedy tokens): the same tokens; logits within
    0.14-0.55 of transformers' (max |difference| per step, of logits up to ~37), each 0.5-1.8 from the exact ones."""
    pytest.importorskip("optimum.quanto", reason="optimum-quanto (transformers' quanto backend) is not installed")
    from attnbench.generation.tasks import build_samples
    from attnbench.generation.unit import encoder, loaded
    from attnbench.model.study import load_model
    from transformers.cache_utils import QuantizedCache as TransformersQuantizedCache

    torch.set_num_threads(2)
    _, tokenizer, decoder = loaded(str(model_dir))
    (sample,) = build_samples("passkey", 600, 1, encoder(tokenizer), seed=4, indices=range(0, 1))
    text = sample.context + sample.question
    prompt = torch.tensor(text[-(len(text) // 32 * 32) :])  # quanto groups whole runs of 32 tokens per channel
    reference, _ = load_model(model_dir)
    cache = TransformersQuantizedCache("quanto", reference.config, nbits=4, axis_key=-1, axis_value=0, q_group_size=32,
                                       residual_length=128)  # fmt: skip
    with torch.no_grad():
        theirs = reference.generate(prompt[None], max_new_tokens=8, do_sample=False, output_logits=True,
                                    return_dict_in_generate=True, pad_token_id=tokenizer.eos_token_id,
                                    cache=cache)  # fmt: skip
    exact, ours = InModelDecoder(decoder.model, stop_ids=set()).run(
        [Method(registry.create("full")), Method(registry.create("full"), quantize="kivi-4")], prompt, new_tokens=8,
        keep_logits=True,
    )
    assert ours.tokens == theirs.sequences[0, len(prompt) :].tolist()
    apart = [(mine - their[0].float()).abs().max().item() for mine, their in zip(ours.logits, theirs.logits)]
    off = [(their[0].float() - full).abs().max().item() for their, full in zip(theirs.logits, exact.logits)]
    assert apart[0] < 1e-2  # the prompt's own logits: exact attention in both
    assert sum(apart[1:]) < 0.5 * sum(off[1:])
