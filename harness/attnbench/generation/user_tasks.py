"""A user's own task: a JSONL file, one sample a line, the shape of kvpress's and RULER's data sets.

A row is {"context", "question", "answers"} ("answer" too; a string or a list of strings), optionally
"answer_prefix", "metric" ("string_match_all", the default: the share of the answers found; "string_match_part": 1
when any is found, for alternative phrasings) and "max_new_tokens" (the answer's budget, 1 to 128; default 50,
kvpress's pipeline's). A first line {"defaults": {"metric": ..., "max_new_tokens": ...}} sets the file's own defaults.
The prompt is the row's text joined verbatim: the context (what is compressed), then the question followed directly
by the answer prefix, with nothing added between them: put any newline or space you want in the strings. The answer
prefix is the start of the reply the model completes ("\nAnswer:"): without one an instruction-tuned model may end
its turn at once (an empty reply, flagged in the exact model's row: `reply_flag`). A row whose answer may take more
than one line (`needs_lines`) is generated past its first newline.
"""

from __future__ import annotations

import difflib

import json
from pathlib import Path
from typing import Any

from attnbench.generation.sample import MAX_ANSWER_TOKENS, Encode, Sample, TaskError
from attnbench.generation.scoring import METRICS, STRING_MATCH_ALL

DEFAULTS = {"metric": STRING_MATCH_ALL, "max_new_tokens": 50}  # a row's answer rules unless the row or file says
MAX_PROBLEMS = 10
ROW_KEYS = ("context", "question", "answers", "answer", "answer_prefix", *DEFAULTS)  # what a row's keys may set


def rule_problems(values: dict[str, Any]) -> list[str]:
    """What is wrong with a row's (or the defaults line's) metric and max_new_tokens."""
    problems = []
    if "metric" in values and values["metric"] not in METRICS:
        problems.append(f"metric must be {' or '.join(METRICS)}, not {values['metric']!r}")
    budget = values.get("max_new_tokens", 1)
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_ANSWER_TOKENS:
        problems.append(f"max_new_tokens must be a whole number from 1 to {MAX_ANSWER_TOKENS}, not {budget!r}")
    return problems


def defaults_line(row: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The file's defaults from its {"defaults": {...}} line, and what is wrong with it."""
    given = row["defaults"]
    if not isinstance(given, dict) or set(row) != {"defaults"}:
        return {}, ['a defaults line is {"defaults": {"metric": ..., "max_new_tokens": ...}} and nothing else']
    unknown = sorted(set(given) - set(DEFAULTS))
    problems = [f"defaults: unknown key {key!r} (known: {', '.join(DEFAULTS)})" for key in unknown]
    problems += [f"defaults: {problem}" for problem in rule_problems(given)]
    return {key: value for key, value in given.items() if key in DEFAULTS}, problems


def row_problems(row: dict[str, Any]) -> list[str]:
    """What is wrong with one task row."""
    problems = []
    missing = [key for key in ("context", "question") if not isinstance(row.get(key), str) or not row[key].strip()]
    if missing:
        problems.append(f"{', '.join(missing)} must be text, not empty")
    answers = row.get("answers", row.get("answer"))
    answers = [answers] if isinstance(answers, str) else answers
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a for a in answers):
        problems.append("answers must be a non-empty string or list of strings")
    if "answer_prefix" in row and not isinstance(row["answer_prefix"], str):
        problems.append(f"answer_prefix must be text, not {row['answer_prefix']!r}")
    for key in sorted(set(row) - set(ROW_KEYS)):  # other keys (a data set's id, task, length) are left alone
        close = difflib.get_close_matches(key, ROW_KEYS, n=1, cutoff=0.75)
        if close:  # but a near miss of a key that matters would silently change the row
            problems.append(f"unknown key {key!r}: did you mean {close[0]!r}?")
    return problems + rule_problems(row)


def needs_lines(answers: tuple[str, ...] | list[str], metric: str) -> bool:
    """A row's answer may take more than one line: a reference holds a newline, or several must all be found
    (string_match_all), which a model may write one a line. Such a row is generated to end of text or its budget
    whatever the grid's `stop`, so the newline rule never cuts an answer the row needs."""
    return any("\n" in answer for answer in answers) or (metric == STRING_MATCH_ALL and len(answers) > 1)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a user's task file, each checked, every problem named with its line before any work; each row
    returned with its answers as a list and its metric and max_new_tokens resolved (the row's, the file's defaults,
    or DEFAULTS)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise TaskError(f"cannot read the task file {path}: {error}") from None
    rows, problems, defaults, first = [], [], dict(DEFAULTS), True
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(f"line {number}: not JSON ({error.msg})")
            first = False
            continue
        if isinstance(row, dict) and "defaults" in row:
            given, found = defaults_line(row) if first else ({}, ["a defaults line must be the file's first"])
            defaults.update(given)
            problems += [f"line {number}: {problem}" for problem in found]
        elif not isinstance(row, dict):
            problems.append(f"line {number}: expected an object with context, question and answers")
        elif found := row_problems(row):
            problems += [f"line {number}: {problem}" for problem in found]
        else:
            answers = row.get("answers", row.get("answer"))
            rows.append({**defaults, **row, "answers": [answers] if isinstance(answers, str) else answers})
        first = False
    if problems:
        more = len(problems) - MAX_PROBLEMS
        raise TaskError(f"{path}: " + "; ".join(problems[:MAX_PROBLEMS]) + (f"; and {more} more" if more > 0 else ""))
    if not rows:
        raise TaskError(f"{path} holds no task rows (one JSON object a line: context, question, answers)")
    return rows


def jsonl_samples(name: str, rows: list[dict[str, Any]], encode: Encode,
                  answer_tokens: int | None = None) -> list[Sample]:  # fmt: skip
    """A user's rows (from `read_jsonl`) as samples, joined verbatim: the context is compressed; the question and its
    answer prefix, concatenated as given, follow it. Each answer's budget is the row's max_new_tokens, capped at the
    grid's `answer_tokens` when given."""
    samples = []
    for index, row in enumerate(rows):
        budget = row["max_new_tokens"] if answer_tokens is None else min(row["max_new_tokens"], answer_tokens)
        question = row["question"] + row.get("answer_prefix", "")  # verbatim: nothing added between them
        samples.append(Sample(name, index, encode(row["context"]), encode(question), tuple(row["answers"]),
                              answer_tokens=budget, metric=row["metric"]))  # fmt: skip
    return samples
