"""Error on every input, time on the first (time_every_input = false), and what the report and budgets make of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from attnbench.plan.config import parse_config
from attnbench.report.run_report import write_report
from attnbench.report.verdict import verdicts
from attnbench.run.sweep import run_plan
from attnbench.runfolder.results import read_results
from helpers import tiny

INPUTS = [{"name": "realistic"}, {"name": "gaussian"}]


@pytest.mark.slow
def test_later_inputs_get_error_without_timing_and_borrow_the_first_inputs_speed(tmp_path: Path) -> None:
    config = parse_config(tiny(min_rounds=3, variants=["full", "band"], seq_lens=[32, 64], inputs=INPUTS))
    assert [group.timed for group in config.plan().groups] == [True, True, False, False]
    run = run_plan(config, tmp_path, progress=False)
    frame = read_results(run)
    later = frame[frame["input"] == "gaussian"]
    assert (later.status == "ok").all() and later.time_median_s.isna().all() and (~later.timed.astype(bool)).all()
    assert later.err_vs_uniform.notna().all() and later.input_entropy.notna().all()
    first = frame[frame["input"] == "realistic"]
    assert first.time_median_s.notna().all() and first.timed.astype(bool).all()
    realistic, gaussian = verdicts(frame)
    assert gaussian.timed_on == "realistic" and realistic.timed_on == "realistic"
    band = {a.n: c for a in gaussian.answers for c in a.choices if c.label == "band"}
    timed_band = first[first.label == "band"].set_index("seq_len").speedup
    assert all(band[n].speedup == timed_band[n] for n in band)  # the speed it is judged on is the timed input's
    write_report(run)
    assert "Speed and memory were measured on `realistic`" in (run / "report.md").read_text()


@pytest.mark.slow
def test_time_every_input_judges_each_input_on_its_own_speed(tmp_path: Path) -> None:
    config = parse_config(tiny(min_rounds=3, variants=["full", "band"], seq_lens=[32, 64], inputs=INPUTS, time_every_input=True))
    run = run_plan(config, tmp_path, progress=False)
    frame = read_results(run)
    assert frame.time_median_s.notna().all()
    for verdict in verdicts(frame):
        assert verdict.timed_on == verdict.input
        own = frame[(frame["input"] == verdict.input) & (frame.label == "full")].set_index("seq_len")
        for answer in verdict.answers:
            full = next(c for c in answer.choices if c.label == "full")
            assert full.time_s == own.time_median_s[answer.n]
    write_report(run)  # two timed inputs per setting: one plot set, no ambiguity
    assert "Speed and memory were measured on" not in (run / "report.md").read_text()


def test_a_budget_skip_on_the_first_input_skips_only_larger_n_on_the_others(tmp_path: Path) -> None:
    config = parse_config(tiny(min_rounds=3, seq_lens=[16, 32], inputs=INPUTS, time_budget_s=2e-6))
    results = read_results(run_plan(config, tmp_path, progress=False))
    found = verdicts(results)  # skipped rows (no device name) stay with their setting: no second "machine"
    assert [v.input for v in found] == ["realistic", "gaussian"] and not any(" on " in v.setting for v in found)
    frame = results.set_index(["input", "seq_len"])
    assert frame.loc[("realistic", 16), "status"] == "ok"  # under the estimate guard, over the budget as measured
    assert frame.loc[("gaussian", 16), "status"] == "ok"  # the same N on another input still gets its error
    for source in ("realistic", "gaussian"):
        assert frame.loc[(source, 32), "status"] == "skipped"
        assert frame.loc[(source, 32), "reason"].startswith("larger N skipped: full took")
    assert not bool(frame.loc[("gaussian", 32), "timed"])


def test_a_missing_baseline_still_gives_a_verdict_ranked_by_time(tmp_path: Path) -> None:
    config = parse_config(tiny(min_rounds=3, variants=["band", "linear"], seq_lens=[32]))
    frame = read_results(run_plan(config, tmp_path, progress=False))
    (verdict,) = verdicts(frame)
    (answer,) = verdict.answers
    assert answer.choices and all(c.speedup != c.speedup and c.time_s > 0 for c in answer.choices)
