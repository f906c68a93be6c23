"""Task construction, with a character-level tokenizer (one token a character): prompts fit N, the asked needle sits at
its depth, distractors differ, everything follows the seed, the grid's answer cap leaves the prompt alone; a user's
JSONL rows joined verbatim, their metric and answer budget read per row or from a defaults line, every problem named
by its line. RULER's templates and metrics themselves: test_ruler_tasks.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attnbench.generation.tasks import (
    ALIASES,
    HAYSTACK,
    TASKS,
    TaskError,
    build_samples,
    jsonl_samples,
    read_jsonl,
    text_tokens,
)


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids) -> str:
    return "".join(map(chr, ids))


def whole(sample) -> int:
    """What N counts: the context, the question and the task's own answer budget, as RULER does."""
    return len(sample.context) + len(sample.question) + TASKS[sample.task].answer_tokens


@pytest.mark.parametrize("task", ["passkey", "niah_single_1", "niah_multikey_2", "vt"])
@pytest.mark.parametrize("n", [2048, 4096])
def test_line_haystack_prompts_fit_n_and_hold_the_asked_value_at_its_depth(task: str, n: int) -> None:
    samples = build_samples(task, n, 5, encode, seed=3)
    for sample in samples:
        assert n - 130 <= whole(sample) <= n  # filled to N, less than one haystack line (or uuid needle) short
        context = decode(sample.context)
        for value in sample.answers:
            assert value in context
        if sample.depth is None:  # vt: the chain lies anywhere, as RULER places it
            continue
        lines = context.split("\n")[1:]  # after the template's first line
        where = next(i for i, line in enumerate(lines) if sample.answers[0] in line) / (len(lines) - 1)
        assert abs(where - sample.depth) < 2 / len(lines), (where, sample.depth)
    if task != "vt":
        assert [s.depth for s in samples] == [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize("task", ["niah_single_2", "niah_multivalue", "niah_multiquery"])
def test_essay_needles_lie_at_their_depth_between_sentences(task: str) -> None:
    for sample in build_samples(task, 3000, 3, encode, seed=1):
        assert 3000 - 20 <= whole(sample) <= 3000  # a word of the essay at a time
        context = decode(sample.context)
        start = context.index("\n") + 1  # the haystack, after the template's first line
        where = (context.index(sample.answers[0]) - start) / (len(context) - start)
        assert abs(where - sample.depth) < 0.1, (where, sample.depth)
        assert f"One of the special magic numbers for {decode(sample.question).split(' for ')[1].split(' ')[0].strip(',')} is: " in context


def test_multikey_distractors_have_their_own_keys_and_values() -> None:
    for task, needles in (("niah_multikey_1", 4), ("niah_multikey_2", None), ("niah_multikey_3", None)):
        (sample,) = build_samples(task, 2048, 1, encode, seed=0)
        context, question = decode(sample.context), decode(sample.question)
        found = [part for part in context.replace("\n", ". ").split(". ") if part.startswith("One of the special magic")]
        assert needles is None or len(found) == needles
        keys = [line.split(" for ")[1].split(" is:")[0] for line in found]
        assert len(set(keys)) == len(keys) > 1
        asked = question.split(" for ")[1].split(" mentioned")[0]
        assert asked in keys and sum(sample.answers[0] in line for line in found) == 1


def test_samples_follow_the_seed_and_aliases_are_the_ruler_tasks() -> None:
    one = build_samples("niah_single_1", 1000, 3, encode, seed=1)
    assert one == build_samples("niah_single_1", 1000, 3, encode, seed=1)
    assert one != build_samples("niah_single_1", 1000, 3, encode, seed=2)
    assert len({s.answers for s in one}) == 3
    assert build_samples("niah_single_1", 1000, 3, encode, seed=1, indices=range(1, 2)) == one[1:2]
    assert ALIASES == {"niah_single": "niah_single_1", "niah_multikey": "niah_multikey_1"}
    for alias, name in ALIASES.items():
        aliased, original = (build_samples(task, 1500, 2, encode, seed=5) for task in (alias, name))
        assert [s.task for s in aliased] == [alias, alias]  # the rows keep the name asked
        assert [(s.context, s.question, s.answers) for s in aliased] == [(s.context, s.question, s.answers) for s in original]


def test_the_grid_cap_limits_the_answer_not_the_prompt() -> None:
    own = build_samples("niah_multivalue", 1500, 2, encode, seed=0)
    capped = build_samples("niah_multivalue", 1500, 2, encode, seed=0, answer_tokens=12)
    assert [s.answer_tokens for s in own] == [128, 128] and [s.answer_tokens for s in capped] == [12, 12]
    assert [s.context + s.question for s in own] == [s.context + s.question for s in capped]
    assert build_samples("passkey", 600, 1, encode, answer_tokens=50)[0].answer_tokens == 8  # a cap, never a raise


def test_continuation_is_the_text_that_follows_the_context() -> None:
    text = text_tokens(encode)
    for sample in build_samples("continuation", 500, 3, encode, seed=0, continuation_tokens=40):
        assert len(sample.context) == 460 and len(sample.continuation) == 40 and not sample.answers
        joined = decode(sample.context) + decode(sample.continuation)
        assert joined in decode(text)


def test_a_length_the_task_cannot_fill_is_refused() -> None:
    with pytest.raises(TaskError, match="cannot give"):
        build_samples("continuation", 10**7, 1, encode)
    with pytest.raises(TaskError, match="niah_multikey_1 needs more than 300 tokens"):
        build_samples("niah_multikey", 300, 1, encode)
    with pytest.raises(TaskError, match="vt needs more than 900 tokens"):  # its worked example alone takes 500
        build_samples("vt", 900, 1, encode)
    with pytest.raises(TaskError, match="fwe needs N of at least 250"):
        build_samples("fwe", 240, 1, encode)
    assert HAYSTACK.startswith("The grass is green.")


# ---- a user's JSONL ----------------------------------------------------------------------------------------------


def write(path: Path, *rows) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n\n")
    return path


def test_jsonl_rows_become_samples_joined_verbatim(tmp_path: Path) -> None:
    path = write(tmp_path / "mine.jsonl",
                 {"context": "The code is 42.", "question": "What is the code?", "answers": ["42"]},
                 {"context": "Paris is in France.\n", "question": "Where is Paris?", "answer": "France", "answer_prefix": " It is in"})  # fmt: skip
    samples = jsonl_samples("jsonl:" + str(path), read_jsonl(path), encode)
    assert [s.answers for s in samples] == [("42",), ("France",)]
    assert decode(samples[0].context) == "The code is 42." and decode(samples[0].question) == "What is the code?"
    assert decode(samples[1].context) == "Paris is in France.\n"  # kvpress's join: the strings as given, nothing added
    assert decode(samples[1].question) == "Where is Paris? It is in"
    assert [(s.metric, s.answer_tokens) for s in samples] == [("string_match_all", 50)] * 2


def test_jsonl_metric_and_budget_per_row_over_the_files_defaults(tmp_path: Path) -> None:
    path = write(tmp_path / "rules.jsonl",
                 {"defaults": {"metric": "string_match_part", "max_new_tokens": 20}},
                 {"context": "c", "question": "q", "answers": ["a", "b"]},
                 {"context": "c", "question": "q", "answers": ["a"], "metric": "string_match_all", "max_new_tokens": 7})  # fmt: skip
    rows = read_jsonl(path)
    assert len(rows) == 2  # the defaults line is not a sample
    samples = jsonl_samples("mine", rows, encode)
    assert [(s.metric, s.answer_tokens) for s in samples] == [("string_match_part", 20), ("string_match_all", 7)]
    assert [s.answer_tokens for s in jsonl_samples("mine", rows, encode, answer_tokens=10)] == [10, 7]  # the grid caps


def test_bad_jsonl_rows_are_named_by_line_before_any_work(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.jsonl",
                 {"context": "a", "question": "b", "answers": ["c"]}, "not json", "[1]",
                 {"context": 3, "answers": []},
                 {"context": "a", "question": "b", "answers": "c", "metric": "exact", "max_new_tokens": 0},
                 {"context": "a", "question": "b", "answers": "c", "max_new_tokens": True, "answer_prefix": 4},
                 {"context": "a", "question": "b", "answers": "c", "max_new_tokens": 129},
                 {"defaults": {"metric": "string_match_part"}})  # fmt: skip
    with pytest.raises(TaskError) as error:
        read_jsonl(path)
    message = str(error.value)
    assert "line 2: not JSON" in message and "line 3" in message and "line 4: context, question must be text, not empty" in message
    assert "line 4: answers must be" in message and "line 1" not in message
    assert "line 5: metric must be string_match_all or string_match_part, not 'exact'" in message
    assert "line 5: max_new_tokens must be a whole number from 1 to 128, not 0" in message
    assert "line 6: max_new_tokens must be a whole number from 1 to 128, not True" in message
    assert "line 6: answer_prefix must be text" in message and "line 7: max_new_tokens" in message
    assert "line 8: a defaults line must be the file's first" in message
    empty = write(tmp_path / "empty.jsonl", "")
    with pytest.raises(TaskError, match="no task rows"):
        read_jsonl(empty)
    with pytest.raises(TaskError, match="cannot read"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_a_bad_defaults_line_is_named(tmp_path: Path) -> None:
    row = {"context": "a", "question": "b", "answers": "c"}
    for defaults, expected in (({"metric": "part"}, "line 1: defaults: metric must be"),
                               ({"max_tokens": 5}, "line 1: defaults: unknown key 'max_tokens'"),
                               ({"max_new_tokens": 500}, "line 1: defaults: max_new_tokens must be"),
                               ([1], "line 1: a defaults line is")):  # fmt: skip
        with pytest.raises(TaskError, match=expected):
            read_jsonl(write(tmp_path / "d.jsonl", {"defaults": defaults}, row))
    with pytest.raises(TaskError, match="line 1: a defaults line is"):
        read_jsonl(write(tmp_path / "d.jsonl", {"defaults": {}, "context": "x"}, row))
