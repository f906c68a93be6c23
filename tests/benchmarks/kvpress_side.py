"""kvpress's side of the overlap check (`kvpress_overlap.py`): run by it inside a venv holding kvpress (which pins
transformers < 5.3, hence a venv of its own), never imported by attnbench.

    <kvpress venv>/bin/python tests/benchmarks/kvpress_side.py JOB.json OUT.pt

JOB.json (written by kvpress_overlap.py): the model folder, the prompt's token ids (and the question's, for a
question-aware press), the compression ratios and the cases, each a kvpress press built from its class name and
keyword arguments, wrapped by wrapper presses (AdaKVPress, ...). For each prompt setting it records every layer's
post-rotary q, k, v as kvpress's presses see them (the keys and values of the cache; the queries recomputed from the
layer's input as kvpress's window scorers do); then for each case and ratio it prefills the prompt under the press, as
kvpress's pipeline does (`with press(model): model.model(input_ids=ids, past_key_values=cache)`), and reads what it
kept: the keys left in each layer's cache, matched to the prompt's keys (presses that drop positions), less the
positions it masks (`module.masked_key_indices`: AdaKV, KVzip, DuoAttention), or the key channels it zeroes (ThinK).
What a press would download or draw unseeded is fixed to read the prompt as ours does (`as_ours`).

OUT.pt: {"versions", "settings": {name: {"q", "k", "v": [per layer (1, h|g, n, d)], "question": int}},
"kept": {case: {ratio: [per layer [per key/value head: the kept positions or channels, sorted (s,)]]}},
"errors": {case: message}, "seconds": {case: seconds for all its ratios}}.

b - batch (1), h - query heads, g - key/value heads, n - prompt positions, d - head dim, s - kept
"""

from __future__ import annotations

import copy
import json
import logging
import sys
import time
import traceback
from contextlib import ExitStack
from importlib.metadata import version
from types import SimpleNamespace
from typing import Any, Callable
from unittest.mock import patch

import torch
from torch import Tensor, nn

FINCH_DELIMITER = "<|finch_sep|>"  # FinchPress.update_model_and_tokenizer's default


def post_rotary_queries(module: nn.Module, hidden_states: Tensor, position_embeddings: tuple[Tensor, Tensor]) -> Tensor:
    """(1, h, n, d): the layer's queries with the rotary embedding applied, as kvpress's SnapKVPress computes its
    window's (`compute_window_attention`), over every position."""
    from kvpress.utils import get_prerope_query_states
    from transformers.models.llama.modeling_llama import rotate_half

    q = get_prerope_query_states(module, hidden_states)
    cos, sin = (x.unsqueeze(1) for x in position_embeddings)
    return q * cos + rotate_half(q) * sin


def attention_modules(model: nn.Module) -> list[nn.Module]:
    return [layer.self_attn for layer in model.model.layers]


def capture(model: nn.Module, ids: Tensor) -> dict[str, list[Tensor]]:
    """Every layer's post-rotary q (1, h, n, d) and its cache's k, v (1, g, n, d) after an uncompressed prefill."""
    from transformers import DynamicCache

    queries: dict[int, Tensor] = {}

    def hook(module: nn.Module, args: Any, kwargs: dict, output: Any) -> None:
        queries[module.layer_idx] = post_rotary_queries(module, kwargs["hidden_states"], kwargs["position_embeddings"])

    modules = attention_modules(model)
    hooks = [module.register_forward_hook(hook, with_kwargs=True) for module in modules]
    cache = DynamicCache()
    try:
        model.model(input_ids=ids, past_key_values=cache)  # the decoder: no logits needed
    finally:
        for handle in hooks:
            handle.remove()
    return {
        "q": [queries[i] for i in range(len(modules))],
        "k": [cache.layers[i].keys.clone() for i in range(len(modules))],
        "v": [cache.layers[i].values.clone() for i in range(len(modules))],
    }


