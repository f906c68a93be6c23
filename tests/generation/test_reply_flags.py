"""A user's JSONL rows are never silently zero: the exact model's reply that could not hold the answer (empty, cut at
the newline rule, cut at its budget) is flagged in its row (`reply_flag`) and named with what to do in the report and
the terminal summary; a row whose answers may take more than one line is generated past its first newline."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from attnbench.generation import unit as unit_module
from attnbench.generation.decoder import RowResult
from attnbench.generation.grid import GenerationGrid, Unit, parse_grid
from attnbench.generation.tasks import Sample, needs_lines
from attnbench.generation.unit import UnitJob, run_unit, stops_at_newline
from attnbench.report.generation import FLAG_ADVICE, flag_lines, terminal_summary, write_generation_report
from attnbench.runfolder.generations import COLUMNS, REPLY_FLAGS

GRID = {"name": "g", "tasks": ["passkey"], "seq_lens": [256], "samples": 1, "keep": [0.5]}
CONTEXT = "Alice lives in Paris. Bob lives in Berlin. The weather is mild and the trains run on time. " * 4


class CharTokenizer:
    """One token a character."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, tokens))


class ScriptedDecoder:
    """Writes after each question the reply its script gives (every method alike), under the real decoder's stop
    rule: with `stop_lines` a newline ends an answer once it has begun; at most `new_tokens`. Asked to go on past a
    reply (the reply already in the prompt), it writes the rest."""

    def __init__(self, script: dict[str, str]) -> None:
        self.script, self.phases, self.calls = script, {}, 0

    def run(self, methods: list, prompt: torch.Tensor, *, follow: torch.Tensor | None = None, new_tokens: int = 0,
            stop_lines: bool = True, **_: object) -> list[RowResult]:  # fmt: skip
        self.calls += 1
        text = "".join(map(chr, prompt.tolist() + ([] if follow is None else follow.tolist())))
        question = next(q for q in self.script if q in text)
        reply = self.script[question][len(text) - text.index(question) - len(question):]
        if stop_lines:
            reply = next((reply[:i] for i, c in enumerate(reply) if c == "\n" and reply[:i]), reply)
        return [RowResult(tokens=[ord(c) for c in reply[:new_tokens]]) for _ in methods]


ROWS = [  # (the row, what the exact model writes after its question, the flag)
    ({"question": "\nWhere does Alice live?", "answers": ["Paris"]}, "", "empty"),
    ({"question": "\nWhere does Bob live?", "answers": ["Berlin"]}, "The answer is:\nBerlin", "cut at stop"),
    ({"question": "\nWho lives in Paris?", "answers": ["Alice"], "max_new_tokens": 5}, "It is Alice", "cut at budget"),
    ({"question": "\nWho lives in Berlin?", "answer_prefix": "\nAnswer:", "answers": ["Bob"]}, " Bob\nand more", ""),
    ({"question": "\nName both cities, one a line.", "answers": ["Paris", "Berlin"]}, "Paris\nBerlin", ""),
    ({"question": "\nIs it mild?", "answers": ["yes"]}, "Perhaps.\nNo.", ""),  # wrong on every line: not cut
]  # fmt: skip


def write_rows(path: Path) -> Path:
    path.write_text("".join(json.dumps({"context": CONTEXT, **row}) + "\n" for row, _, _ in ROWS))
    return path


def jsonl_grid(path: Path, **changes: object) -> GenerationGrid:
    raw = {"name": "g", "tasks": [f"jsonl:{path}"], "seq_lens": [256], "samples": 1, "block": 10, "keep": [0.5],
           "methods": ["streamingllm"], **changes}  # fmt: skip
    return parse_grid(raw)


