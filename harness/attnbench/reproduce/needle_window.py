"""Whether a needle lay inside StreamingLLM's window when the model began its answer, counted in tokens: the sample
rebuilt from the grid's seed with the model's tokenizer (as `generation/unit.py` builds it), the asked needle's token
span found in its context, against the positions that sinks and a window keep at the first answer token under the
row's budget rule (`generation/kept.py`).

For c = max(sinks, global_tokens) first positions and a window w (the row's hyperparameters: after the prompt the
cache holds the c sinks and the last w + 1 positions, `generation/budgets.py`), a prompt of n tokens, t question
tokens after it (question-agnostic; none question-aware, the question is inside the prompt) and P = n + t, the
position of the first answer token, whose prediction is the last prompt or question token's step:
- kvpress: compressed once when the prompt ends, then the question appended: [0, c) and [n - w - 1, P);
- fixed-total: the window slid with every token: [0, c) and the last w + 1 positions before the answer, [P - w - 1, P).
A needle is INSIDE when every token of it is kept, OUTSIDE when none is, CUT when the window's edge falls inside it.
"""

from __future__ import annotations

import functools
import json
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from attnbench.generation.ruler import Niah
from attnbench.generation.sample import Encode, Sample
from attnbench.generation.scoring import score
from attnbench.generation.tasks import TASKS, build_samples

INSIDE, OUTSIDE, CUT = "inside", "outside", "cut"
AGNOSTIC = "question-agnostic"


class WindowError(ValueError):
    """A row whose needle cannot be placed against its window; the message says which and why."""


@dataclass(frozen=True)
class Codec:
    """A tokenizer's two directions, without special tokens: text -> ids (as the grid built its samples), ids ->
    text (verbatim, no clean-up of spaces)."""

    encode: Encode
    decode: Callable[[list[int]], str]


