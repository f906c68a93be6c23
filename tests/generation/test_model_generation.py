"""Generation inside the real decoder (SmolLM2-135M, marked `model`): with `full` it is transformers' own greedy
`generate`, token for token and logits within float tolerance; every method's in-model attention is what the method
computes standalone on the same post-rotary q/k/v (its key/value heads as the model has them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attnbench.generation.decoder import InModelDecoder
from attnbench.generation.kept import BUDGET_RULES, appends_after_prompt
from attnbench.generation.layers import ExactPrompt, Method, MethodRows, layer_state, layer_step
from attnbench.ops import KVCache, softmax_step
from attnbench.generation.tasks import build_samples
from attnbench.generation.unit import encoder, loaded
from attnbench.model.study import load_model
from attnbench.registry import registry

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def smollm(model_dir: Path):
    torch.set_num_threads(2)
    model, tokenizer, decoder = loaded(str(model_dir))
    (sample,) = build_samples("passkey", 600, 1, encoder(tokenizer), seed=4, indices=range(0, 1))
    return model, tokenizer, decoder, torch.tensor(sample.context + sample.question)


def test_full_is_transformers_generate_token_for_token(model_dir: Path, smollm) -> None:
    _, tokenizer, decoder, prompt = smollm
    reference, _ = load_model(model_dir)  # its own SDPA attention and KV cache
    with torch.no_grad():
        out = reference.generate(prompt[None], max_new_tokens=8, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=tokenizer.eos_token_id)  # fmt: skip
    expected = out.sequences[0, len(prompt) :].tolist()
    (result,) = InModelDecoder(decoder.model, stop_ids=set()).run([Method(registry.create("full"))], prompt,
                                                                  new_tokens=8, keep_logits=True)  # fmt: skip
    assert result.tokens == expected
    for ours, theirs in zip(result.logits, out.logits):
        assert (ours - theirs[0].float()).abs().max() < 2e-3 * theirs.abs().max()


@pytest.mark.parametrize("rule", BUDGET_RULES)
def test_teacher_forcing_in_one_pass_equals_one_token_at_a_time(model_dir: Path, smollm, rule: str) -> None:
    """The forced tokens of a continuation go through in one forward pass (they are known): each method's per-token
    losses equal those of stepping one token at a time (a window and H2O evicting as they go under fixed-total); the
    exact model's equal transformers' own forward over the whole text."""
    _, _, decoder, prompt = smollm
    context, forced = prompt[:-10], prompt[-10:]
    methods = [Method(registry.create(name, **params)) for name, params in METHODS if name != "deltanet"]
    results = decoder.run([Method(registry.create("full")), *methods], context, forced=forced, rule=rule)
    for row, method in enumerate([None, *methods]):
        rows = MethodRows([Method(registry.create("full")) if method is None else method], room=len(forced), rule=rule)
        exact = ExactPrompt()
        logits = decoder.forward(exact, context[None], 0)
        rows.from_exact(exact)
        losses = []
        for index, token in enumerate(forced):
            losses.append(torch.nn.functional.cross_entropy(logits, token[None]).item())
            logits = decoder.forward(rows, token[None, None], len(context) + index)
        assert results[row].nll == pytest.approx(losses, rel=1e-4, abs=1e-4), (method and method.label, rule)
    reference, _ = load_model(model_dir)
    with torch.no_grad():
        whole = reference(prompt[None]).logits[0, len(context) - 1 : -1].float()
    expected = torch.nn.functional.cross_entropy(whole, forced, reduction="none").tolist()
    assert results[0].nll == pytest.approx(expected, rel=2e-3, abs=2e-3)


def test_the_question_after_the_prompt_equals_the_question_in_it(smollm) -> None:
    """Exact attention: the question stepped through after the prompt (question-agnostic) or inside it (aware) gives
    the same answer, so the protocols differ only by what a method compresses."""
    _, _, decoder, prompt = smollm
    full = [Method(registry.create("full"))]
    context, question = prompt[:-12], prompt[-12:]
    (after,) = decoder.run(full, context, follow=question, new_tokens=6, keep_logits=True)
    (inside,) = decoder.run(full, prompt, new_tokens=6, keep_logits=True)
    assert after.tokens == inside.tokens
    assert (after.logits[0] - inside.logits[0]).abs().max() < 1e-3 * inside.logits[0].abs().max()


METHODS = [("h2o", {"budget": 96}), ("snapkv", {"budget": 96}), ("band", {"window": 64, "sinks": 4}),
           ("topk", {"block_size": 16, "top_k": 3, "score": "minmax"}), ("deltanet", {})]  # fmt: skip


@pytest.mark.parametrize("rule", BUDGET_RULES)
def test_in_model_steps_equal_each_methods_standalone_steps(smollm, monkeypatch: pytest.MonkeyPatch, rule: str) -> None:
    """Every method in one batch; at layers 3 and 20 the q/k/v the model hands the router and the outputs it gets back
    are recorded; each method's standalone state (from the same prompt) and steps on those q/k/v give those outputs:
    under fixed-total its own steps; under kvpress's rule, once the prompt ends, exact attention over the positions it
    kept and every later token (a state that keeps no positions, Quest's pages or an RNN, its own steps)."""
    _, _, decoder, prompt = smollm
    methods = [Method(registry.create(name, **params), "own" if name == "deltanet" else "dense") for name, params in METHODS]
    watched, seen = (3, 20), {}
    original = MethodRows.attend

    def recording(self, query, key, value, **options):
        layer = self.layer
        out = original(self, query, key, value, **options)
        if layer in watched:
            seen.setdefault(layer, []).append((query, key, value, out))
        return out

    monkeypatch.setattr(MethodRows, "attend", recording)
    decoder.run(methods, prompt, new_tokens=5, rule=rule)
    for layer in watched:
        calls = seen[layer]  # the own-prefill rows' prompt, then the steps (every row), in order
        steps = [c for c in calls if c[0].shape[0] == len(methods)]
        prompts = [c for c in calls if c[0].shape[-2] == len(prompt)]
        for row, method in enumerate(methods):
            if method.prefill == "own":
                q, k, v, _ = prompts[0]
                state = layer_state(method.variant, *(x[:1] for x in (q, k, v)), room=8)
            else:  # the exact prompt's q/k/v: the first row of the first step's layer input came after it
                continue_from = decoder_prompt_qkv(decoder, prompt, layer)
                state = layer_state(method.variant, *continue_from, room=8)
            frozen = appends_after_prompt(state, rule)
            kept = KVCache.of(*state.kept(), room=8) if frozen else None  # type: ignore[misc]
            if rule == "kvpress":
                state.close_context()
            for q, k, v, out in steps:
                one = tuple(x[row : row + 1] for x in (q, k, v))
                if kept is not None:
                    kept.append(*one[1:])
                    got = softmax_step(one[0], kept.k, kept.v)
                else:
                    got, state = layer_step(method.variant, state, *one)
                assert (got - out[row : row + 1]).abs().max() < 1e-4, (method.label, layer, rule)
            assert frozen == (method.variant.name != "deltanet" and (rule == "kvpress" or method.variant.name not in ("band", "h2o")) and method.variant.name != "topk")


def decoder_prompt_qkv(decoder: InModelDecoder, prompt: torch.Tensor, layer: int):
    """The exact prompt's post-rotary q, k, v at one layer (the exact model's forward over the prompt)."""
    from attnbench.generation.layers import ExactPrompt

    exact = ExactPrompt()
    decoder.forward(exact, prompt[None], 0)
    return exact.layers[layer]


def test_an_answer_stops_at_its_first_newline_unless_the_grid_says_end_of_text(smollm) -> None:
    _, tokenizer, decoder, prompt = smollm
    newline = tokenizer.encode("\n", add_special_tokens=False)[0]
    full = [Method(registry.create("full"))]
    (lines,) = decoder.run(full, prompt, new_tokens=24)
    (whole,) = decoder.run(full, prompt, new_tokens=24, stop_lines=False)
    assert newline not in lines.tokens and whole.tokens[: len(lines.tokens)] == lines.tokens
    assert len(whole.tokens) >= len(lines.tokens)
