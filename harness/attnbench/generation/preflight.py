"""What a generation grid needs of the model, checked before any folder is written or any weight loaded: a causal
LM's config, a tokenizer that encodes the tasks' text, positions for the longest prompt and what follows it, and the
memory the largest N holds (against the limit `attnbench run` uses). Every problem listed at once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from attnbench.generation.grid import JSONL, GenerationGrid
from attnbench.generation.tasks import TaskError, build_samples, jsonl_samples, probe_text, read_jsonl
from attnbench.generation.unit import encoder
from attnbench.model.known import KNOWN_MODELS, known_for_folder
from attnbench.model.layer_kinds import layer_windows, settings, unrouted_reason

# where `make model` writes SmolLM2-135M; $ATTNBENCH_MODEL_DIR points elsewhere
DEFAULT_MODEL = Path(os.environ.get("ATTNBENCH_MODEL_DIR") or KNOWN_MODELS[0].folder)
FLOAT32 = 4
SLACK = 1.5  # what the tally misses: temporaries, the allocator's fragmentation


class PreflightError(ValueError):
    """The model or the grid cannot run here; the message lists every problem."""


def grid_model_dir(grid: GenerationGrid) -> Path:
    """The folder of the model a grid names (`model`, a known name or a folder), else `DEFAULT_MODEL`;
    PreflightError for a name that is neither."""
    from attnbench.model.known import UnknownModel, model_folder

    try:
        return model_folder(grid.model) if grid.model else DEFAULT_MODEL
    except UnknownModel as error:
        raise PreflightError(str(error)) from None


def model_limits(model_dir: Path) -> dict[str, Any]:
    """config.json's sizes, or PreflightError naming what is missing."""
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        known = known_for_folder(model_dir)
        fetch = (f"`{known.make}` writes {known.name} there" if known is not None else
                 f"`make model` writes {KNOWN_MODELS[0].name} to {KNOWN_MODELS[0].folder}")  # fmt: skip
        raise PreflightError(f"{model_dir} is not a model folder (no config.json); {fetch}, or pass --model NAME|DIR")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise PreflightError(f"cannot read {config_file}: {error}") from None
    return config


def weights_problem(model_dir: Path) -> str | None:
    """Why the folder's weights cannot be loaded, read from their headers alone (None when they can): no weights
    file, or a safetensors file cut short or damaged."""
    files = sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("pytorch_model*.bin"))
    if not files:
        return f"{model_dir} holds no weights (model.safetensors or pytorch_model.bin): `make model` writes a complete folder"
    from safetensors import safe_open

    for file in (f for f in files if f.suffix == ".safetensors"):
        try:
            with safe_open(str(file), "pt") as weights:
                weights.keys()
        except Exception as error:
            return f"{file} cannot be read ({' '.join(str(error).split())[:160]}): a damaged or partial download?"
    return None