def test_the_exact_model_s_row_carries_why_its_reply_could_not_hold_the_answer(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    grid = jsonl_grid(write_rows(tmp_path / "rows.jsonl"))
    script = {row["question"] + row.get("answer_prefix", ""): reply for row, reply, _ in ROWS}
    monkeypatch.setattr(unit_module, "loaded", lambda *_: (None, CharTokenizer(), ScriptedDecoder(script)))
    (unit,) = grid.units()
    rows = run_unit(UnitJob(grid, unit, "no-model")).rows
    exact = [row for row in rows if row.method == "full"]
    assert [row.reply_flag for row in exact] == [flag for _, _, flag in ROWS]
    assert {row.reply_flag for row in rows if row.method != "full"} == {""}  # the exact model's row alone
    assert exact[4].answer == "Paris\nBerlin" and exact[4].score == 1.0  # two lines, both kept
    assert exact[1].answer == "The answer is:" and exact[3].answer == "Bob"  # the newline rule otherwise


def flag_of(reply: str, then: str = "", stop: str = "newline", answers: tuple[str, ...] = ("Paris",),
            task: str = "jsonl:/rows.jsonl") -> tuple[str, int]:  # fmt: skip
    """The flag of the exact model's reply to one sample, and how often the decoder was asked to go on."""
    grid = dataclasses.replace(parse_grid({**GRID, "methods": ["full"]}), stop=stop)
    sample = Sample(task, 0, [ord("c")], [ord("?")], answers, answer_tokens=12)
    decoder = ScriptedDecoder({"?": reply + then})
    settings = grid.settings(1)
    methods = [object()]
    job = UnitJob(grid, Unit(task, 0, "question-agnostic", (0,)), "no-model")
    results = [RowResult(tokens=[ord(c) for c in reply])]
    flag = unit_module.exact_reply_flag(decoder, job, sample, sample.context + sample.question, methods, settings,
                                        results, CharTokenizer())  # fmt: skip
    return flag, decoder.calls


@pytest.mark.parametrize("reply, then, stop, flag, asked", [
    ("", "", "newline", "empty", 0),
    ("Paris", "", "newline", "", 0),  # found: nothing to check
    ("It is, I say", "", "newline", "cut at budget", 0),  # its 12 tokens, no answer yet
    ("It is", "\nParis", "newline", "cut at stop", 1),  # the answer on the next line
    ("\n", "\nParis", "newline", "cut at stop", 1),  # a newline first, then the stop: the answer after it
    ("It is", "\nRome", "newline", "", 1),  # going on brings nothing: a wrong answer, not a cut one
    ("\n", "", "newline", "empty", 1),
    ("It is", "", "end-of-text", "", 0),  # no newline rule: it ended at end of text
])  # fmt: skip
def test_a_reply_is_flagged_only_where_the_rule_or_budget_kept_the_answer_out(reply: str, then: str, stop: str,
                                                                               flag: str, asked: int) -> None:  # fmt: skip
    assert flag_of(reply, then, stop) == (flag, asked)


def test_only_a_user_s_multi_line_answers_run_past_the_first_newline() -> None:
    grid = parse_grid({**GRID, "methods": ["full"]})
    two = Sample("t", 0, [], [], ("Paris", "Berlin"))
    for task, stops in (("jsonl:/rows.jsonl", False), ("niah_multivalue", True)):  # built-in answers are one line
        assert stops_at_newline(grid, Unit(task, 0, "question-agnostic", (0,)), two) is stops
    assert needs_lines(["Paris", "Berlin"], "string_match_all") and needs_lines(["two\nlines"], "string_match_part")
    assert not needs_lines(["Paris", "Paree"], "string_match_part") and not needs_lines(["Paris"], "string_match_all")
    end = dataclasses.replace(grid, stop="end-of-text")
    passkey = Sample("passkey", 0, [], [], ("1",))
    assert not stops_at_newline(end, Unit("passkey", 256, "question-agnostic", (0,)), passkey)


def flagged_rows() -> pd.DataFrame:
    task = "jsonl:/rows.jsonl"
    out = [dict(key=f"{method}{sample}", task=task, seq_len=0, protocol="question-agnostic", sample=sample, method=method,
                variant=method, hparams="{}", prefill="dense", dense_layers=0, decode="own", share=None, status="ok",
                reason="", score=0.0, cache_share=1.0, read_share=1.0, answer="", metric="string_match_all",
                reply_flag=flag if method == "full" else "")
           for sample, flag in enumerate(["empty", "empty", "cut at budget", ""]) for method in ("full", "h2o")]  # fmt: skip
    return pd.DataFrame(out).reindex(columns=COLUMNS)


def test_the_report_and_the_summary_name_the_flagged_rows_and_what_to_do(tmp_path: Path) -> None:
    rows = flagged_rows()
    lines = flag_lines(rows)
    assert lines == [
        f"**Flagged replies**: jsonl:/rows.jsonl: the exact model's reply is empty in 2 of its 4 answers (`reply_flag` "
        f"in generations.csv): {FLAG_ADVICE['empty']}.",
        f"**Flagged replies**: jsonl:/rows.jsonl: the exact model's reply is cut at budget in 1 of its 4 answers "
        f"(`reply_flag` in generations.csv): {FLAG_ADVICE['cut at budget']}.",
    ]  # fmt: skip
    assert "answer_prefix" in FLAG_ADVICE["empty"] and "max_new_tokens" in FLAG_ADVICE["cut at budget"]
    assert set(FLAG_ADVICE) == set(REPLY_FLAGS)
    summary = terminal_summary(rows, 200)
    assert "Flagged replies: jsonl:/rows.jsonl: the exact model's reply is empty in 2 of its 4 answers" in summary
    report = write_generation_report(tmp_path, rows, {}).read_text()
    assert lines[0] in report and lines[1] in report
    assert flag_lines(rows.assign(reply_flag="")) == [] and flag_lines(rows.drop(columns="reply_flag")) == []


MODEL_ROWS = [  # (the row, the flag of SmolLM2-135M-Instruct's own reply to it)
    ({"question": "\nWhere does Alice live?", "answers": ["Paris"]}, "empty"),  # no answer prefix: it ends its turn
    ({"question": "\nQ: Where does Alice live?\nA: Let me think step by step.", "answers": ["Paris"]}, "cut at stop"),
    ({"question": "\nQuestion: Where does Alice live?\nAnswer:\n", "answers": ["Paris"], "max_new_tokens": 3},
     "cut at budget"),  # "The answer is" of "The answer is: Paris"
    ({"question": "\nWhere does Alice live?", "answer_prefix": "\nAnswer: Alice lives in", "answers": ["Paris"]}, ""),
]  # fmt: skip


@pytest.mark.model
def test_the_real_model_s_replies_are_flagged(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"context": CONTEXT, **row}) + "\n" for row, _ in MODEL_ROWS))
    grid = jsonl_grid(path, methods=["full"])
    (unit,) = grid.units()
    outcome = run_unit(UnitJob(grid, unit, str(model_dir)))
    assert [(row.reply_flag, row.status) for row in outcome.rows] == [(flag, "ok") for _, flag in MODEL_ROWS]
    assert outcome.rows[-1].score == 1.0 and outcome.phases["reply check"] > 0


def test_a_built_in_task_s_miss_is_the_model_s_and_only_an_empty_reply_is_flagged() -> None:
    """RULER's own budget and stop: a reply at its budget with no answer (a loop of words) is a wrong answer, not a
    row to mend; nothing more is generated to check it."""
    assert flag_of("It is, I say", task="niah_multiquery") == ("", 0)
    assert flag_of("It is", "\nParis", task="niah_multiquery") == ("", 0)
    assert flag_of("", task="niah_multiquery") == ("empty", 0)