def build_press(case: dict, ratio: float) -> Any:
    """The case's press at `ratio`: its class with its keyword arguments (the ratio under `ratio_field`), then each
    wrapper press around it."""
    import kvpress

    press = getattr(kvpress, case["press"])(**case["kwargs"], **{case["ratio_field"]: ratio})
    for wrapper, kwargs in case["wrappers"]:
        press = getattr(kvpress, wrapper)(press=press, **kwargs)
    return press


def rows_matched(kept: Tensor, keys: Tensor) -> Tensor:
    """The positions (s,) in keys (n, d) of the rows kept (s, d): the cache's rows are copies (a gather) of the
    prompt's, so they are matched by their bytes."""
    where = {row.tobytes(): j for j, row in enumerate(keys.numpy())}
    positions = [where.get(row.tobytes(), -1) for row in kept.numpy()]
    if -1 in positions:
        raise ValueError(
            f"{positions.count(-1)} of the {len(positions)} keys left in the cache are not among the prompt's keys "
            "(did the press change them, e.g. re-rotate them? run it with rerotate_keys=False)"
        )
    return torch.tensor(positions)


def kept_positions(cache_keys: Tensor, prompt_keys: Tensor, masked: Any) -> list[Tensor]:
    """Per key/value head, the sorted positions of the prompt the layer keeps: the keys left in its cache (1, g, s, d)
    matched to the prompt's (1, g, n, d), less those kvpress masks (`masked_key_indices`: batch, head and cache slot of
    each masked key)."""
    heads = []
    for head in range(cache_keys.shape[1]):
        positions = rows_matched(cache_keys[0, head], prompt_keys[0, head])
        if masked is not None:
            batch, head_of, slot = (x.cpu() for x in masked)
            dropped = torch.zeros(len(positions), dtype=torch.bool)
            dropped[slot[(batch == 0) & (head_of == head)]] = True
            positions = positions[~dropped]
        heads.append(positions.sort().values.to(torch.int32))
    return heads


def kept_channels(cache_keys: Tensor) -> list[Tensor]:
    """Per key/value head, the key channels the press leaves (ThinK zeroes the others at every position)."""
    zeroed = (cache_keys[0] == 0).all(dim=-2)  # (g, d)
    return [(~row).nonzero()[:, 0].to(torch.int32) for row in zeroed]


class OneText:
    """Stands for the BookSum split DuoAttentionPress's on-the-fly scoring loads (`load_dataset(...).to_pandas()`):
    one text, the prompt, whatever the sample size asked (the scores are then 1/50 of a 50-sample mean's scale: the
    same ranking)."""

    def to_pandas(self) -> "OneText":
        return self

    def sample(self, count: int, random_state: int | None = None) -> dict[str, Any]:
        import pandas

        return {"chapter": pandas.Series(["the prompt"])}


class PromptTokenizer:
    """Stands for the tokenizer DuoAttentionPress's on-the-fly scoring loads: every text it encodes is the prompt's
    ids, exactly."""

    def __init__(self, ids: Tensor) -> None:
        self.ids = ids

    def __call__(self, text: str, return_tensors: str = "pt") -> Any:
        from transformers import BatchEncoding

        return BatchEncoding({"input_ids": self.ids, "attention_mask": torch.ones_like(self.ids)})


