"""Every routed architecture generates through attnbench's layers as transformers generates by itself: tiny random
Llama, Mistral (a window in every layer), Qwen2 (sliding layers), Qwen3 (QK-norm) and Gemma3 (five sliding layers for each global one, QK-norm, its own
query scale) configs, grouped-query ratios 1, 3, 4 and 8, head dims 64, 128 and 256. `full` = transformers `generate`
token for token (float64, so a near-tie cannot flip a greedy choice), its logits to 1e-6 (the decoder hands them back in float32); a sliding layer keeps its
window in every row (never a method's), and a method goes there only with hybrid_layers = "all"."""

from __future__ import annotations

import pytest
import torch

from attnbench.generation.decoder import InModelDecoder
from attnbench.generation.layers import ExactPrompt, Method, MethodRows
from attnbench.registry import registry

VOCAB, PROMPT, NEW = 97, 45, 12
WINDOW = 8  # transformers' sliding_window: a query sees 8 keys, its own included (the prompt is longer)


def tiny(kind: str) -> torch.nn.Module:
    """A random model of the architecture `kind` (float64)."""
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, num_hidden_layers=4, max_position_embeddings=256, tie_word_embeddings=False)
    if kind == "llama":  # grouped 3:1, head dim 64
        config = tf.LlamaConfig(hidden_size=96, intermediate_size=64, num_attention_heads=6, num_key_value_heads=2,
                                head_dim=64, **common)  # fmt: skip
    elif kind == "llama-mha":  # no grouping, head dim 128
        config = tf.LlamaConfig(hidden_size=64, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                                head_dim=128, **common)  # fmt: skip
    elif kind == "qwen2":  # grouped 4:1, the upper layers sliding
        config = tf.Qwen2Config(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=1,
                                head_dim=64, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2,
                                **common)  # fmt: skip
    elif kind == "mistral":  # a window in every layer, grouped 2:1
        config = tf.MistralConfig(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=64, sliding_window=WINDOW, **common)  # fmt: skip
    elif kind == "qwen3":  # grouped 8:1, QK-norm, head dim 128
        config = tf.Qwen3Config(hidden_size=64, intermediate_size=64, num_attention_heads=8, num_key_value_heads=1,
                                head_dim=128, **common)  # fmt: skip
    elif kind == "gemma3":  # Gemma 3's layout: sliding layers around a global one, QK-norm, head dim 256
        config = tf.Gemma3TextConfig(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=1,
                                     head_dim=256, query_pre_attn_scalar=64, sliding_window=WINDOW,
                                     layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                  "sliding_attention"], **common)  # fmt: skip
    else:
        raise ValueError(kind)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").double().eval()
    with torch.no_grad():  # sharper attention than the default init, so the window matters to the answer
        for name, weight in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                weight.mul_(4.0)
    return model


def sliding_layers(model: torch.nn.Module) -> list[int]:
    return [i for i, kind in enumerate(getattr(model.config, "layer_types", None) or []) if kind == "sliding_attention"]


KINDS = ["llama", "llama-mha", "mistral", "qwen2", "qwen3", "gemma3"]


