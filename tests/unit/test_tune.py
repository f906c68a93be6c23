"""`--tune`: the bisection finds the smallest knob value within the budget (error falling with the knob), stops at
one probe when none is, and searches each setting once whatever its knob's value in the run."""

from __future__ import annotations

from attnbench.plan.cells import VariantSpec
from attnbench.plan.config import parse_config
from attnbench.run.tune import KNOBS, Search, ladder, tuned_settings
from helpers import tiny


def walk(search: Search, error, budget: float = 0.5) -> list[int]:
    probed = []
    while (value := search.next_value()) is not None:
        probed.append(value)
        search.record(value, error(value), budget)
    return probed


def test_the_ladder_is_powers_of_two_up_to_the_knobs_largest():
    assert ladder(KNOBS["band"], 1024) == [16, 32, 64, 128, 256, 512]
    assert ladder(KNOBS["topk"], 2048) == [1, 2, 4, 8, 16]
    assert ladder(KNOBS["performer"], 64) == [16, 32, 64, 128, 256, 512, 1024]


def test_bisection_finds_the_smallest_value_within_the_budget():
    search = Search(VariantSpec("band", ()), KNOBS["band"], ladder(KNOBS["band"], 1024))
    probed = walk(search, lambda window: 64 / window)  # within 0.5 from 128 up
    assert search.pick == 128
    assert 128 in probed and 64 in probed  # the pick, and the value below it shown over the budget
    assert len(probed) <= 4  # log2 of the ladder and the first look at its top


def test_bisection_at_the_ends_of_the_ladder():
    lowest = Search(VariantSpec("band", ()), KNOBS["band"], ladder(KNOBS["band"], 1024))
    walk(lowest, lambda window: 0.1)
    assert lowest.pick == 16
    none = Search(VariantSpec("band", ()), KNOBS["band"], ladder(KNOBS["band"], 1024))
    assert walk(none, lambda window: 0.9) == [512]  # the largest is over: nothing smaller is tried
    assert none.pick is None
    unmeasured = Search(VariantSpec("band", ()), KNOBS["band"], ladder(KNOBS["band"], 1024))
    walk(unmeasured, lambda window: float("nan"))
    assert unmeasured.pick is None


def test_each_setting_is_searched_once_whatever_its_knobs_value():
    config = parse_config(tiny(variants=[{"name": "full"}, {"name": "band", "window": [64, 256]},
                                         {"name": "band", "window": 256, "sinks": 4}, {"name": "performer"}]))  # fmt: skip
    found = {spec.label(): knob.name for spec, knob in tuned_settings(config)}
    assert found == {"band": "window", "band(sinks=4)": "window", "performer": "features"}


def test_tune_is_part_of_the_resolved_config_so_a_resume_tunes_too():
    config = parse_config(tiny(tune=True))
    assert config.settings.tune and "tune = true" in config.to_toml()
    assert parse_config(tiny()).settings.tune is False


def test_a_report_at_another_budget_says_the_tuning_was_for_its_own():
    import pandas as pd
    from attnbench.report.tuning import tuning_sentences

    rows = [{"seq_len": 2048, "mode": "fwd", "causal": True, "setting": "band(sinks=4)", "knob": "window", "value": v,
             "label": f"band(sinks=4, window={v})", "err_vs_uniform": e, "within": e <= 0.5, "budget": 0.5,
             "evidence": "heads(text=prose), heads(text=code)", "pick": v == 16, "speedup": 5.0 if v == 16 else float("nan"),
             "speedup_low": 4.5 if v == 16 else float("nan"), "speedup_high": 5.5 if v == 16 else float("nan")}
            for v, e in ((1024, 0.05), (128, 0.19), (32, 0.3), (16, 0.34))]  # fmt: skip
    [said] = tuning_sentences(pd.DataFrame(rows), "full")
    assert said.startswith("Tuned at N=2048 (forward, causal, error on real heads (prose, code)): Use band(sinks=4, "
                           "window=16): 5× [4.5–5.5] faster than full at error 0.34")  # fmt: skip
    [again] = tuning_sentences(pd.DataFrame(rows), "full", max_error=0.2)
    assert "Tuned for the error budget 0.5; this report judges at 0.2" in again and "band(sinks=4, window=128)" in again
    assert "--tune --max-error 0.2" in again


def fake_measure(error, recall):
    """A `measure` for `tune` without running anything: error and needle recall as functions of band's window, and
    every timed cell 1 ms against the baseline's 4 ms (so each pick is clearly faster)."""
    from attnbench.measure.group import GroupResult
    from attnbench.runfolder.rows import row_for

    def measure(group):
        rows, samples = [], []
        for cell in group.cells:
            window = dict(cell.variant.params).get("window")
            needles = cell.input.name == "needles"
            fields = {"needle_accuracy": recall(window)} if needles and window else {}
            rows.append(row_for(cell, status="ok", err_vs_uniform=error(window) if window else 0.0, **fields))
            if group.timed:
                samples += [(cell.key(), r, 4e-3 if window is None else 1e-3) for r in range(9)]
        return GroupResult(rows, samples)

    return measure


def needles_config(**overrides):
    return parse_config(tiny(variants=["full", {"name": "band", "window": 64}], seq_lens=[1024], heads=1,
                             inputs=[{"name": "realistic"}, {"name": "needles", "pairs": 4}], **overrides))  # fmt: skip


def test_where_needles_fit_the_knob_is_searched_for_continuation_and_for_retrieval():
    """The verdict's two answers, tuned: the smallest window within the error budget, and the smallest also
    retrieving at least 90% of the needles (error falls and recall grows with the window)."""
    import pandas as pd
    from attnbench.report.tuning import tuning_sentences
    from attnbench.run.tune import search_rules, tune

    config = needles_config()
    assert [rule for rule, _ in search_rules(config, config.plan().cells[0])] == ["continuation", "retrieval"]
    rows = tune(config, config.plan().cells, 0.5, fake_measure(lambda w: 16 / w, lambda w: min(1.0, w / 400)),
                say=lambda line: None)  # fmt: skip
    picks = {r["rule"]: r["value"] for r in rows if r["pick"]}
    assert picks == {"continuation": 32, "retrieval": 512}  # 16/32 = 0.5 within; 512/400 >= 0.9, 256/400 not
    assert all(r["recall"] == r["recall"] for r in rows)  # every probe's recall, the continuation rule's too
    [said] = tuning_sentences(pd.DataFrame(rows), "full")
    assert "For continuation (error alone): Use band(window=32)" in said and "needle recall 8%" in said  # 32/400
    assert "For retrieval (needle recall at least 90%): Use band(window=512)" in said and "recall 100%" in said


def test_a_recall_the_user_asked_is_the_one_rule_and_no_needles_leave_error_alone():
    from attnbench.run.tune import search_rules

    asked = needles_config(min_recall=0.5)
    assert search_rules(asked, asked.plan().cells[0]) == [("retrieval", 0.5)]
    plain = parse_config(tiny(variants=["full", "band"], seq_lens=[1024]))
    assert search_rules(plain, plain.plan().cells[0]) == [("continuation", None)]


def test_the_retrieval_search_needs_both_error_and_recall():
    search = Search(VariantSpec("band", ()), KNOBS["band"], ladder(KNOBS["band"], 1024), "retrieval", 0.9)
    while (value := search.next_value()) is not None:
        search.record(value, 0.1, 0.5, recall=1.0 if value >= 256 else 0.5)
    assert search.pick == 256
