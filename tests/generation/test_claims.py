"""The checks of the claims judged on the real model's answers (StreamingLLM's window, SnapKV question-aware, Quest's
passkey), on rows made to hold or not hold them: accuracies compared by their Wilson intervals, and StreamingLLM's
needles placed against its window in tokens (the samples rebuilt with a character tokenizer: a token is a
character, so the positions can be read off the text by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from attnbench.generation.budgets import at_share
from attnbench.generation.tasks import build_samples
from attnbench.reproduce import needle_window
from attnbench.reproduce.checks import CANNOT, CHECKS, FAILS, HOLDS, TREND
from attnbench.reproduce.needle_window import Codec
from attnbench.runfolder.generations import COLUMNS

AGNOSTIC, AWARE = "question-agnostic", "question-aware"
CHARS = Codec(lambda text: [ord(c) for c in text], lambda ids: "".join(map(chr, ids)))
N, SAMPLES, SINKS = 2048, 10, 4
SHARES = [0.5, 0.25, 0.125]
MODEL_CODEC = needle_window.model_codec  # the real one, before the fixture swaps in characters


def frame(entries: list[tuple]) -> pd.DataFrame:
    """entries: (method, share, protocol, [(depth, score), ...])."""
    rows = []
    for method, share, protocol, samples in entries:
        for index, (depth, value) in enumerate(samples):
            rows.append(dict(key=f"{method}{share}{protocol}{index}", task="passkey", seq_len=N, protocol=protocol,
                             sample=index, method=method, variant=method, share=share, status="ok", reason="",
                             depth=depth, score=value))  # fmt: skip
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


# ---- StreamingLLM's window, in tokens ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def characters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's tokenizer: one token a character."""
    monkeypatch.setattr(needle_window, "model_codec", lambda model_dir: CHARS)


def passkeys(protocol: str = AGNOSTIC) -> list:
    return [build_samples("passkey", N, SAMPLES, CHARS.encode, indices=range(i, i + 1))[0] for i in range(SAMPLES)]


def window_of(share: float, prompt: int) -> int:
    return at_share("band", {"sinks": SINKS, "global_tokens": 0}, share, prompt)["window"]


def by_hand(sample, share: float, rule: str, protocol: str) -> str:
    """Where the needle lies against the window at the first answer token, read off the text: characters are
    tokens; kvpress keeps the prompt's last window + 1 positions and the question after it, fixed-total the last
    window + 1 positions before the answer."""
    text = "".join(map(chr, sample.context))
    value = sample.answers[0]
    start = text.index(f"The pass key is {value}.")
    needle = set(range(start, text.index(f"{value} is the pass key.", start) + len(f"{value} is the pass key.")))
    prompt = len(sample.context) + (len(sample.question) if protocol == AWARE else 0)
    answer = len(sample.context) + len(sample.question)
    window = window_of(share, prompt)
    first = (prompt if rule == "kvpress" else answer) - window - 1
    kept = set(range(SINKS)) | set(range(first, answer))
    return "inside" if needle <= kept else "outside" if not needle & kept else "cut"


def window_rows(answers: dict[float, list[bool]], rule: str = "kvpress", protocol: str = AGNOSTIC,
                exact: list[bool] | None = None) -> pd.DataFrame:  # fmt: skip
    """Rows of the exact model and of streamingllm at each share, each with the prompt length, depth, answer and
    score its rebuilt sample gives."""
    samples, rows = passkeys(), []
    said_by = [("full", None, exact or [True] * SAMPLES)] + [("streamingllm", s, a) for s, a in answers.items()]
    for method, share, said in said_by:
        for sample, right in zip(samples, said):
            prompt = len(sample.context) + (len(sample.question) if protocol == AWARE else 0)
            hparams = {} if share is None else {"sinks": SINKS, "global_tokens": 0, "window": window_of(share, prompt)}
            rows.append(dict(key=f"{method}{share}{sample.index}", task="passkey", seq_len=N, protocol=protocol,
                             sample=sample.index, method=method, variant="band" if share else "full",
                             hparams=json.dumps(hparams), share=share, status="ok", reason="", depth=sample.depth,
                             prompt_tokens=prompt, answer=sample.answers[0] if right else "1", score=float(right),
                             budget_rule=rule))  # fmt: skip
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def answering(where: set[str], rule: str = "kvpress", protocol: str = AGNOSTIC) -> dict[float, list[bool]]:
    """At each share, the needles whose place (by hand) is in `where` answered."""
    samples = passkeys()
    return {s: [by_hand(sample, s, rule, protocol) in where for sample in samples] for s in SHARES}


def check(rows: pd.DataFrame, **params):
    return CHECKS["window_retrieves_what_it_keeps"](rows, {"method": "streamingllm", **params})


