"""A verdict over a run that planted needles answers both uses it measured: continuation (error alone) and retrieval
(needle recall at least `RETRIEVAL_RECALL`), so a window whose error is small but which loses the needles is never
the only answer (attnbench.report.verdict.with_retrieval, attnbench.plan.budget)."""

from __future__ import annotations

from dataclasses import replace

from attnbench.plan.budget import RETRIEVAL_RECALL, AccuracyBudget
from attnbench.report.modes import FORWARD
from attnbench.report.verdict import Choice, judge, weighs_retrieval, with_retrieval


def choice(label: str, family: str, speedup: float, error: float, recall: float) -> Choice:
    return Choice(label, family, speedup, 0.95 * speedup, 1.05 * speedup, error, 1e6, 1.0, "–", time_s=1e-3 / speedup,
                  recall=recall)  # fmt: skip


def candidates() -> list[Choice]:
    return [choice("full", "exact", 1.0, 0.0, 1.0), choice("band(window=256)", "band", 3.2, 0.18, 0.062),
            choice("band(window=4096)", "band", 1.6, 0.05, 0.94)]  # fmt: skip


def answer_both(budget: AccuracyBudget = AccuracyBudget()) -> tuple:
    found = candidates()
    answer = judge(8192, found, "full", budget, "heads")
    assert answer is not None and weighs_retrieval(found, budget)
    return with_retrieval(answer, found, "full", budget, "heads", FORWARD), found


def test_a_window_that_loses_the_needles_answers_continuation_only() -> None:
    both, _ = answer_both()
    assert RETRIEVAL_RECALL == 0.9
    assert both.use == "band(window=256)" and both.retrieval_use == "band(window=4096)"
    continuation, retrieval = both.sentence.split(" For retrieval (needle recall at least 90%): ")
    assert continuation.startswith("For continuation (error alone): Use band(window=256)")
    assert retrieval.startswith("Use band(window=4096)")


def test_nothing_retrieves_says_so_with_each_recall() -> None:
    found = [c for c in candidates() if c.label != "band(window=4096)"]
    answer = judge(8192, found, "full", AccuracyBudget(), "heads")
    both = with_retrieval(answer, found, "full", AccuracyBudget(), "heads", FORWARD)
    assert both.retrieval_use == ""
    assert "For retrieval (needle recall at least 90%): Nothing beats full here" in both.sentence
    assert "band(window=256) 6.2%" in both.sentence  # its recall, where it is left out


def test_the_continuation_answer_keeps_its_choices_and_reasons() -> None:
    both, found = answer_both()
    alone = judge(8192, [replace(c, left_out="", ties=[]) for c in candidates()], "full", AccuracyBudget(), "heads")
    assert [c.label for c in both.choices] == [c.label for c in alone.choices]
    assert [c.left_out for c in both.left_out] == [c.left_out for c in alone.left_out]


def test_min_speedup_is_answered_for_both_uses_each_after_its_own_answer() -> None:
    both, _ = answer_both(AccuracyBudget(min_speedup=2))
    continuation, retrieval = both.sentence.split(" For retrieval (needle recall at least 90%): ")
    assert both.asked == ""  # said inside each use's answer
    assert "At least 2× faster than full, least error: band(window=256)" in continuation
    assert "At least 2× faster than full (leaving out band(window=256): needle recall below 90%)" in retrieval


def test_a_recall_the_user_asked_is_the_one_answer_and_no_recall_measured_gives_one_answer() -> None:
    found = candidates()
    assert not weighs_retrieval(found, AccuracyBudget(min_recall=0.5))
    unmeasured = [replace(c, recall=float("nan")) for c in found]
    assert not weighs_retrieval(unmeasured, AccuracyBudget())
    assert AccuracyBudget(min_recall=0.5).for_retrieval.min_recall == 0.5


def test_min_speedup_when_nothing_retrieves_says_none_is_left() -> None:
    found = [c for c in candidates() if c.label != "band(window=4096)"]
    budget = AccuracyBudget(min_speedup=2)
    both = with_retrieval(judge(8192, found, "full", budget, "heads"), found, "full", budget, "heads", FORWARD)
    assert both.sentence.endswith("At least 2× faster than full (leaving out band(window=256): needle recall below "
                                  "90%): none is left.")  # fmt: skip
