"""Generation tasks as data, built offline from shipped text and a seed, and a user's own tasks from a JSONL file.

A built-in task is a `TaskSpec` (RULER keeps each task as a template, a haystack, a value kind and a metric; one
builder serves them all):
- `passkey`: a 5-digit pass key in a repeated-sentence haystack (Mohtashami & Jaggi 2023; Quest's Table 1);
- `niah_single`: RULER's niah_single_1, "One of the special magic numbers for {key} is: {value}." with a 7-digit
  value in the repeated-sentence haystack, asked by its key;
- `niah_multikey`: the same with distractor needles (other keys, other values), one of them asked;
- `continuation`: a stretch of a real text (the Python tutorial shipped for calibration) and its next tokens, scored
  by their teacher-forced log-likelihood against the exact model's.
The asked needle of sample i of S lies at depth i / (S - 1) of the haystack (0 = first, 1 = last), so depths spread
over 0-100%. A user's JSONL file holds rows {"context", "question", "answers"} (optionally "answer_prefix"): the
shape of RULER's and kvpress's data sets; each row is a sample of that task, at its own length.
Scoring is RULER's string match: the share of the reference strings found in the answer, case-insensitive.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

# RULER's "noise" haystack, the sentences of the passkey test (Mohtashami & Jaggi 2023)
HAYSTACK = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
ADJECTIVES = ("amber", "brisk", "calm", "dusty", "eager", "fiery", "gentle", "hollow", "icy", "jolly", "lucky",
              "misty", "noble", "olive", "quiet", "rapid", "silent", "tidy", "vivid", "wild")  # fmt: skip
NOUNS = ("anchor", "badger", "candle", "dragon", "falcon", "garden", "harbor", "island", "jacket", "kettle", "lantern",
         "meadow", "needle", "orchard", "pebble", "quarry", "river", "saddle", "tunnel", "window")  # fmt: skip
CONTINUATION_TEXT = "python_tutorial.txt"  # shipped in attnbench.model.texts


class TaskError(ValueError):
    """A task cannot be built or read; the message says what to fix."""


@dataclass(frozen=True)
class TaskSpec:
    """A built-in task: its intro, needle and question templates ({key}, {value}), the digits of its values, how
    many distractor needles, and how many tokens its answer may take. kind "continuation" has no needle."""

    name: str
    kind: str  # "needle" | "continuation"
    intro: str = ""
    needle: str = ""
    question: str = ""  # ends with the answer's prefix: the model completes it
    digits: int = 7
    distractors: int = 0
    answer_tokens: int = 10  # a 7-digit value, its space and full stop (SmolLM2 writes a digit a token)


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "passkey", "needle",
            intro="There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
            "I will quiz you about the important information there.\n",
            needle="The pass key is {value}. Remember it. {value} is the pass key. ",
            question="What is the pass key? The pass key is", digits=5, answer_tokens=8,
        ),
        TaskSpec(
            "niah_single", "needle",
            intro="Some special magic numbers are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the numbers afterwards.\n",
            needle="One of the special magic numbers for {key} is: {value}. ",
            question="What is the special magic number for {key} mentioned in the provided text? The special magic "
            "number for {key} mentioned in the provided text is",
        ),
        TaskSpec(
            "niah_multikey", "needle",
            intro="Some special magic numbers are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the numbers afterwards.\n",
            needle="One of the special magic numbers for {key} is: {value}. ",
            question="What is the special magic number for {key} mentioned in the provided text? The special magic "
            "number for {key} mentioned in the provided text is", distractors=3,
        ),
        TaskSpec("continuation", "continuation"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Sample:
    """One prompt of a task: the context (what is compressed), the question after it, the answers a correct reply
    contains, or the tokens of a continuation; ids are the tokenizer's."""

    task: str
    index: int
    context: list[int]
    question: list[int]
    answers: tuple[str, ...] = ()
    continuation: tuple[int, ...] = ()
    depth: float | None = None  # where the asked needle lies, 0..1
    answer_tokens: int = 12


Encode = Callable[[str], list[int]]


