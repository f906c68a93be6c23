"""The folder of a generation grid (`attnbench generate`): generations.csv, a row per (sample, method setting),
appended as each unit of work ends (`KeyedRowsFolder`), meta.json, the grid as resolved."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from attnbench.runfolder.keyed_rows import KeyedRowsFolder, read_keyed_rows

GENERATIONS = "generations.csv"


@dataclass
class GenerationRow:
    """One method's generation on one sample: what it answered, how well, and what it kept and cost."""

    key: str  # attnbench.generation.grid.row_key: resume matches rows by it
    task: str
    seq_len: int  # the grid's N: the context is at most N tokens
    protocol: str  # question-agnostic | question-aware
    sample: int
    method: str  # the method's label, its share apart
    variant: str
    hparams: str  # JSON, the knob set for the share
    prefill: str  # dense (the exact prompt, its state built from it) | own
    dense_layers: int = 0
    decode: str = "own"  # own (its variant's decode form) | exact (exact decoding after its prefill)
    quantize: str = ""  # what it kept after the prompt, quantized: kivi-4 | kivi-2 (KIVI's cache); "" none
    share: float | None = None  # the share of the prompt's cache asked for (None: a method without a knob)
    status: str = "ok"  # ok | error
    reason: str = ""
    depth: float | None = None  # where the asked needle lies (0..1)
    prompt_tokens: int | None = None  # context (and, question-aware, question) tokens prefilled
    answer: str = ""  # the greedy answer (needle tasks)
    score: float | None = None  # RULER's string match (`metric`): the references found in the answer
    metric: str = ""  # string_match_all (the share of the references found) | string_match_part (any found)
    reply_flag: str = ""  # the exact model's row: why its reply could not hold the answer (REPLY_FLAGS), else ""
    nll: float | None = None  # continuation: mean -log p of the forced tokens
    nll_exact: float | None = None  # the exact model's, on the same tokens
    ppl_ratio: float | None = None  # exp(nll - nll_exact): perplexity against the exact model's
    cache_bytes: int | None = None  # what its states hold after the prompt, every layer (room for the steps included)
    cache_share: float | None = None  # cache_bytes / the exact model's
    read_bytes: int | None = None  # what its first step reads of them
    read_share: float | None = None  # read_bytes / the exact model's
    final_cache_bytes: int | None = None  # what its states hold after its last token (kvpress's rule: it grew)
    attention_s: float | None = None  # time per token inside attention, every layer: its layer step, timed in turns
    attention_ratio: float | None = None  # attention_s / the exact model's, median over rounds of the turns
    attention_low: float | None = None  # the ratio's 95% interval (order statistics over rounds)
    attention_high: float | None = None
    step_form: str = ""  # how its steps ran when timed: eager (PyTorch operations one by one)
    budget_rule: str = ""  # kvpress (compressed once, the question and answer appended) | fixed-total
    prefill_s: float | None = None  # its prompt: the shared exact pass and building its states, or its own prefill
    host: str = ""
    node: str = ""  # the Ray node ("" outside Ray)


COLUMNS = [f.name for f in fields(GenerationRow)]
TEXT_COLUMNS = ("key", "task", "protocol", "method", "variant", "hparams", "prefill", "decode", "quantize", "status",
                "reason", "answer", "host", "node", "step_form", "budget_rule", "metric", "reply_flag")  # fmt: skip
# the exact model's reply could not hold the answer: nothing after the prompt; it ended at a newline (the grid's stop
# rule) and went on it would have named a reference it lacks; it ran to its answer budget without every reference
REPLY_FLAGS = ("empty", "cut at stop", "cut at budget")


class GenerationsFolder(KeyedRowsFolder):
    """The only writer of one generation grid's folder, while it holds the folder's lock."""

    file_name, columns = GENERATIONS, COLUMNS


def read_generations(path: Path) -> pd.DataFrame:
    """generations.csv as a DataFrame, the later row of a key standing."""
    missing = f"{path} is not a generation grid folder (no {GENERATIONS}); grids live in results/<id>/"
    return read_keyed_rows(path / GENERATIONS, COLUMNS, TEXT_COLUMNS, missing)


def generated_keys(path: Path) -> set[str]:
    """The keys of the rows that ended ok in `path`: what a resume skips."""
    if not (path / GENERATIONS).is_file():
        return set()
    return set(read_generations(path).query("status == 'ok'").key)