def test_the_window_at_the_first_answer_token() -> None:
    """A prompt of 100, 5 question tokens after it, 4 sinks and a window of 9 (the cache holds 4 + 10): kvpress keeps
    the prompt's last 10 and the question; fixed-total the last 10 before the answer; question-aware (nothing after
    the prompt) the two agree; a prompt shorter than the window keeps it whole."""
    hparams = {"sinks": 4, "global_tokens": 0, "window": 9}
    assert needle_window.window_at_answer(hparams, "kvpress", 100, 5) == (range(4), range(90, 105))
    assert needle_window.window_at_answer(hparams, "", 100, 5) == (range(4), range(90, 105))  # before the column
    assert needle_window.window_at_answer(hparams, "fixed-total", 100, 5) == (range(4), range(95, 105))
    assert needle_window.window_at_answer(hparams, "fixed-total", 105, 0) == (range(4), range(95, 105))
    assert needle_window.window_at_answer(hparams, "kvpress", 10, 0) == (range(4), range(4, 10))
    kept = (range(4), range(90, 105))
    assert [needle_window.placement([span], kept) for span in (range(92, 99), range(40, 60), range(85, 95))] == [
        "inside", "outside", "cut"]  # fmt: skip


def test_the_needle_is_found_by_its_tokens() -> None:
    """The span is the needle sentence's characters (here tokens), both copies of the value in it."""
    sample = passkeys()[3]
    (span,) = needle_window.needle_spans(sample, CHARS)
    value = sample.answers[0]
    needle = f"The pass key is {value}. Remember it. {value} is the pass key."
    assert CHARS.decode(sample.context[span.start : span.stop]) == needle


@pytest.mark.model
def test_the_needle_is_found_by_the_models_tokens(model_dir: Path) -> None:
    """With SmolLM2's tokenizer: the span's tokens decode to the needle sentence, and no shorter span does."""
    codec = MODEL_CODEC(model_dir)
    sample = build_samples("passkey", N, SAMPLES, codec.encode, indices=range(4, 5))[0]
    (span,) = needle_window.needle_spans(sample, codec)
    value = sample.answers[0]
    needle = f"The pass key is {value}. Remember it. {value} is the pass key."
    assert needle in codec.decode(sample.context[span.start : span.stop])
    assert needle not in codec.decode(sample.context[span.start + 1 : span.stop])
    assert needle not in codec.decode(sample.context[span.start : span.stop - 1])
    assert abs(span.start / len(sample.context) - sample.depth) < 0.1  # near its depth, not at it


@pytest.mark.parametrize("rule", ["kvpress", "fixed-total"])
def test_a_window_that_answers_what_it_holds_holds(rule: str) -> None:
    rows = window_rows(answering({"inside"}, rule), rule)
    outcome = check(rows)
    assert outcome.verdict == HOLDS, outcome
    assert "0.5: " in outcome.ours and "needles outside its window 0% [0–" in outcome.ours


def test_a_window_that_answers_evicted_needles_does_not_hold() -> None:
    outcome = check(window_rows({s: [True] * SAMPLES for s in SHARES}))
    assert outcome.verdict == FAILS, outcome


def test_the_needles_are_counted_from_their_tokens_not_their_depth() -> None:
    """Answers that follow the depth (depth >= 1 - share) where the tokens say otherwise are judged by the tokens:
    the needles counted inside are those the window kept when the answer started."""
    samples = passkeys()
    by_depth = {s: [sample.depth >= 1 - s for sample in samples] for s in SHARES}
    by_tokens = answering({"inside"})
    assert by_depth != by_tokens  # the geometry differs (the template's head, the question, a cut needle)
    outcome = check(window_rows(by_tokens))
    figures = {s: f for s, f in zip(SHARES, outcome.ours.split("; "))}
    for share in SHARES:
        inside = sum(by_hand(sample, share, "kvpress", AGNOSTIC) == "inside" for sample in samples)
        assert f"answered by the exact model: {inside / SAMPLES:.0%}" in figures[share]


def test_a_cut_needle_widens_what_is_expected() -> None:
    places = {s: [by_hand(sample, s, "kvpress", AGNOSTIC) for sample in passkeys()] for s in SHARES}
    cut = [s for s in SHARES if "cut" in places[s]]
    if not cut:
        pytest.skip("no needle on a window's edge in this geometry")
    outcome = check(window_rows(answering({"inside"})))
    share = cut[0]
    least, most = (sum(p in where for p in places[share]) / SAMPLES for where in ({"inside"}, {"inside", "cut"}))
    figure = next(f for f in outcome.ours.split("; ") if f.startswith(f"{share:g}: "))
    assert figure.endswith(f"answered by the exact model: {least:.0%}–{most:.0%})")