def seeded(draw: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`draw` with torch's global generator seeded 0 before each call: the draw ours makes from its seed 0."""

    def call(*args: Any, **kwargs: Any) -> Tensor:
        torch.manual_seed(0)
        return draw(*args, **kwargs)

    return call


def as_ours(case: dict, tokenizer: Any, ids: Tensor) -> ExitStack:
    """What a press would download, read of a chat template or draw unseeded, fixed so that it reads this prompt as
    ours does: DuoAttentionPress's on-the-fly head scores from the prompt (kvpress: 50 BookSum samples, downloaded);
    KVzipPress without the chat template (ours repeats plain text: the prompt here is not wrapped in one);
    CompactorPress's Gaussian sketch drawn from seed 0 in each layer, as ours (kvpress: the global generator, unseeded,
    so that its own choice changes from run to run)."""
    stack = ExitStack()
    if case["press"] == "CompactorPress":
        from kvpress.presses.leverage_press import LeverageScorePress

        draw = seeded(LeverageScorePress.compute_leverage_scores)
        stack.enter_context(patch.object(LeverageScorePress, "compute_leverage_scores", staticmethod(draw)))
    if case["press"] == "DuoAttentionPress":
        from kvpress.presses import duo_attention_press

        stack.enter_context(patch.object(duo_attention_press, "load_dataset", lambda *a, **k: OneText()))
        loader = SimpleNamespace(from_pretrained=lambda *a, **k: PromptTokenizer(ids))
        stack.enter_context(patch.object(duo_attention_press, "AutoTokenizer", loader))
        duo_attention_press.cache.clear()  # its head scores, cached by the model's name
    if case["press"] == "KVzipPress" or any(wrapper == "KVzipPress" for wrapper, _ in case["wrappers"]):
        from kvpress.presses import kvzip_press

        plain = copy.copy(tokenizer)
        plain.chat_template = None
        stack.enter_context(patch.object(kvzip_press.AutoTokenizer, "from_pretrained", lambda *a, **k: plain))
    return stack


def run_case(model: nn.Module, tokenizer: Any, case: dict, ratio: float, ids: Tensor, prompt: dict) -> list:
    """One press at one ratio over the prompt, as kvpress's pipeline prefills a context: what each layer kept."""
    from transformers import DynamicCache

    press = build_press(case, ratio)
    if case["press"] == "FinchPress":  # its question follows a delimiter token, which its embedding hook removes
        press.update_model_and_tokenizer(model, tokenizer, FINCH_DELIMITER)
        question = prompt["question"]
        ids = torch.cat([ids[:, :-question], torch.tensor([[press.delimiter_token_id]]), ids[:, -question:]], dim=1)
    modules = attention_modules(model)
    for module in modules:
        module.masked_key_indices = None
    cache = DynamicCache()
    with as_ours(case, tokenizer, ids), press(model):
        model.model(input_ids=ids, past_key_values=cache)
    layers = []
    for index, module in enumerate(modules):
        keys = cache.layers[index].keys
        if case["kind"] == "channels":
            layers.append(kept_channels(keys))
        else:
            layers.append(kept_positions(keys, prompt["k"][index], getattr(module, "masked_key_indices", None)))
    return layers


def main(job_path: str, out_path: str) -> int:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logging.getLogger("kvpress").setLevel(logging.ERROR)  # KVzipPress warns of its cost at every construction
    job = json.loads(open(job_path).read())
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(job["model_dir"], local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        job["model_dir"], local_files_only=True, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    out: dict[str, Any] = {
        "versions": {"kvpress": version("kvpress"), "transformers": transformers.__version__,
                     "torch": torch.__version__},
        "settings": {}, "kept": {}, "errors": {}, "seconds": {},
    }  # fmt: skip
    with torch.no_grad():
        for name, setting in job["settings"].items():
            model.set_attn_implementation(setting["attention"])
            ids = torch.tensor([setting["ids"]])
            out["settings"][name] = {**capture(model, ids), "question": setting["question"]}
        for case in job["cases"]:
            setting = job["settings"][case["setting"]]
            model.set_attn_implementation(setting["attention"])
            ids, prompt = torch.tensor([setting["ids"]]), out["settings"][case["setting"]]
            started = time.perf_counter()
            try:
                out["kept"][case["label"]] = {
                    str(ratio): run_case(model, tokenizer, case, ratio, ids, prompt) for ratio in job["ratios"]
                }
            except Exception as error:  # one press failing (kvpress's own assertion, a missing download) is reported
                out["errors"][case["label"]] = f"{type(error).__name__}: {error}"
                traceback.print_exc()
            out["seconds"][case["label"]] = time.perf_counter() - started
            print(f"kvpress {case['label']}: {out['seconds'][case['label']]:.1f} s", file=sys.stderr, flush=True)
    torch.save(out, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