@functools.lru_cache(maxsize=2)
def model_codec(model_dir: Path) -> Codec:
    """The tokenizer of the model folder the grid ran, loaded once."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return Codec(functools.partial(tokenizer.encode, add_special_tokens=False),
                 functools.partial(tokenizer.decode, clean_up_tokenization_spaces=False))  # fmt: skip


def window_at_answer(hparams: dict, rule: str, prompt: int, following: int) -> tuple[range, range]:
    """The positions kept when the first answer token is predicted: (the sinks, the window), under `rule`, for a
    prompt of `prompt` tokens followed by `following` question tokens (see the module's note)."""
    if "window" not in hparams:
        raise WindowError(f"its hyperparameters name no window ({json.dumps(hparams)}): not sinks and a window")
    if rule not in ("", "kvpress", "fixed-total"):
        raise WindowError(f"budget rule {rule!r}: its window at the answer is not known here")
    columns, window = max(hparams.get("sinks", 0), hparams.get("global_tokens", 0)), hparams["window"]
    answer = prompt + following
    start = (answer if rule == "fixed-total" else prompt) - window - 1  # "": a run from before the rule, kvpress's
    return range(min(columns, answer)), range(max(columns, start), answer)


def placement(spans: list[range], kept: tuple[range, range]) -> str:
    """INSIDE when every token of every span is kept, OUTSIDE when none is, CUT otherwise."""
    tokens = [t for span in spans for t in span]
    held = sum(any(t in part for part in kept) for t in tokens)
    return INSIDE if held == len(tokens) else OUTSIDE if held == 0 else CUT


def token_at(ids: list[int], decode: Callable[[list[int]], str], char: int) -> int:
    """The index of the token that holds character `char` of decode(ids): the first k whose prefix decode(ids[:k+1])
    is longer than `char` (a bisection: a handful of decodes)."""
    low, high = 0, len(ids) - 1
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if len(decode(ids[: middle + 1])) > char else (middle + 1, high)
    return low


def needle_pattern(args: Niah, value: str) -> re.Pattern[str]:
    """The needle sentence of `value` as its generator writes it (`generators.niah_sample`), any key."""
    parts = []
    for literal, field, _, _ in string.Formatter().parse(args.needle):
        parts.append(re.escape(literal))
        if field == "value":
            parts.append(re.escape(value))
        elif field == "type_needle_v":
            parts.append(re.escape(args.value_kind))
        elif field is not None:
            parts.append(r"[^\n]+?")
    return re.compile("".join(parts))


def needle_spans(sample: Sample, codec: Codec) -> list[range]:
    """The token positions of each asked needle (one per answer value) in the sample's context."""
    args = TASKS[sample.task].args
    if not isinstance(args, Niah):
        raise WindowError(f"{sample.task} plants no needle to place against a window")
    text = codec.decode(sample.context)
    spans = []
    for value in sample.answers:
        found = list(needle_pattern(args, value).finditer(text))
        if len(found) != 1:
            raise WindowError(f"{sample.task} sample {sample.index}: its needle of {value!r} is in its context "
                              f"{len(found)} times, not once")  # fmt: skip
        first = token_at(sample.context, codec.decode, found[0].start())
        spans.append(range(first, token_at(sample.context, codec.decode, found[0].end() - 1) + 1))
    return spans


def rebuilt(task: str, n: int, samples: int, index: int, seed: int, codec: Codec) -> Sample:
    """Sample `index` of `samples` of a built-in task at N, as the grid's unit built it."""
    return build_samples(task, n, samples, codec.encode, seed=seed, indices=range(index, index + 1))[0]


def matches(row: object, sample: Sample) -> bool:
    """The row was made from this sample: its prompt's length, its needle's depth, and its answer's score against
    the sample's answers agree (the seed and the tokenizer checked, not assumed)."""
    aware = row.protocol != AGNOSTIC  # type: ignore[attr-defined]
    prompt = len(sample.context) + (len(sample.question) if aware else 0)
    answer = row.answer if isinstance(row.answer, str) else ""  # type: ignore[attr-defined]
    scored = score(answer, sample.answers, sample.metric)
    same_depth = abs(row.depth - sample.depth) < 1e-9  # type: ignore[attr-defined]
    return row.prompt_tokens == prompt and same_depth and abs(scored - row.score) < 1e-9  # type: ignore[attr-defined]


def placements(rows: pd.DataFrame, seed: int, codec: Codec) -> pd.Series:
    """Per row of a sinks-and-window method: where its asked needle lay against its window at the first answer token
    (INSIDE, OUTSIDE or CUT). A task's samples per N are the rows' (sample i of S sits at depth i / (S - 1)).
    WindowError when a row is not a needle task's, names no window, or does not match the rebuilt sample."""
    count = rows.groupby(["task", "seq_len"])["sample"].max().add(1).to_dict()
    built: dict[tuple[str, int, int], tuple[Sample, list[range]]] = {}
    out = {}
    for row in rows.itertuples():
        key = (row.task, int(row.seq_len), int(row.sample))
        if row.task not in TASKS:
            raise WindowError(f"{row.task} is not a built-in task: its samples cannot be rebuilt here")
        if key not in built:  # each sample once, whatever the shares
            sample = rebuilt(row.task, key[1], count[(row.task, row.seq_len)], key[2], seed, codec)
            built[key] = sample, needle_spans(sample, codec)
        sample, spans = built[key]
        if not matches(row, sample):
            raise WindowError(f"{row.task} N={row.seq_len} sample {row.sample} ({row.method}): its row does not match "
                              f"the sample rebuilt with seed {seed} and this tokenizer (its prompt's length, its "
                              "depth or its answer's score differ)")  # fmt: skip
        following = len(sample.question) if row.protocol == AGNOSTIC else 0
        rule = row.budget_rule if isinstance(row.budget_rule, str) else ""
        kept = window_at_answer(json.loads(row.hparams), rule, int(row.prompt_tokens), following)
        out[row.Index] = placement(spans, kept)
    return pd.Series(out, dtype=object).reindex(rows.index)