def needle_sample(spec: TaskSpec, total: int, index: int, samples: int, encode: Encode, seed: int) -> Sample:
    """A needle task's sample `index` of `samples` whose context, question and answer fit `total` tokens, from the
    seed."""
    rng = random.Random(f"{spec.name}/{total}/{index}/{seed}")
    keys = rng.sample([f"{a}-{b}" for a in ADJECTIVES for b in NOUNS], spec.distractors + 1)
    values = [str(rng.randrange(10 ** (spec.digits - 1), 10**spec.digits)) for _ in keys]
    depth = index / (samples - 1) if samples > 1 else 0.5
    question = encode("\n" + spec.question.format(key=keys[0]))
    n = total - len(question) - spec.answer_tokens  # the context's tokens
    unit = len(encode(HAYSTACK * 8)) / 8  # tokens per haystack sentence group, in running text
    needles = [spec.needle.format(key=key, value=value) for key, value in zip(keys, values)]
    fixed = len(encode(spec.intro + "".join(needles)))
    units = max(1, int((n - fixed) / unit))
    while True:  # the largest haystack whose context fits n tokens
        places = [round(depth * units)] + [rng.randrange(units + 1) for _ in keys[1:]]  # the asked needle first
        pieces = [HAYSTACK] * units
        for place, needle in sorted(zip(places, needles), key=lambda pair: -pair[0]):
            pieces.insert(place, needle)
        context = encode(spec.intro + "".join(pieces))
        if len(context) <= n:
            break
        if units == 1:
            raise TaskError(f"{spec.name} needs more than {total} tokens: its intro, needles, question and answer "
                            f"alone take {len(context) + total - n}")
        units -= max(1, int((len(context) - n) / unit))
    return Sample(spec.name, index, context, question, (values[0],), depth=depth, answer_tokens=spec.answer_tokens)


def continuation_sample(total: int, tokens: int, index: int, encode: Encode, seed: int) -> Sample:
    """A stretch of the shipped text and its next `tokens`, `total` tokens in all, starting at a seeded offset."""
    ids = text_tokens(encode)
    n = total - tokens
    if len(ids) < total or n < 1:
        raise TaskError(f"the continuation text has {len(ids)} tokens: it cannot give {total} ({tokens} to continue)")
    start = random.Random(f"continuation/{total}/{index}/{seed}").randrange(len(ids) - total + 1)
    return Sample("continuation", index, ids[start : start + n], [], continuation=tuple(ids[start + n : start + n + tokens]))


@functools.lru_cache(maxsize=4)
def text_tokens(encode: Encode) -> list[int]:
    """The shipped continuation text, tokenized once per tokenizer."""
    return encode(resources.files("attnbench.model.texts").joinpath(CONTINUATION_TEXT).read_text(encoding="utf-8"))


def build_samples(task: str, n: int, samples: int, encode: Encode, *, seed: int = 0, continuation_tokens: int = 128,
                  indices: range | None = None) -> list[Sample]:
    """Samples `indices` (default all) of a built-in task at length n: the context, the question and the answer (or
    the continuation) fit n tokens, as RULER counts a task's length."""
    spec = TASKS[task]
    chosen = range(samples) if indices is None else indices
    if spec.kind == "continuation":
        return [continuation_sample(n, continuation_tokens, i, encode, seed) for i in chosen]
    return [needle_sample(spec, n, i, samples, encode, seed) for i in chosen]


# ---- a user's tasks ----------------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a user's task file, each checked: every problem named with its line, before any work."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise TaskError(f"cannot read the task file {path}: {error}") from None
    rows, problems = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(f"line {number}: not JSON ({error.msg})")
            continue
        if not isinstance(row, dict):
            problems.append(f"line {number}: expected an object with context, question and answers")
            continue
        answers = row.get("answers", row.get("answer"))
        answers = [answers] if isinstance(answers, str) else answers
        missing = [key for key in ("context", "question") if not isinstance(row.get(key), str) or not row[key].strip()]
        if missing:
            problems.append(f"line {number}: {', '.join(missing)} must be text, not empty")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a for a in answers):
            problems.append(f"line {number}: answers must be a non-empty string or list of strings")
        if not missing and isinstance(answers, list):
            rows.append({**row, "answers": answers})
    if problems:
        raise TaskError(f"{path}: " + "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else ""))
    if not rows:
        raise TaskError(f"{path} holds no task rows (one JSON object a line: context, question, answers)")
    return rows


def jsonl_samples(name: str, rows: list[dict[str, Any]], encode: Encode, answer_tokens: int = 24) -> list[Sample]:
    """A user's rows as samples: the context compressed, then the question (and its answer prefix, if any)."""
    samples = []
    for index, row in enumerate(rows):
        question = "\n" + row["question"] + (" " + row["answer_prefix"] if row.get("answer_prefix") else "")
        samples.append(Sample(name, index, encode(row["context"]), encode(question), tuple(row["answers"]),
                              answer_tokens=answer_tokens))  # fmt: skip
    return samples


def score(answer: str, references: tuple[str, ...]) -> float:
    """RULER's string_match_all: the share of the references found in the answer, case-insensitive."""
    found = [reference.lower() in answer.lower() for reference in references]
    return sum(found) / len(found) if found else float("nan")