@pytest.mark.parametrize("kind", KINDS)
def test_full_is_transformers_generate_token_for_token(kind: str) -> None:
    model = tiny(kind)
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = model.generate(prompt[None], max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
        reference = model(theirs).logits[0, PROMPT - 1 : -1]  # (NEW, v): the logits before each generated token
    decoder = InModelDecoder(model, stop_ids=set())
    (ours,) = decoder.run([Method(registry.create("full"))], prompt, new_tokens=NEW, keep_logits=True)
    assert ours.tokens == theirs[0, PROMPT:].tolist()
    assert (torch.stack(ours.logits) - reference).abs().max() < 1e-6


@pytest.mark.parametrize("kind", ["qwen2", "gemma3"])
def test_a_sliding_layer_keeps_its_window_and_a_method_goes_there_only_when_asked(kind: str) -> None:
    model = tiny(kind)
    sliding = sliding_layers(model)
    assert sliding and len(sliding) < model.config.num_hidden_layers
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(2))
    decoder = InModelDecoder(model, stop_ids=set())
    snap = registry.create("snapkv", budget=16, window=4)
    methods = [Method(registry.create("full")), Method(snap), Method(snap, layers="all")]
    seen: dict[str, MethodRows] = {}
    results = decoder.run(methods, prompt, follow=prompt[:3], new_tokens=4,
                          after_question=lambda rows, order: seen.setdefault("rows", rows))  # fmt: skip
    rows = seen["rows"]
    for layer in range(model.config.num_hidden_layers):
        exact, global_only, everywhere = (rows.row_states(layer, row)[0] for row in range(3))
        if layer in sliding:  # the model's own window, the same in the exact row and the method's
            assert type(exact).__name__ == type(global_only).__name__ == "WindowState"
            assert exact.held_bytes == global_only.held_bytes
            assert exact.kept()[0].shape[-2] == WINDOW  # its last WINDOW positions (the query's own among them)
            assert type(everywhere).__name__ != "WindowState"  # "all": the method's kept positions instead
        else:
            assert type(global_only).__name__ != "WindowState"
    # bytes are of what the model holds: the exact row's windows counted, the method's share of that
    assert results[1].cache_bytes < results[0].cache_bytes
    exact = ExactPrompt()
    decoder.forward(exact, prompt[None], 0)
    assert [w is not None for w in exact.windows] == [i in sliding for i in range(model.config.num_hidden_layers)]
    assert results[0].cache_bytes == exact.cache_bytes


def test_the_window_is_what_the_model_sees() -> None:
    """Without the window (every layer global) the answer's logits differ: the test above is not vacuous."""
    model = tiny("gemma3")
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        windowed = model(prompt[None]).logits[0, -1]
        model.config.sliding_window = 10**6
        for layer in model.model.layers:
            if layer.self_attn.sliding_window is not None:
                layer.self_attn.sliding_window = 10**6
        unwindowed = model(prompt[None]).logits[0, -1]
    assert (windowed - unwindowed).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["gemma3", "qwen3"])
def test_what_the_layers_are_handed_is_what_attention_sees(kind: str) -> None:
    """The q/k/v the router records (post QK-norm, post-rotary with each layer's own rope base, the model's query
    scale folded into q) give each layer's attention output by exact attention at the default 1/sqrt(d) scale: the
    layer's window where it has one, causal everywhere else."""
    import torch.nn.functional as F

    from attnbench.interface import expand_kv_heads

    model = tiny(kind)
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(4))
    outputs: list[torch.Tensor] = []
    hooks = [layer.self_attn.o_proj.register_forward_pre_hook(lambda module, args: outputs.append(args[0]))
             for layer in model.model.layers]  # fmt: skip
    exact = ExactPrompt()
    InModelDecoder(model, stop_ids=set()).forward(exact, prompt[None], 0)
    for hook in hooks:
        hook.remove()
    for layer, ((q, k, v), window) in enumerate(zip(exact.layers, exact.windows)):
        group = q.shape[1] // k.shape[1]
        i, j = torch.arange(PROMPT)[:, None], torch.arange(PROMPT)[None, :]
        allowed = (j <= i) & ((i - j <= window) if window is not None else True)
        again = F.scaled_dot_product_attention(q, expand_kv_heads(k, group), expand_kv_heads(v, group), attn_mask=allowed)
        expected = outputs[layer].view(1, PROMPT, q.shape[1], -1).transpose(1, 2)
        torch.testing.assert_close(again, expected, rtol=1e-9, atol=1e-9)
    assert any(w is not None for w in exact.windows) == (kind == "gemma3")