def tokenizer_of(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as error:
        raise PreflightError(f"{model_dir} has no tokenizer attnbench can load ({type(error).__name__}: "
                             f"{' '.join(str(error).split())[:200]}): generation needs one to write prompts and read "
                             "answers") from None  # fmt: skip


def estimated_bytes(config: dict[str, Any], n: int, methods: float, prefilled: int = 1) -> float:
    """What a unit at N holds at once: the weights (a tied vocabulary matrix once), the exact prompt's q/k/v of every
    layer, the methods' states (`methods`: how many exact KV caches they hold together, room included: N positions in
    a global layer, its window in a sliding one), one layer's working set over the prompt for the `prefilled` rows
    that prefill together (q, k, v, the MLP's three intermediates, residuals; the methods sharing the exact prompt
    prefill it once), the widest chunked score block (H2O: 256 queries × N per head) and the last position's logits
    (the decoder keeps no others)."""
    values = settings(config)
    layers, hidden = values.get("num_hidden_layers", 1), values.get("hidden_size", 1)
    heads = values.get("num_attention_heads", 1)
    kv_heads = values.get("num_key_value_heads") or heads
    head_dim = values.get("head_dim") or hidden // heads
    mlp = values.get("intermediate_size", 4 * hidden)
    vocabulary = values.get("vocab_size", 0)
    embeddings = vocabulary * hidden * (1 if values.get("tie_word_embeddings") else 2)
    attention = hidden * head_dim * 2 * (heads + kv_heads)  # q and o; k and v
    weights = FLOAT32 * (embeddings + layers * (attention + 3 * hidden * mlp))
    positions = sum(n if window is None else min(n, window) for window in layer_windows(config) or [None] * layers)
    cache = 2 * kv_heads * head_dim * positions * FLOAT32
    record = layers * (heads + 2 * kv_heads) * head_dim * n * FLOAT32
    layer = FLOAT32 * n * (3 * heads * head_dim + 3 * mlp + 3 * hidden) * max(1, prefilled)
    scores = 2 * heads * 256 * n * FLOAT32
    logits = vocabulary * FLOAT32
    return weights + SLACK * (record + methods * cache + layer + scores + logits)


def check(grid: GenerationGrid, model_dir: Path, device: str = "cpu", workers: int = 1) -> Any:
    """The grid against the model (`workers` units at once): PreflightError listing every problem, else the
    tokenizer."""
    config = model_limits(model_dir)
    if (reason := unrouted_reason(config)) is not None:  # before anything else is read: nothing here would run
        raise PreflightError(f"{model_dir} cannot generate with attnbench's methods: {reason}")
    problems = []
    architectures = " ".join(config.get("architectures") or [])
    if "CausalLM" not in architectures and "LMHeadModel" not in architectures:
        problems.append(f"{model_dir} holds a {architectures or 'model of unknown architecture'}: generation needs a "
                        "causal language model (a decoder with its LM head)")  # fmt: skip
    if (problem := weights_problem(model_dir)) is not None:
        problems.append(problem)
    limit = config.get("max_position_embeddings") or config.get("n_positions")
    fitting = [n for n in grid.seq_lens if not limit or n <= limit]  # N counts the context, question and answer
    problems += [f"N={n}: beyond the model's {limit} positions ({model_dir.name}'s max_position_embeddings); give "
                 f"--seq-lens {limit} or less" for n in grid.seq_lens if n not in fitting]  # fmt: skip
    try:
        tokenizer = tokenizer_of(model_dir)
    except PreflightError as error:
        tokenizer, problems = None, problems + [str(error)]
    if tokenizer is not None:
        problems += task_problems(grid, tokenizer, limit, fitting)
    problems += layer_problems(grid, config, model_dir)
    problems += memory_problems(grid, config, device, workers)
    if problems:
        raise PreflightError("; ".join(problems))
    return tokenizer


def task_problems(grid: GenerationGrid, tokenizer: Any, limit: int | None, lengths: list[int]) -> list[str]:
    """A user's row beyond the model's positions; a built-in task's text the tokenizer garbles, or a length it cannot
    fill (one sample built at each N)."""
    problems = []
    for task in grid.tasks:
        if task.startswith(JSONL):
            rows = read_jsonl(Path(task[len(JSONL):]))
            for sample in jsonl_samples(task, rows, encoder(tokenizer), grid.answer_tokens):
                tokens = len(sample.context) + len(sample.question)
                if limit and tokens + sample.answer_tokens > limit:
                    problems.append(f"{task} row {sample.index + 1}: {tokens} tokens and its answer's "
                                    f"{sample.answer_tokens}, beyond the model's {limit} positions")  # fmt: skip
                    break
            continue
        text = probe_text(task)
        if text and tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) != text:
            problems.append(f"{task}: the tokenizer cannot encode its text faithfully (decoding it back differs)")
            continue
        for n in lengths:
            try:
                build_samples(task, n, grid.samples, encoder(tokenizer), seed=grid.seed,
                              continuation_tokens=grid.continuation_tokens, indices=range(0, 1))  # fmt: skip
            except TaskError as error:
                problems.append(f"N={n}: {error}")
    return problems


def layer_problems(grid: GenerationGrid, config: dict[str, Any], model_dir: Path) -> list[str]:
    """A method with nowhere to go: every layer of the model slides (a method goes into the global ones unless
    `hybrid_layers = "all"`), or `hybrid_layers = "all"` on a model with no sliding layer (it would change nothing but
    the labels)."""
    windows = layer_windows(config)
    methods = [m for m in grid.methods if not (m.variant.name == "full" and m.quantize == "none")]
    problems = []
    if windows and all(w is not None for w in windows) and any(m.layers == "global" for m in methods):
        problems.append(f"every layer of {model_dir.name} attends through a sliding window: a method goes into the "
                        "global layers, and there are none; give --hybrid-layers all (hybrid_layers = \"all\") to "
                        "put the methods in place of the windows")  # fmt: skip
    if not any(w is not None for w in windows) and any(m.layers == "all" for m in methods):
        problems.append(f"{model_dir.name} has no sliding-window layer: hybrid_layers = \"all\" would change nothing "
                        "but the labels; drop it (--hybrid-layers)")  # fmt: skip
    return problems


def held_caches(grid: GenerationGrid, n: int) -> float:
    """How many exact KV caches the settings at N hold together: a share of it for a method that keeps its share
    (its knob swept), the whole cache for any other (the exact model; Quest, which holds every key and reads a share)."""
    from attnbench.registry import registry

    held = 0.0
    for setting in grid.settings(n):
        try:
            pages = registry.load(setting.method.variant.name).family == "block-sparse"
        except Exception:
            pages = True  # unknown here: counted whole
        held += 1.0 if setting.share is None or pages else min(1.0, setting.share)
    return held


def memory_problems(grid: GenerationGrid, config: dict[str, Any], device: str = "cpu", workers: int = 1) -> list[str]:
    """The largest N over 80% of the memory available now on `device`, `workers` units at once (the estimate errs
    high: float32 sizes)."""
    import torch

    from attnbench.measure.machine import available_memory_bytes

    if device != "cpu" and not torch.cuda.is_available():  # a cluster's GPUs (ray --address): not seen from here
        return []
    n = max(grid.seq_lens)
    settings = grid.settings(n)
    prefilled = sum(s.method.prefill == "own" for s in settings)
    need = workers * estimated_bytes(config, n, held_caches(grid, n), prefilled)
    allowed = 0.8 * available_memory_bytes(device)
    if allowed and need > allowed:
        at_once = f", {workers} units at once" if workers > 1 else ""
        return [f"N={n} with {len(settings)} method settings{at_once} would hold ~{need / 2**30:.1f} GiB, over 80% "
                f"of the {allowed / 0.8 / 2**30:.1f} GiB available now: fewer --seq-lens, methods or --jobs"]  # fmt: skip
    return []
