"""Task construction and scoring, with a character-level tokenizer (one token a character): contexts fit N, the asked
needle sits at its depth, distractors differ, everything follows the seed; RULER's string match; a user's JSONL rows
checked whole, every problem named by its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attnbench.generation.tasks import HAYSTACK, TASKS, TaskError, build_samples, jsonl_samples, read_jsonl, score, text_tokens


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids) -> str:
    return "".join(map(chr, ids))


@pytest.mark.parametrize("task", ["passkey", "niah_single", "niah_multikey"])
@pytest.mark.parametrize("n", [900, 2048])
def test_needle_contexts_fit_n_and_hold_the_asked_value_at_its_depth(task: str, n: int) -> None:
    samples = build_samples(task, n, 5, encode, seed=3)
    spec = TASKS[task]
    for sample in samples:
        context = decode(sample.context)
        whole = len(sample.context) + len(sample.question) + spec.answer_tokens  # N counts them all, as RULER does
        assert n - 200 <= whole <= n  # filled to N, less than one haystack group short
        (value,) = sample.answers
        assert len(value) == spec.digits and value in context
        haystack = len(context) - len(spec.intro)
        where = (context.index(value) - len(spec.intro)) / haystack  # the needle's place in the haystack
        slack = (len(HAYSTACK) + len(spec.needle) + 40) / haystack  # a needle goes between sentence groups
        assert abs(where - sample.depth) < slack, (where, sample.depth)
        assert decode(sample.question).startswith("\n") and "?" in decode(sample.question)
    assert [s.depth for s in samples] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_multikey_distractors_have_their_own_keys_and_values() -> None:
    (sample,) = build_samples("niah_multikey", 2048, 1, encode, seed=0)
    context, question = decode(sample.context), decode(sample.question)
    needles = [line for line in context.split(". ") if "special magic numbers for" in line]
    assert len(needles) == 1 + TASKS["niah_multikey"].distractors
    keys = [line.split(" for ")[1].split(" is")[0] for line in needles]
    assert len(set(keys)) == len(keys)
    asked = question.split("number for ")[1].split(" mentioned")[0]
    assert asked in keys and sum(sample.answers[0] in line for line in needles) == 1


def test_samples_follow_the_seed() -> None:
    one = build_samples("niah_single", 1000, 3, encode, seed=1)
    assert one == build_samples("niah_single", 1000, 3, encode, seed=1)
    assert one != build_samples("niah_single", 1000, 3, encode, seed=2)
    assert len({s.answers for s in one}) == 3
    assert build_samples("niah_single", 1000, 3, encode, seed=1, indices=range(1, 2)) == one[1:2]


def test_continuation_is_the_text_that_follows_the_context() -> None:
    text = text_tokens(encode)
    for sample in build_samples("continuation", 500, 3, encode, seed=0, continuation_tokens=40):
        assert len(sample.context) == 460 and len(sample.continuation) == 40 and not sample.answers
        joined = decode(sample.context) + decode(sample.continuation)
        assert joined in decode(text)


def test_a_length_the_task_cannot_fill_is_refused() -> None:
    with pytest.raises(TaskError, match="cannot give"):
        build_samples("continuation", 10**7, 1, encode)
    with pytest.raises(TaskError, match="niah_multikey needs more than 300 tokens"):
        build_samples("niah_multikey", 300, 1, encode)


@pytest.mark.parametrize(
    "answer, references, expected",
    [(" 4119073.", ("4119073",), 1.0), ("4119", ("4119073",), 0.0), ("The Key is ABC", ("abc", "xyz"), 0.5), ("", ("1",), 0.0)],
)
def test_score_is_rulers_string_match(answer: str, references: tuple, expected: float) -> None:
    assert score(answer, references) == expected


def test_jsonl_rows_become_samples(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    rows = [{"context": "The code is 42.", "question": "What is the code?", "answers": ["42"]},
            {"context": "Paris is in France.", "question": "Where is Paris?", "answer": "France", "answer_prefix": "It is in"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    samples = jsonl_samples("jsonl:" + str(path), read_jsonl(path), encode)
    assert [s.answers for s in samples] == [("42",), ("France",)]
    assert decode(samples[1].question) == "\nWhere is Paris? It is in"
    assert decode(samples[0].context) == "The code is 42."


def test_bad_jsonl_rows_are_named_by_line_before_any_work(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"context": "a", "question": "b", "answers": ["c"]}\nnot json\n[1]\n{"context": 3, "answers": []}\n')
    with pytest.raises(TaskError) as error:
        read_jsonl(path)
    message = str(error.value)
    assert "line 2: not JSON" in message and "line 3" in message and "line 4: context, question must be text, not empty" in message
    assert "line 4: answers must be" in message and "line 1" not in message
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TaskError, match="no task rows"):
        read_jsonl(empty)
    with pytest.raises(TaskError, match="cannot read"):
        read_jsonl(tmp_path / "missing.jsonl")
