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

# where `make model` writes SmolLM2-135M; $ATTNBENCH_MODEL_DIR points elsewhere
DEFAULT_MODEL = Path(os.environ.get("ATTNBENCH_MODEL_DIR", Path.home() / ".cache" / "attnbench" / "SmolLM2-135M"))
FLOAT32 = 4
SLACK = 1.5  # what the tally misses: temporaries, the allocator's fragmentation


class PreflightError(ValueError):
    """The model or the grid cannot run here; the message lists every problem."""


def model_limits(model_dir: Path) -> dict[str, Any]:
    """config.json's sizes, or PreflightError naming what is missing."""
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise PreflightError(f"{model_dir} is not a model folder (no config.json); `make model` writes SmolLM2-135M "
                             "to ~/.cache/attnbench/SmolLM2-135M, or pass --model DIR")  # fmt: skip
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


def estimated_bytes(config: dict[str, Any], n: int, methods: int) -> float:
    """What a unit at N holds at once: the weights, the exact prompt's q/k/v of every layer, each method's states
    (at most the exact KV cache each, room included), one layer's working set over the prompt (q, k, v, the MLP's
    three intermediates, residuals) and the widest chunked score block (H2O: 256 queries × N per head)."""
    layers, hidden = config.get("num_hidden_layers", 1), config.get("hidden_size", 1)
    heads = config.get("num_attention_heads", 1)
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    mlp = config.get("intermediate_size", 4 * hidden)
    vocabulary = config.get("vocab_size", 0)
    weights = FLOAT32 * (2 * vocabulary * hidden + layers * (4 * hidden * hidden + 3 * hidden * mlp))
    cache = layers * 2 * kv_heads * head_dim * n * FLOAT32
    record = layers * (heads + 2 * kv_heads) * head_dim * n * FLOAT32
    layer = FLOAT32 * n * (3 * heads * head_dim + 3 * mlp + 3 * hidden) * max(1, methods // 4)
    scores = 2 * heads * 256 * n * FLOAT32
    return weights + SLACK * (record + methods * cache + layer + scores)


def check(grid: GenerationGrid, model_dir: Path) -> Any:
    """The grid against the model: PreflightError listing every problem, else the tokenizer."""
    config = model_limits(model_dir)
    problems = []
    architectures = " ".join(config.get("architectures") or [])
    if "CausalLM" not in architectures and "LMHeadModel" not in architectures:
        problems.append(f"{model_dir} holds a {architectures or 'model of unknown architecture'}: generation needs a "
                        "causal language model (a decoder with its LM head)")  # fmt: skip
    if (problem := weights_problem(model_dir)) is not None:
        problems.append(problem)
    limit = config.get("max_position_embeddings") or config.get("n_positions")
    fitting = [n for n in grid.seq_lens if not limit or n <= limit]  # N counts the context, question and answer
    problems += [f"N={n}: beyond the model's {limit} positions; give --seq-lens {limit} or less"
                 for n in grid.seq_lens if n not in fitting]  # fmt: skip
    try:
        tokenizer = tokenizer_of(model_dir)
    except PreflightError as error:
        tokenizer, problems = None, problems + [str(error)]
    if tokenizer is not None:
        problems += task_problems(grid, tokenizer, limit, fitting)
    problems += memory_problems(grid, config)
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


def memory_problems(grid: GenerationGrid, config: dict[str, Any]) -> list[str]:
    """The largest N over 80% of the memory available now (the estimate errs high)."""
    from attnbench.measure.machine import available_memory_bytes

    n = max(grid.seq_lens)
    methods = len(grid.settings(n))
    need, allowed = estimated_bytes(config, n, methods), 0.8 * available_memory_bytes("cpu")
    if allowed and need > allowed:
        return [f"N={n} with {methods} method settings would hold ~{need / 2**30:.1f} GiB, over 80% of the "
                f"{allowed / 0.8 / 2**30:.1f} GiB available now: fewer --seq-lens or methods"]  # fmt: skip
    return []
