"""One unit of a generation grid: its samples built, every method run on each (batched, the exact prompt shared), and
a row per (sample, method setting). A sample that fails is its rows' `error`, the unit goes on. What a worker (in
this process, or a Ray task) runs; the model is loaded once per process and placement (`placement.Placement`: its
device and dtype), and every prompt made on its device."""

from __future__ import annotations

import functools
import json
import math
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnbench.generation.decoder import PHASES, InModelDecoder, RowResult, looping
from attnbench.generation.grid import JSONL, GenerationGrid, Setting, Unit, row_key
from attnbench.generation.layers import Method, MethodRows
from attnbench.generation.placement import Placement
from attnbench.generation.repeat_pass import RepeatPrompt
from attnbench.generation.step_timing import StepTime, time_rows
from attnbench.generation.tasks import Sample, build_samples, jsonl_samples, needs_lines, read_jsonl, score
from attnbench.registry import registry
from attnbench.runfolder.generations import GenerationRow


UNIT_PHASES = ("step timing", "reply check")  # besides the decoder's: timing the steps, `exact_reply_flag`


@dataclass(frozen=True)
class UnitJob:
    """What a worker needs: the grid, the unit, the model folder, where the model runs."""

    grid: GenerationGrid
    unit: Unit
    model_dir: str
    threads: int = 2  # torch's threads in the worker: units run side by side take fewer each
    placement: Placement = Placement()  # the device and dtype (a Ray task on CUDA asks for a GPU)


@dataclass
class UnitOutcome:
    job: UnitJob
    rows: list[GenerationRow] = field(default_factory=list)
    reason: str = ""  # why the whole unit failed ("" when it ran)
    node: str = ""
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase (`decoder.PHASES`, UNIT_PHASES)


@functools.lru_cache(maxsize=1)
def loaded(model_dir: str, placement: Placement = Placement()) -> tuple[Any, Any, InModelDecoder]:
    """The model (on the placement's device, in its dtype), its tokenizer and the in-model decoder, once per process
    and placement."""
    from transformers import AutoTokenizer

    from attnbench.model.study import load_model

    model = placement.place(load_model(Path(model_dir))[0])
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    ends = {tokenizer.eos_token_id} - {None}
    stops = set(tokenizer.encode("\n", add_special_tokens=False))
    return model, tokenizer, InModelDecoder(model, stops, ends, repeat=RepeatPrompt.of(encoder(tokenizer)))


def encoder(tokenizer: Any) -> Any:
    """The tokenizer's encode without special tokens (one object per tokenizer, so its texts are cached)."""
    return _encoders.setdefault(id(tokenizer), functools.partial(tokenizer.encode, add_special_tokens=False))


_encoders: dict[int, Any] = {}


def unit_samples(grid: GenerationGrid, unit: Unit, tokenizer: Any) -> list[Sample]:
    encode = encoder(tokenizer)
    if unit.task.startswith(JSONL):
        rows = read_jsonl(Path(unit.task[len(JSONL):]))
        return [s for s in jsonl_samples(unit.task, rows, encode, grid.answer_tokens) if s.index in unit.samples]
    indices = range(unit.samples[0], unit.samples[-1] + 1)
    return build_samples(unit.task, unit.seq_len, grid.samples, encode, seed=grid.seed,
                         continuation_tokens=grid.continuation_tokens, indices=indices,
                         answer_tokens=grid.answer_tokens)  # fmt: skip


