"""An interval's label says what it is: a 95% interval, or the min–max of fewer than 6 rounds with its real coverage;
a column whose intervals differ says so, and each interval of fewer rounds marks itself. The run says once that its
intervals cover its own rounds only, and, when other processes ran beside its cells, that a figure may move."""

from __future__ import annotations

import pandas as pd
import pytest
from attnbench.report.summary import reach_sentence
from attnbench.report.text import interval_kind, interval_label, speedup_cell
from attnbench.stats import median_interval


@pytest.mark.parametrize("rounds", [2, 3, 4, 5])
def test_min_max_of_few_rounds_is_named_with_the_coverage_it_has(rounds: int) -> None:
    interval = median_interval([float(i) for i in range(1, rounds + 1)])
    assert (interval.low, interval.high) == (1.0, rounds)  # below 6 rounds: min–max
    kind = interval_kind(interval.coverage)
    assert kind.startswith(f"min–max of {rounds} rounds, coverage ")
    assert kind.endswith({2: "50%", 3: "75%", 4: "87.5%", 5: "93.8%"}[rounds])


def test_from_six_rounds_and_for_a_bootstrap_the_label_is_a_95_percent_interval() -> None:
    assert interval_kind(median_interval([float(i) for i in range(6)]).coverage) == "95% CI"
    assert interval_kind(float("nan")) == interval_kind(None) == "95% CI"  # --processes: a two-level bootstrap


def row(speedup: float, coverage: float) -> pd.Series:
    return pd.Series({"speedup": speedup, "speedup_low": speedup / 2, "speedup_high": speedup * 2,
                      "speedup_coverage": coverage})  # fmt: skip


def test_a_column_of_one_kind_says_it_in_the_header_and_a_mixed_one_marks_the_odd_cells() -> None:
    few, many = row(2.0, 0.75), row(3.0, 0.9775)
    alike = interval_label(pd.Series([0.75, 0.75]))
    assert alike == "min–max of 3 rounds, coverage 75%"
    assert speedup_cell(few, alike) == "2.00× [1.00–4.00]"  # the header says it
    mixed = interval_label(pd.Series([0.75, 0.9775]))
    assert mixed == "95% CI, or as marked"
    assert speedup_cell(many, mixed) == "3.00× [1.50–6.00]"
    assert speedup_cell(few, mixed) == "2.00× [1.00–4.00] (min–max of 3 rounds, coverage 75%)"
    assert speedup_cell(row(float("nan"), float("nan")), mixed) == "–"


def timed(noisy: str, loads: tuple[float, float]) -> pd.DataFrame:
    return pd.DataFrame({"status": ["ok", "ok"], "time_median_s": [1e-3, 2e-3], "noisy": [noisy, ""],
                         "load_before": [loads[0]] * 2, "load_after": [loads[1]] * 2})  # fmt: skip


def test_the_reach_of_an_interval_is_said_and_a_busy_machine_adds_that_figures_may_move() -> None:
    quiet = reach_sentence(timed("IQR 12% of the median", (0.2, 0.3)))
    assert quiet == ("An interval covers the rounds of this one run only: it says how closely this run pinned its "
                     "median, not where a rerun will land.")  # fmt: skip
    busy = reach_sentence(timed("other processes used 1.4 cores while it ran", (1.5, 2.5)))
    assert busy.startswith(quiet)
    assert ("The machine was busy during this run (1 of 2 timed cells ran while other processes used the CPU, "
            "1-minute load 1.5–2.5): a figure may move between runs by more than its interval.") in busy


def test_the_terminal_says_the_reach_once_after_the_verdict(tmp_path, capsys) -> None:
    """`attnbench report` prints what `run` prints: the verdict, then once what an interval does not cover."""
    from attnbench.cli import main
    from helpers import synthetic_run

    folder = synthetic_run(tmp_path / "run")
    main(["report", str(folder)])
    said = capsys.readouterr().out.replace("\n", " ")
    assert said.count("An interval covers the rounds of this one run only") == 1
    assert said.index("An interval covers") > said.index("N=")  # after the verdict