def test_rows_made_from_other_samples_cannot_be_placed() -> None:
    """Another seed rebuilds other pass keys: the rows' answers no longer score as they did, so nothing is assumed."""
    outcome = check(window_rows(answering({"inside"})), seed=1)
    assert outcome.verdict == CANNOT and "does not match the sample rebuilt with seed 1" in outcome.detail


def test_a_method_without_a_window_cannot_be_placed() -> None:
    rows = window_rows(answering({"inside"}))
    rows.loc[rows.method == "streamingllm", "hparams"] = json.dumps({"budget": 100})
    outcome = check(rows)
    assert outcome.verdict == CANNOT and "no window" in outcome.detail


# ---- SnapKV question-aware, Quest: Wilson intervals ----------------------------------------------------------------


@pytest.mark.parametrize("aware, agnostic, verdict", [
    (1.0, 0.3, HOLDS),  # aware [72–100], agnostic [10–61]: apart
    (1.0, 0.6, TREND),  # agnostic [31–84] overlaps aware's: fewer, not clearly
    (1.0, 1.0, TREND),  # agnostic loses none
    (0.3, 0.2, FAILS),  # aware [10–61] lies clearly below the exact model's [72–100]
])  # fmt: skip
def test_question_aware_keeps_retrieval(aware: float, agnostic: float, verdict: str) -> None:
    entries = [("full", None, p, [(0.5, 1.0)] * 10) for p in (AGNOSTIC, AWARE)]
    entries += [("snapkv", 0.5, AWARE, [(0.5, aware)] * 10), ("snapkv", 0.5, AGNOSTIC, [(0.5, agnostic)] * 10)]
    params = {"method": "snapkv", "shares": [0.5]}
    outcome = CHECKS["question_aware_keeps_retrieval"](frame(entries), params)
    assert outcome.verdict == verdict, outcome
    assert "exact 100% [72–100]" in outcome.ours


def test_a_half_point_difference_at_ten_samples_is_not_a_loss() -> None:
    """0.6 against 1.0 at 10 samples: a raw 40-point gap, but the intervals overlap, so it is no clear loss."""
    entries = [("full", None, p, [(0.5, 1.0)] * 10) for p in (AGNOSTIC, AWARE)]
    entries += [("snapkv", 0.5, AWARE, [(0.5, 1.0)] * 10), ("snapkv", 0.5, AGNOSTIC, [(0.5, 0.6)] * 10)]
    outcome = CHECKS["question_aware_keeps_retrieval"](frame(entries), {"method": "snapkv", "shares": [0.5]})
    assert "intervals overlap" in outcome.detail


@pytest.mark.parametrize("quest, others, verdict", [
    (0.9, 0.1, HOLDS),  # quest [60–99] against [2–41]: apart, and not clearly below the exact model
    (0.6, 0.3, TREND),  # it leads, but [31–84] and [11–61] overlap
    (0.3, 0.3, FAILS),
])  # fmt: skip
def test_quest_keeps_where_others_fail(quest: float, others: float, verdict: str) -> None:
    entries = [("full", None, AGNOSTIC, [(0.5, 1.0)] * 10), ("quest", 0.0625, AGNOSTIC, [(0.5, quest)] * 10)]
    entries += [(m, 0.0625, AGNOSTIC, [(0.5, others)] * 10) for m in ("h2o", "streamingllm")]
    params = {"method": "quest", "others": ["h2o", "streamingllm"], "shares": [0.0625]}
    assert CHECKS["quest_keeps_where_others_fail"](frame(entries), params).verdict == verdict


def test_a_share_without_rows_cannot_be_judged() -> None:
    entries = [("full", None, AGNOSTIC, [(0.5, 1.0)] * 10), ("quest", 0.0625, AGNOSTIC, [(0.5, 1.0)] * 10)]
    params = {"method": "quest", "others": [], "shares": [0.0625, 0.03125]}
    outcome = CHECKS["quest_keeps_where_others_fail"](frame(entries), params)
    assert outcome.verdict == CANNOT and "quest at 0.03125" in outcome.detail


def test_a_failed_generation_makes_the_claim_unrunnable() -> None:
    rows = frame([("full", None, AGNOSTIC, [(0.5, 1.0)]), ("quest", 0.0625, AGNOSTIC, [(0.5, 1.0)])])
    rows.loc[1, ["status", "reason"]] = ["error", "RuntimeError: boom"]
    outcome = CHECKS["quest_keeps_where_others_fail"](rows, {"method": "quest", "others": [], "shares": [0.0625]})
    assert outcome.verdict == CANNOT and "boom" in outcome.detail