@pytest.mark.gemma
@pytest.mark.slow
def test_the_real_gemma_answers_as_transformers_generate(gemma_dir) -> None:
    """Gemma-3-270M (15 sliding layers of 512, 3 global) through attnbench's layers: transformers `generate`'s greedy
    tokens after a prompt longer than the window, and a method leaves the sliding layers' windows as they were."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gemma_dir)
    model = AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    text = "The pass key is 71432. Remember it. " + "The grass is green. The sky is blue. " * 80
    prompt = tokenizer(text + "What is the pass key? The pass key is", return_tensors="pt").input_ids[0]
    assert len(prompt) > model.config.sliding_window
    with torch.no_grad():
        theirs = model.generate(prompt[None], max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()
    decoder = InModelDecoder(model, stop_ids=set(), end_ids={tokenizer.eos_token_id})
    full, snap = decoder.run([Method(registry.create("full")), Method(registry.create("snapkv", budget=256))], prompt,
                             new_tokens=8)  # fmt: skip
    assert full.tokens == theirs[: len(full.tokens)] and len(full.tokens) >= min(len(theirs), 4)
    assert "71432" in tokenizer.decode(full.tokens)
    windows = 15 * 2 * 512 * 256 * 4  # 15 sliding layers: their last 512 keys and values (1 key/value head)
    assert full.cache_bytes == windows + 3 * 2 * len(prompt) * 256 * 4
    assert snap.cache_bytes == windows + 3 * 2 * 256 * 256 * 4


def test_layers_is_read_from_a_table_or_the_flag_and_said_in_the_label(tmp_path) -> None:
    from attnbench.generation.grid import read_grid

    grid = tmp_path / "g.toml"
    grid.write_text('tasks = ["passkey"]\nseq_lens = [256]\nkeep = [0.5]\n[[methods]]\nname = "full"\n'
                    '[[methods]]\nname = "snapkv"\nhybrid_layers = "all"\n[[methods]]\nname = "h2o"\n')  # fmt: skip
    labels = {s.method.label(): s.method.layers for s in read_grid(str(grid)).settings(256)}
    assert labels["snapkv [every layer]"] == "all" and labels["h2o"] == "global"
    everywhere = read_grid(str(grid), hybrid_layers="all")
    assert {s.method.layers for s in everywhere.settings(256) if s.method.variant.name != "full"} == {"all"}
    assert [s.method.layers for s in everywhere.settings(256) if s.method.variant.name == "full"] == ["global"]
    with pytest.raises(ValueError, match="hybrid_layers must be one of 'global', 'all'"):
        read_grid(str(grid), hybrid_layers="sliding")
    grid.write_text('tasks = ["passkey"]\nseq_lens = [256]\nkeep = [0.5]\n[[methods]]\nname = "full"\nhybrid_layers = "all"\n')
    with pytest.raises(ValueError, match="full keeps the model's own sliding windows"):
        read_grid(str(grid))
    # the key is not a press's `layers` (PyramidKV's "pyramid"): both are read, each for itself
    grid.write_text('tasks = ["passkey"]\nseq_lens = [256]\nkeep = [0.5]\n[[methods]]\nname = "pyramidkv"\n'
                    'hybrid_layers = "all"\n[[methods]]\nname = "snapkv"\nlayers = "pyramid"\n')  # fmt: skip
    placed = {s.method.label(): (s.method.layers, dict(s.method.variant.params).get("layers"))
              for s in read_grid(str(grid)).settings(256)}
    assert placed["pyramidkv [every layer]"] == ("all", "pyramid") and placed["snapkv(layers=pyramid)"][0] == "global"
    grid.write_text('tasks = ["passkey"]\nseq_lens = [256]\nkeep = [0.5]\n[[methods]]\nname = "full"\n'
                    '[[methods]]\nname = "full"\nquantize = "kivi-4"\n')  # fmt: skip
    assert {s.method.label() for s in read_grid(str(grid), hybrid_layers="all").settings(256)} == {
        "full", "full + kivi-4 [every layer]"}


def test_each_layer_is_turned_back_by_its_own_rotary_embedding() -> None:
    """Gemma 3 rotates its global layers at base 1e6 and its sliding ones at 1e4: the rotary a method reads of a layer
    (ExpectedAttention, Compactor, DuoAttention un-rotate the prompt's queries) turns that layer's recorded queries back
    into its q_norm(q_proj(x)), the query scale taken out."""
    from attnbench.generation.context import rotary_of
    from attnbench.variants.rotary import prompt_unrotated

    model = tiny("gemma3")
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(5))
    inputs: list[torch.Tensor] = []
    hooks = [layer.self_attn.register_forward_pre_hook(lambda m, args, kwargs: inputs.append(kwargs["hidden_states"]),
                                                       with_kwargs=True) for layer in model.model.layers]  # fmt: skip
    exact = ExactPrompt()
    InModelDecoder(model, stop_ids=set()).forward(exact, prompt[None], 0)
    for hook in hooks:
        hook.remove()
    scale = model.config.query_pre_attn_scalar**-0.5 / model.config.head_dim**-0.5  # folded into the recorded q
    bases = set()
    for layer, attention in enumerate(model.model.layers):
        attention = attention.self_attn
        with torch.no_grad():
            q_pre = attention.q_norm(attention.q_proj(inputs[layer]).unflatten(-1, (-1, model.config.head_dim)))
        rotary = rotary_of(model, layer)
        torch.testing.assert_close(prompt_unrotated(exact.layers[layer][0] / scale, rotary), q_pre.transpose(1, 2))
        bases.add(float(rotary(torch.tensor([1]))[1][0, 1]))  # sin(1 * base^(-2/d)): differs by base
    assert len(bases) == 2


@pytest.mark.parametrize("kind", ["gemma3", "qwen2"])
def test_a_study_s_exact_routing_is_the_model_and_a_swap_leaves_the_windows(kind: str) -> None:
    """`attnbench model`'s routing: the exact one gives the model's own logits (its windows kept), and a variant
    swapped in everywhere goes into the global layers alone."""
    from attnbench.model import attention as hf_attention

    model = tiny(kind)
    ids = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        own = model(ids).logits
    hf_attention.register()
    model.set_attn_implementation(hf_attention.IMPLEMENTATION)
    try:
        for everywhere in (None, registry.create("band", window=2)):
            hf_attention.ACTIVE = hf_attention.Routing(everywhere=everywhere)
            with torch.no_grad():
                routed = model(ids).logits
            if everywhere is None:
                torch.testing.assert_close(routed, own, rtol=1e-9, atol=1e-9)
            else:  # the swap changes the global layers' outputs only: the sliding layers' match the exact routing's
                swapped = hf_attention.ACTIVE.outputs
                hf_attention.ACTIVE = hf_attention.Routing()
                with torch.no_grad():
                    model(ids)
                for layer in sliding_layers(model)[:1]:  # the first sliding layer, before any global one differs
                    if layer < min(set(range(model.config.num_hidden_layers)) - set(sliding_layers(model))):
                        torch.testing.assert_close(swapped[layer], hf_attention.ACTIVE.outputs[layer])
                assert (routed - own).abs().max() > 1e-6
    finally:
        hf_attention.ACTIVE = hf_attention.Routing()


def test_a_hybrid_model_s_steps_are_timed_at_a_global_layer_and_its_windows_counted() -> None:
    """The attention cost per token times a global layer (a sliding one runs the model's window in every row) and
    counts the window step in each sliding layer a row leaves alone."""
    from attnbench.generation.step_timing import time_rows, timed_layer

    assert timed_layer([8, 8, None, 8], dense=2) == 2 and timed_layer([8, None, 8, 8], dense=0) == 1
    assert timed_layer([None] * 4, dense=0) == 2 and timed_layer([8, 8, 8, None, 8, 8], dense=4) == 3
    model = tiny("gemma3").float()  # the timed steps' inputs are float32
    prompt = torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(7))
    snap = registry.create("snapkv", budget=8, window=4)
    methods = [Method(registry.create("full")), Method(snap), Method(snap, layers="all")]
    seen: dict[str, MethodRows] = {}
    InModelDecoder(model, stop_ids=set()).run(methods, prompt, follow=prompt[:2], new_tokens=2,
                                              after_question=lambda rows, order: seen.setdefault("rows", rows))  # fmt: skip
    config = model.config
    times = time_rows(seen["rows"], exact_row=0, layers=config.num_hidden_layers,
                      shapes=(config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.head_dim),
                      rounds=4)  # fmt: skip
    assert times[0].ratio == 1.0
    # the row in the global layer alone: three window steps and one of its own; in every layer: four of its own
    assert times[1].attention_s != times[2].attention_s and all(t.attention_s > 0 for t in times)
