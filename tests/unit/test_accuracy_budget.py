"""The accuracy budget on constructed rows: "Use X" only within it, the fastest within it named, every variant over it
left out with that reason, the input its error comes from said, and `min_speedup` answered with the least error
among the variants fast enough (attnbench.plan.budget, attnbench.report.verdict)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from attnbench.plan.budget import DEFAULT_MAX_ERROR, AccuracyBudget, budget_problems
from attnbench.plan.config import ConfigError, parse_config
from attnbench.report.verdict import Choice, judge, verdict_blocks, verdict_markdown, verdicts
from attnbench.runfolder.results import read_results
from helpers import synthetic_run, tiny

NAN = float("nan")


def choice(label: str, family: str, speedup: float, low: float, high: float, error: float) -> Choice:
    return Choice(label, family, speedup, low, high, error, 1e6, 1.0, "–", time_s=1e-3 / speedup)


def full() -> Choice:
    return choice("full", "exact", 1.0, 1.0, 1.0, 0.0)


def test_a_variant_within_the_budget_is_recommended_and_the_sentence_names_its_input() -> None:
    answer = judge(4096, [full(), choice("band", "band", 3.0, 2.8, 3.2, 0.3)], "full", AccuracyBudget(), "realistic")
    assert answer.use == "band"
    assert answer.sentence == (
        "Use band, the fastest within the error budget 0.5: 3× [2.8–3.2] faster than full at error 0.3 vs uniform "
        "on `realistic`, 1× the peak memory of a call."
    )


def test_a_fast_variant_over_the_budget_is_never_recommended_and_says_why() -> None:
    """The case behind the budget: nystromformer at error 0.78 keeps ~22% of what attention adds over averaging V."""
    answer = judge(1024, [full(), choice("nystromformer", "low-rank", 4.0, 3.3, 4.5, 0.778)], "full")
    assert answer.use == "" and not answer.sentence.startswith("Use")
    assert [c.label for c in answer.choices] == ["full"]
    (over,) = answer.left_out
    assert over.left_out == f"over the error budget {DEFAULT_MAX_ERROR:g}"
    looser = judge(1024, [full(), choice("nystromformer", "low-rank", 4.0, 3.3, 4.5, 0.778)], "full",
                   AccuracyBudget(max_error=0.8))  # fmt: skip
    assert looser.use == "nystromformer" and looser.sentence.startswith("Use nystromformer, the fastest within the "
                                                                        "error budget 0.8")  # fmt: skip


def test_the_fastest_within_the_budget_is_named_and_a_faster_one_over_it_is_said_to_be() -> None:
    answer = judge(
        4096,
        [
            full(),
            choice("linformer", "low-rank", 3.0, 2.8, 3.2, 0.4),
            choice("band", "band", 2.0, 1.9, 2.1, 0.2),
            choice("nystromformer", "low-rank", 6.0, 5.5, 6.5, 0.7),
        ],
        "full",
        on="realistic",
    )
    assert answer.use == "linformer"
    assert answer.sentence == (
        "Use linformer, the fastest within the error budget 0.5: 3× [2.8–3.2] faster than full at error 0.4 vs "
        "uniform on `realistic`, 1× the peak memory of a call; band is more accurate (0.2) at 2× [1.9–2.1]; nystromformer is "
        "faster (6× [5.5–6.5]) but over the budget (error 0.7)."
    )


def test_when_none_is_within_the_budget_the_verdict_says_so_with_the_least_error_and_its_speed() -> None:
    answer = judge(
        4096,
        [
            full(),
            choice("nystromformer", "low-rank", 12.6, 11.0, 15.9, 0.696),
            choice("topk", "topk", 1.32, 1.28, 1.5, 0.755),
            choice("linear", "linear", 22.3, 17.6, 26.4, 0.999),
        ],
        "full",
        on="realistic",
    )
    assert answer.use == ""
    assert answer.sentence == (
        "Nothing within the error budget 0.5 beats full here: no approximation has error vs uniform on `realistic` "
        "of 0.5 or less; the least is nystromformer's 0.696, at 12.6× [11–15.9]."
    )
    assert {c.label: c.left_out for c in answer.left_out} == {
        "nystromformer": "over the error budget 0.5",
        "topk": "over the error budget 0.5",
        "linear": "no better than averaging V",
    }


def test_a_variant_within_the_budget_but_slower_leaves_the_others_named_by_reason() -> None:
    answer = judge(
        1024,
        [full(), choice("bigbird", "bigbird", 0.8, 0.6, 0.95, 0.44), choice("band", "band", 1.5, 1.2, 1.8, 0.54)],
        "full",
        on="realistic",
    )
    assert answer.use == ""
    assert answer.sentence == (
        "Nothing beats full here: the approximate variants are slower (bigbird) or over the error budget 0.5 on "
        "`realistic` (band)."
    )


def test_no_budget_and_no_rows_ever_recommend_a_variant_over_it() -> None:
    """A property over random rows: whatever "Use X" names is exact or has a measured error within the budget."""
    rng = random.Random(7)
    for _ in range(300):
        budget = AccuracyBudget(max_error=rng.choice([0.1, 0.3, 0.5, 0.8, 2.0]))
        rows = [full()]
        for i in range(rng.randint(1, 5)):
            speedup = rng.uniform(0.3, 20)
            error = rng.choice([rng.uniform(0, 1.5), NAN])
            rows.append(choice(f"v{i}", "approx", speedup, 0.9 * speedup, 1.1 * speedup, error))
        answer = judge(1024, rows, "full", budget)
        chosen = next((c for c in rows if c.label == answer.use), None)
        if chosen is not None:
            assert chosen.family == "exact" or chosen.error <= budget.max_error
        assert all(c.family == "exact" or not c.error > budget.max_error for c in answer.choices)
        assert answer.sentence.startswith("Use ") == bool(answer.use)


def test_min_speedup_answers_with_the_least_error_among_those_fast_enough() -> None:
    budget = AccuracyBudget(min_speedup=2.0)
    rows = [
        full(),
        choice("linformer", "low-rank", 2.5, 2.2, 2.8, 0.45),
        choice("band", "band", 2.1, 1.8, 2.4, 0.3),  # more accurate, but its interval reaches below 2×
        choice("nystromformer", "low-rank", 5.0, 4.5, 5.5, 0.6),
    ]
    answer = judge(4096, rows, "full", budget, "realistic")
    assert answer.asked == (
        "At least 2× faster than full, least error: linformer, error 0.45 vs uniform on `realistic` (within the "
        "error budget 0.5), at 2.5× [2.2–2.8]."
    )
    over = judge(4096, [full(), rows[3]], "full", AccuracyBudget(min_speedup=4.0), "realistic")
    assert over.asked == (
        "At least 4× faster than full, least error: nystromformer, error 0.6 vs uniform on `realistic` (over the "
        "error budget 0.5: not recommended), at 5× [4.5–5.5]."
    )
    assert judge(4096, rows, "full").asked == ""  # not asked: nothing said


def test_min_speedup_says_plainly_when_none_reaches_it() -> None:
    rows = [full(), choice("band", "band", 2.1, 1.8, 2.4, 0.3), choice("linear", "linear", 5.0, 4.5, 5.5, 0.99)]
    answer = judge(4096, rows, "full", AccuracyBudget(min_speedup=10.0))
    assert answer.asked == (
        "At least 10× faster than full: none is, beyond noise; the fastest is linear at 5× [4.5–5.5], error 0.99."
    )


def test_the_verdict_of_each_input_names_that_input_and_the_budget_line_states_the_rule(tmp_path: Path) -> None:
    frame = read_results(synthetic_run(tmp_path / "run"))  # one input, gaussian: band at error 0.3
    (verdict,) = verdicts(frame)
    by_n = {answer.n: answer for answer in verdict.answers}
    assert "error 0.3 vs uniform on `gaussian`" in by_n[2048].sentence and by_n[2048].use == "band"
    strict = verdicts(frame, budget=AccuracyBudget(max_error=0.2))[0]
    assert all(answer.use != "band" for answer in strict.answers)
    text = verdict_markdown(verdict_blocks(verdicts(frame, budget=AccuracyBudget(min_speedup=1.5))))
    assert "**Accuracy budget: error vs uniform ≤ 0.5**" in text
    assert "each input's verdict holds the budget to that input's own error" in text
    assert "**Asked (`--min-speedup 1.5`):**" in text and "At least 1.5× faster than full" in text


@pytest.mark.parametrize("value", [0.0, -1.0, NAN, math.inf, 0.95, 1.5])
def test_a_max_error_that_is_not_a_finite_positive_number_is_refused_naming_it(value: float) -> None:
    """From 0.95 on a variant is no better than averaging V and never recommended: such a budget is refused too."""
    (problem,) = budget_problems(value, None, lambda key: "--" + key.replace("_", "-"))
    assert problem.startswith("--max-error: must be a number > 0 and below 0.95")
    with pytest.raises(ConfigError, match="max_error: must be a number > 0 and below 0.95"):
        parse_config(tiny(max_error=value))
    assert budget_problems("0.5", None) and budget_problems(True, None)  # a hand-edited meta.json: not numbers


@pytest.mark.parametrize("value", [1.0, 0.5, NAN, math.inf])
def test_a_min_speedup_that_is_not_above_one_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match="min_speedup: must be a finite number > 1"):
        parse_config(tiny(min_speedup=value))


def test_the_budget_is_part_of_the_resolved_config() -> None:
    config = parse_config(tiny(max_error=0.3, min_speedup=2))
    assert config.to_dict()["max_error"] == 0.3 and config.to_dict()["min_speedup"] == 2.0
    assert "max_error = 0.3" in config.to_toml() and "min_speedup = 2.0" in config.to_toml()
    assert parse_config(config.to_dict()).settings == config.settings  # read back the same
    assert parse_config(tiny()).settings.max_error == DEFAULT_MAX_ERROR
    recorded = AccuracyBudget.of_config(config.to_dict())
    assert (recorded.max_error, recorded.min_speedup) == (0.3, 2.0)
    assert recorded.source == "the run's settings (`max_error`: its config or `--max-error`)"
    assert AccuracyBudget.of_config({}).source == "the default (the run recorded none)"
    again = recorded.with_flags(0.6, None)
    assert (again.max_error, again.min_speedup) == (0.6, 2.0)
    assert again.source == "`attnbench report --max-error 0.6` (the run recorded 0.3)"