def run_unit(job: UnitJob) -> UnitOutcome:
    """Every sample of the unit with every method setting: a row each."""
    torch.set_num_threads(job.threads)
    try:
        model, tokenizer, decoder = loaded(job.model_dir, job.placement)
        samples = unit_samples(job.grid, job.unit, tokenizer)
    except Exception as error:
        return UnitOutcome(job, reason=f"{type(error).__name__}: {error}")
    rows, started, phases = [], time.monotonic(), dict.fromkeys(PHASES + UNIT_PHASES, 0.0)
    ids = job.placement.tokens  # token ids as a tensor (n,) on the model's device
    for done, sample in enumerate(samples, 1):
        aware = job.unit.protocol == "question-aware"
        prompt = sample.context + (sample.question if aware else [])
        follows = (0 if aware else len(sample.question)) + (sample.answer_tokens if sample.answers else 0)
        follows += len(sample.continuation)
        settings = job.grid.settings(len(prompt), reserve=follows if job.grid.budget_rule == "fixed-total" else 0,
                                     protocol=job.unit.protocol)
        try:
            methods = [Method(registry.create(s.method.variant.name, seed=job.grid.seed, **dict(s.hparams)),
                              s.method.prefill, s.method.dense_layers, s.label(), s.method.decode, s.method.quantize,
                              s.method.layers)
                       for s in settings]  # fmt: skip
            timed: list[list[StepTime] | None] = [None]

            def time_steps(rows: MethodRows, order: list[int]) -> None:  # the unit's first sample, before its answer
                started = time.perf_counter()
                timed[0] = step_times(rows, order, model, settings, job.placement)
                phases["step timing"] += time.perf_counter() - started

            results = decoder.run(
                methods,
                ids(prompt),
                follow=None if aware else ids(sample.question),
                new_tokens=sample.answer_tokens if sample.answers else 0,
                forced=ids(sample.continuation) if sample.continuation else None,
                rule=job.grid.budget_rule,
                after_question=time_steps if done == 1 else None,
                stop_lines=stops_at_newline(job.grid, job.unit, sample),
                question_tokens=len(sample.question) if aware else 0,
            )
            for phase, seconds in decoder.phases.items():
                phases[phase] += seconds
            times = timed[0]
            checked = time.perf_counter()
            flag = exact_reply_flag(decoder, job, sample, sample.context + sample.question, methods, settings, results,
                                    tokenizer)  # fmt: skip
            phases["reply check"] += time.perf_counter() - checked
            reason = ""
        except Exception as error:
            results, times, flag = [RowResult() for _ in settings], None, ""
            reason = f"{type(error).__name__}: {error}"
        rows += sample_rows(job, sample, len(prompt), settings, results, reason, tokenizer, times, flag)
        print(f"attnbench:   {job.unit.name()}: {done}/{len(samples)} samples, {time.monotonic() - started:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    return UnitOutcome(job, rows, phases={k: round(v, 3) for k, v in phases.items()})


def stops_at_newline(grid: GenerationGrid, unit: Unit, sample: Sample) -> bool:
    """Whether the sample's answers end at their first newline: the grid's `stop`, but a user's row whose answer may
    take more than one line (`user_tasks.needs_lines`) runs to end of text or its budget."""
    multiline = unit.task.startswith(JSONL) and needs_lines(sample.answers, sample.metric)
    return grid.stop == "newline" and not multiline


def exact_reply_flag(decoder: InModelDecoder, job: UnitJob, sample: Sample, text: list[int], methods: list[Method],
                     settings: list[Setting], results: list[RowResult], tokenizer: Any) -> str:  # fmt: skip
    """Why the exact model's reply could not hold the answer (`REPLY_FLAGS`), or "": it ran to its budget short of a
    reference (cut at budget); a user's row (JSONL) ended before its budget under the newline rule, and the exact
    model, going on past that point to its budget, names a reference the reply lacks (cut at stop: the answer lay on a
    later line; a reply
    that ended at end of text goes no further); else a reply with nothing but space is empty. A loop is left alone:
    it cannot bring in a reference (`decoder.looping`). `text`: the context and the question."""
    exact = exact_index(settings)
    if not sample.answers or exact is None:
        return ""
    tokens = results[exact].tokens
    reply = tokenizer.decode(tokens, skip_special_tokens=True).strip()
    found = score(reply, sample.answers, sample.metric)
    if found == 1.0:
        return ""
    if tokens and not looping(tokens) and job.unit.task.startswith(JSONL):  # a built-in task's budget and stop are
        # RULER's: a miss there is the model's (a loop of words, a wrong number), not a row to mend
        if len(tokens) >= sample.answer_tokens:
            return "cut at budget"
        if stops_at_newline(job.grid, job.unit, sample):  # one more exact pass over its prompt
            (going,) = decoder.run([methods[exact]], job.placement.tokens(text + tokens), stop_lines=False,
                                   new_tokens=sample.answer_tokens - len(tokens))  # fmt: skip
            longer = tokenizer.decode(tokens + going.tokens, skip_special_tokens=True).strip()
            if score(longer, sample.answers, sample.metric) > found:
                return "cut at stop"
    return "" if reply else "empty"


def step_times(rows: MethodRows, order: list[int], model: Any, settings: list[Setting],
               placement: Placement = Placement()) -> list[StepTime] | None:  # fmt: skip
    """Each setting's attention cost per token (in the settings' order), timed in turns with the exact model's on
    the rows' states (`step_timing`, on the placement's device and dtype; `order`: each row's setting); None without
    the exact model among them."""
    exact = exact_index(settings)
    if exact is None:
        return None
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    shapes = (heads, config.num_key_value_heads, head_dim, head_dim)
    timed = time_rows(rows, order.index(exact), config.num_hidden_layers, shapes, placement=placement)
    in_order: list[StepTime] = [timed[0]] * len(settings)
    for row, index in enumerate(order):
        in_order[index] = timed[row]
    return in_order


def setting_row(unit: Unit, sample: int, setting: Setting, **fields: Any) -> GenerationRow:
    """A row of one setting on one sample of a unit: its key and what names it, then `fields`."""
    method = setting.method
    return GenerationRow(
        key=row_key(unit, sample, setting), task=unit.task, seq_len=unit.seq_len, protocol=unit.protocol, sample=sample,
        method=method.label(), variant=method.variant.name, hparams=json.dumps(dict(setting.hparams), sort_keys=True),
        prefill=method.prefill, dense_layers=method.dense_layers, decode=method.decode,
        quantize="" if method.quantize == "none" else method.quantize, share=setting.share, **fields,
    )  # fmt: skip


def exact_index(settings: list[Setting]) -> int | None:
    """The row of the exact model among the settings: full with its KV cache, every layer, unquantized (the grid adds
    it)."""
    for index, setting in enumerate(settings):
        method = setting.method
        if (method.variant.name == "full" and dict(setting.hparams).get("kv_cache", True) and not method.dense_layers
                and method.quantize == "none"):
            return index
    return None


def sample_rows(job: UnitJob, sample: Sample, prompt_tokens: int, settings: list[Setting], results: list[RowResult],
                reason: str, tokenizer: Any, times: list[StepTime] | None = None,
                flag: str = "") -> list[GenerationRow]:  # fmt: skip
    """The rows of one sample: each setting's answer and score, or its continuation's perplexity against the exact
    model's, and its cache as a share of the exact model's; `flag` on the exact model's row (`exact_reply_flag`)."""
    exact = exact_index(settings)
    reference = results[exact] if exact is not None and not reason else None
    rows = []
    for index, (setting, result) in enumerate(zip(settings, results)):
        row = setting_row(job.unit, sample.index, setting, depth=sample.depth, prompt_tokens=prompt_tokens,
                          host=socket.gethostname(), budget_rule=job.grid.budget_rule)  # fmt: skip
        if reason:
            row.status, row.reason = "error", reason
            rows.append(row)
            continue
        if sample.answers:
            row.answer = tokenizer.decode(result.tokens, skip_special_tokens=True).strip()
            row.score = score(row.answer, sample.answers, sample.metric)
            row.metric = sample.metric
            row.reply_flag = flag if index == exact else ""
        if result.nll:
            row.nll = sum(result.nll) / len(result.nll)
            if reference is not None and reference.nll:
                row.nll_exact = sum(reference.nll) / len(reference.nll)
                row.ppl_ratio = math.exp(row.nll - row.nll_exact)
        row.cache_bytes, row.read_bytes = result.cache_bytes, result.read_bytes
        row.final_cache_bytes = result.final_cache_bytes
        if reference is not None and reference.cache_bytes:
            row.cache_share = result.cache_bytes / reference.cache_bytes
            row.read_share = result.read_bytes / reference.read_bytes
        row.prefill_s = result.prefill_s
        if times is not None:
            timed = times[index]
            row.attention_s, row.step_form = timed.attention_s, timed.form
            row.attention_ratio, row.attention_low, row.attention_high = timed.ratio, timed.low, timed.high
        rows.append(row)
    return rows
