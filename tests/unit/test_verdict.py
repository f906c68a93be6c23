"""The verdict says its answer: one sentence per N, the choices, and every variant left out with its reason."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from attnbench.report.analysis import crossover
from attnbench.plan.budget import AccuracyBudget
from attnbench.report.verdict import (
    DIFFERENT_OPERATOR,
    Choice,
    judge,
    pareto_set,
    verdict_blocks,
    verdict_markdown,
    verdict_terminal,
    verdicts,
)
from attnbench.report.text import aligned_table
from attnbench.runfolder.results import read_results
from helpers import edit_rows, synthetic_run


def choice(label: str, family: str, speedup: float, low: float, high: float, error: float) -> Choice:
    return Choice(label, family, speedup, low, high, error, 1e6, 1.0, "–", time_s=1e-3 / speedup)


def test_a_variant_no_better_than_averaging_v_is_never_offered_however_fast() -> None:
    answer = judge(
        4096,
        [
            choice("full", "exact", 1.0, 1.0, 1.0, 0.0),
            choice("linear", "linear", 20.0, 18.0, 25.0, 0.999),
            choice("band", "band", 5.0, 4.8, 5.3, 1.13),
        ],
        "full",
    )
    assert [c.label for c in answer.choices] == ["full"]
    assert {c.label: c.left_out for c in answer.left_out} == {
        "linear": "no better than averaging V",
        "band": "worse than averaging V",
    }
    assert answer.sentence == (  # none within the accuracy budget: said so, with the least error and its speed
        "Nothing within the error budget 0.5 beats full here: no approximation has error vs uniform of 0.5 or less; "
        "the least is linear's 0.999 (no better than averaging V), at 20× [18–25]."
    )


def test_the_answer_names_the_fastest_choice_and_a_more_accurate_one() -> None:
    answer = judge(
        4096,
        [
            choice("full", "exact", 1.0, 1.0, 1.0, 0.0),
            choice("linformer", "low-rank", 6.5, 5.7, 11.7, 0.31),
            choice("band", "band", 2.1, 1.9, 2.3, 0.12),
            choice("performer", "linear", 1.6, 1.5, 1.7, 0.5),  # slower than band beyond noise, less accurate
        ],
        "full",
    )
    assert [c.label for c in answer.choices] == ["full", "linformer", "band"]
    assert answer.sentence == (
        "Use linformer, the fastest within the error budget 0.5: 6.5× [5.7–11.7] faster than full at error 0.31 vs "
        "uniform, 1× the peak memory of a call; band is more accurate (0.12) at 2.1× [1.9–2.3]."
    )
    (performer,) = answer.left_out
    assert performer.left_out == "slower than band beyond noise and not more accurate"


def test_an_exact_variant_within_noise_of_the_baseline_does_not_displace_it() -> None:
    """full-math 1.01× [0.13–6.62] is no evidence of being faster: full stays the fastest exact."""
    answer = judge(
        1024,
        [choice("full", "exact", 1.0, 1.0, 1.0, 0.0), choice("full-math", "exact", 1.01, 0.13, 6.62, 0.0)],
        "full",
    )
    assert [c.label for c in answer.choices] == ["full"] and answer.choices[0].fastest_exact
    assert answer.left_out[0].left_out == "exact like full, not faster beyond noise"
    clearly = judge(
        1024,
        [choice("full", "exact", 1.0, 1.0, 1.0, 0.0), choice("full-math", "exact", 1.3, 1.2, 1.4, 0.0)],
        "full",
    )
    assert [c.label for c in clearly.choices] == ["full-math"]
    assert clearly.sentence.startswith("Use full-math: exact, 1.3× [1.2–1.4] faster than full")
    assert clearly.left_out[0].left_out == "exact, slower than full-math"


def test_a_choice_not_clearly_faster_is_named_as_such_not_as_slower() -> None:
    answer = judge(
        256,
        [
            choice("full", "exact", 1.0, 1.0, 1.0, 0.0),
            choice("lsh", "lsh", 0.13, 0.12, 0.14, 0.3),
            choice("linear", "linear", 1.05, 0.9, 1.2, 0.5),  # offered (not dominated) but not clearly faster
        ],
        "full",
    )
    assert answer.sentence == (
        "Nothing clearly beats full here: linear (1.05× [0.9–1.2]) is faster by the median, but the interval (95% CI) "
        "reaches 1×; the other approximate variants are slower (lsh)."
    )
    assert [c.label for c in answer.choices] == ["full", "linear"]  # offered, and the sentence says how far


def test_faster_from_is_the_n_from_which_every_larger_n_is_faster() -> None:
    # time ratios (variant / baseline): faster at 256 and 4096, slower at 1024
    at, text = crossover([256, 1024, 4096], [0.8, 1.85, 0.5])
    assert 1024 < at < 4096 and text.endswith("; not monotone: also below 1 at N=256)")
    assert crossover([256, 1024, 4096], [0.8, 0.9, 1.5]) == (
        None,
        "not monotone: below 1 at N=256, 1024, above at N=4096",
    )


def test_faster_from_in_the_verdict_is_not_the_first_faster_n(tmp_path: Path) -> None:
    """A variant faster at the smallest N and slower after it is not 'faster from N ≤ 256'."""
    run = synthetic_run(tmp_path / "run")

    def band_fast_only_at_512(rows: list[dict]) -> list[dict]:
        for r in rows:
            if r["label"] == "band" and r["status"] == "ok":
                fast = r["seq_len"] == "512"
                r["speedup"], r["speedup_low"], r["speedup_high"] = (
                    ("2.0", "1.9", "2.1") if fast else ("0.5", "0.4", "0.6")
                )
        return rows

    edit_rows(run, band_fast_only_at_512)
    (verdict,) = [b.verdict for b in verdict_blocks(verdicts(read_results(run)))]
    pays_off = {c.label: c.pays_off for a in verdict.answers for c in a.choices + a.left_out}
    assert pays_off["band"] == "not monotone"


def test_identical_verdicts_are_merged_into_one_block(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "run")
    frame = read_results(run)
    twin = frame.assign(input="gaussian-twin")  # the same figures on a second input
    both = pd.concat([frame, twin], ignore_index=True)
    blocks = verdict_blocks(verdicts(both))
    assert len(blocks) == 1 and len(blocks[0].titles) == 2
    assert "and 1 more with the same verdict: gaussian-twin" in verdict_markdown(verdict_blocks(verdicts(both)))


def test_the_terminal_verdict_fits_80_columns(tmp_path: Path) -> None:
    frame = read_results(synthetic_run(tmp_path / "run"))
    text = verdict_terminal(verdict_blocks(verdicts(frame)), 80)
    assert "N=2048: Use band" in text and "Left out: strided" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_the_pareto_plots_show_the_verdicts_own_choices_and_sentence(tmp_path: Path, monkeypatch) -> None:
    """One rule: each speed-error plot joins exactly the verdict's offered choices, is titled with its choice
    (attnbench.report.decision_plots) and captioned with its sentence."""
    import attnbench.report.run_report as report
    from attnbench.report.decision_plots import decision_title

    drawn = []
    real = report.plot_pareto

    def spy(points, front, baseline, title, *rest, **budget):
        drawn.append((title, list(front), set(points.label)))
        return real(points, front, baseline, title, *rest, **budget)

    monkeypatch.setattr(report, "plot_pareto", spy)
    run = synthetic_run(tmp_path / "run")
    report.write_report(run)
    (verdict,) = [b.verdict for b in verdict_blocks(verdicts(read_results(run)))]
    expected = [
        (decision_title(a), [c.label for c in a.choices], {c.label for c in a.choices + a.left_out})
        for a in verdict.answers
    ]
    assert drawn == expected
    assert ("N=2048: band", ["full", "band"], {"full", "band"}) in drawn
    caption = ("**N=2048 on `gaussian`:** Use band, the fastest within the error budget 0.5: 2.05× [1.95–2.15] "
               "faster than full at error 0.3 vs uniform on `gaussian`, 0.5× the peak memory of a call.")  # fmt: skip
    assert caption in (run / "report.md").read_text()


def test_without_an_error_measured_the_verdict_claims_nothing_about_accuracy() -> None:
    answer = judge(
        4096,
        [choice("full", "exact", 1.0, 1.0, 1.0, float("nan")), choice("band", "band", 0.5, 0.4, 0.6, float("nan"))],
        "full",
    )
    (band,) = answer.left_out
    assert band.left_out == "slower than full beyond noise"
    from attnbench.report.verdict import left_out_text

    assert left_out_text(answer) == "Left out: band (slower than full beyond noise; 0.50× [0.40–0.60])."


def timed(label: str, family: str, error: float, seconds: float, drift: list[float], jitter: list[float]) -> Choice:
    """A choice with its own rounds: `seconds` per call, times the machine's drift in each round (shared by every
    variant of the group) and this variant's own jitter; its speedup against a 1 ms baseline from those rounds."""
    from attnbench.stats import paired_speedup

    rounds = tuple(seconds * d * j for d, j in zip(drift, jitter))
    baseline = [1e-3 * d for d in drift]
    interval = paired_speedup(baseline, list(rounds))
    return Choice(label, family, interval.estimate, interval.low, interval.high, error, 1e6, 1.0, "–",
                  time_s=sorted(rounds)[len(rounds) // 2], rounds=rounds)  # fmt: skip


def test_a_noisy_more_accurate_variant_does_not_knock_out_a_faster_one() -> None:
    """Issue 23, item 1 (N=4096 of a loaded quick run): linformer 6.5× [5.7–11.7], the fastest, was dropped because
    linear, more accurate, sat at 5.7× [2.0–14.5]: the wider linear's interval, the more it knocked out. Now linear
    leaves linformer in the set unless it is faster than linformer in their own rounds: they tie."""
    import random

    rng = random.Random(1)
    drift = [rng.uniform(0.7, 1.6) for _ in range(9)]
    linformer = timed("linformer", "low-rank", 0.31, 1e-3 / 6.5, drift, [rng.uniform(0.9, 1.1) for _ in drift])
    linear = timed("linear", "linear", 0.2, 1e-3 / 5.7, drift, [rng.uniform(0.4, 2.5) for _ in drift])
    assert linear.speedup_high > linformer.speedup  # the old rule's knock-out condition holds
    front = pareto_set([linformer, linear])
    assert {c.label for c in front} == {"linformer", "linear"}
    assert linformer.ties == ["linear"] and linear.ties == []  # less accurate, not faster beyond noise: a tie


def test_a_variant_faster_in_the_same_rounds_stays_however_noisy_both_are_against_the_baseline() -> None:
    """Issue 23, item 1 (N=256): linear 1.26× [1.05–1.55] was dropped by a more accurate variant at 0.78× [0.65–1.53]
    although linear was 1.76× faster than it in the same rounds. Paired in their own rounds, that is beyond noise."""
    import random

    rng = random.Random(21)  # linear 1.36× [0.67–3.04], lsh 0.77× [0.38–1.70] against the baseline
    drift = [rng.uniform(0.5, 2.0) for _ in range(9)]
    shared = [rng.uniform(0.3, 3.0) for _ in drift]  # both slowed alike in a round: the baseline alone differs
    linear = timed("linear", "linear", 0.4, 1e-3 / 1.26, drift, shared)
    accurate = timed("lsh", "lsh", 0.1, 1e-3 / 1.26 * 1.76, drift, [j * rng.uniform(0.98, 1.02) for j in shared])
    assert accurate.speedup_high >= linear.speedup  # intervals against the baseline overlap
    front = pareto_set([linear, accurate])
    assert [c.label for c in front] == ["linear", "lsh"] and linear.ties == []  # linear clearly faster: no tie


def test_membership_does_not_depend_on_a_third_variants_noise() -> None:
    """Adding a very noisy, more accurate variant changes nobody else's membership unless it is faster than them
    in their common rounds."""
    import random

    rng = random.Random(3)
    drift = [rng.uniform(0.8, 1.3) for _ in range(11)]
    quiet = lambda: [rng.uniform(0.97, 1.03) for _ in drift]  # noqa: E731
    fast = timed("linformer", "low-rank", 0.3, 1e-3 / 8, drift, quiet())
    middle = timed("band", "band", 0.1, 1e-3 / 3, drift, quiet())
    slow = timed("performer", "linear", 0.5, 1e-3 / 2, drift, quiet())
    alone = {c.label for c in pareto_set([fast, middle, slow])}
    assert alone == {"linformer", "band"}  # performer: slower than band beyond noise, less accurate
    for spread in (1.5, 4.0, 10.0):
        noisy = timed("lsh", "lsh", 0.05, 1e-3 / 3, drift, [rng.uniform(1 / spread, spread) for _ in drift])
        assert {c.label for c in pareto_set([fast, middle, slow, noisy])} - {"lsh"} == alone, spread


def test_faster_from_says_what_the_intervals_add() -> None:
    """Issue 23, item 7: 'faster from ≈ 930' while N=1024's interval spanned 0.52–2.18×. The crossing of the
    medians is kept, and the N from which the interval clears 1× is added (or that it never does)."""
    from attnbench.report.analysis import faster_from

    n = [256, 512, 1024, 2048]
    assert faster_from(n, [0.5, 0.9, 1.2, 2.0], [0.45, 0.8, 0.52, 1.6]) == (
        "N ≈ 660 (between 512 and 1024); beyond noise from N=2048"
    )
    assert faster_from(n, [0.5, 0.9, 1.2, 1.3], [0.45, 0.8, 0.52, 0.9]).endswith(
        "; not faster beyond noise at the largest N (its interval reaches 1×)"
    )
    assert faster_from(n, [0.5, 0.9, 1.2, 2.0], [0.45, 0.8, 1.1, 1.6]) == "N ≈ 660 (between 512 and 1024)"


def test_the_input_sentence_gives_each_n_its_own_figures(tmp_path: Path) -> None:
    """Issue 23, item 7: '34% within ±64' averaged 64%, 29% and 10% over N; each N now has its own."""
    from attnbench.report.verdict import input_sentence

    run = synthetic_run(tmp_path / "run")
    local = {"256": "0.64", "512": "0.29", "1024": "0.1", "2048": "0.05"}
    edit_rows(run, lambda rows: [{**r, "input_band_mass": local[r["seq_len"]] if r["input_band_mass"] else ""}
                                 for r in rows])  # fmt: skip
    sentence = input_sentence(read_results(run))
    for n, share in (("256", "64%"), ("512", "29%"), ("1024", "10%"), ("2048", "5%")):
        assert f"at N={n}: entropy 0.70 of uniform, {share} of the mass within ±64" in sentence


def test_a_run_with_no_exact_variant_and_only_useless_approximations_gets_a_verdict() -> None:
    """Review of issue 22: `run quick --variants linear` crashed the verdict (min() of nothing): no summary."""
    answer = judge(256, [choice("linear", "linear", float("nan"), float("nan"), float("nan"), 0.999)], "full")
    assert answer.choices == [] and answer.sentence == (
        "Nothing to recommend here: no exact variant ran and every other is left out "
        "(linear: no better than averaging V)."
    )


def test_an_approximation_of_unmeasured_error_never_knocks_out_exact_attention() -> None:
    """Review of issue 23: with `error = false`, the fastest exact variant was offered and left out at once
    ('slower than linear beyond noise'): an unknown error counted as 0."""
    answer = judge(
        1024,
        [choice("full-math", "exact", 1.0, 1.0, 1.0, 0.0), choice("linear", "linear", 3.0, 2.8, 3.2, float("nan"))],
        "full-math",
    )
    assert [c.label for c in answer.choices] == ["full-math", "linear"] and answer.left_out == []
    # an unmeasured error is not within the accuracy budget: linear is named, never recommended
    assert answer.use == "" and answer.sentence == (
        "Nothing measured within the error budget 0.5 beats full-math here: linear is 3× [2.8–3.2] faster, but its "
        "error was not measured, so it cannot be checked against the budget."
    )


def test_an_interval_of_too_few_rounds_names_no_winner_and_says_its_coverage() -> None:
    """Review of issue 23: with 2 or 3 rounds the min–max 'interval' (50%, 75% coverage) was headed '95% CI' and
    still named winners."""
    from attnbench.report.verdict import InputVerdict, verdict_rows

    few = choice("band", "band", 1.5, 1.2, 1.8, 0.3)
    few.coverage = 0.75
    answer = judge(1024, [choice("full", "exact", 1.0, 1.0, 1.0, 0.0), few], "full")
    assert not few.clearly_faster and answer.sentence.startswith("Nothing clearly beats full here")
    headers, _ = verdict_rows(InputVerdict("s", "realistic", "full", "", "realistic"), answer)
    assert headers[1] == "speedup vs full [min–max of 3 rounds, coverage 75%]"


def test_fastest_in_tables_and_titles_is_the_verdicts_rule(tmp_path: Path) -> None:
    """One dominance rule: a detail table's bold times and a plot title's "fastest" are the variants no other is
    faster than beyond noise (`faster_beyond_noise`, in their own rounds), not the lowest median."""
    from attnbench.report.run_report import detail_blocks
    from attnbench.report.verdict import fastest_labels
    from attnbench.runfolder.folder import read_samples

    run = synthetic_run(tmp_path / "run")
    frame, samples = read_results(run), read_samples(run)
    group = frame[frame["input"] == frame["input"].iloc[0]]
    at = group[(group.seq_len == 1024) & (group.status == "ok")].sort_values("time_median_s")
    lead, second = at.label.iloc[0], at.label.iloc[1]
    assert fastest_labels(at, samples) == [lead]  # faster than the rest in every round: alone

    def bold_at_1024(samples: dict) -> set[str]:
        time_table = next(b for b in detail_blocks(group, "h", {}, samples) if b.kind == "table")
        column = time_table.headers.index("N=1024")
        return {time_table.rows[row][0] for row, col in time_table.best if col == column}

    assert bold_at_1024(samples) == {lead}
    keys, seconds = at.set_index("label").cell_key, float(at.time_median_s.iloc[0])
    alternating = [seconds * (1.2 if i % 2 else 0.85) for i in range(11)]
    samples = {**samples, keys[lead]: [seconds] * 11, keys[second]: alternating}
    assert set(fastest_labels(at, samples)) == {lead, second}  # the runner-up is within noise of the leader now
    assert bold_at_1024(samples) == {lead, second}


def test_without_the_baseline_the_fastest_named_is_the_rules_fastest() -> None:
    """No baseline ran (no speedups): the sentence names the fastest by `fastest`, with those it cannot beat."""
    nan = float("nan")

    def unpaired(label: str, family: str, seconds: float, rounds: tuple[float, ...], error: float) -> Choice:
        return Choice(label, family, nan, nan, nan, error, 1e6, nan, "–", time_s=seconds, rounds=rounds)

    steady = tuple(1e-3 for _ in range(9))
    noisy = tuple(1e-3 * (1.3 if i % 2 else 0.8) for i in range(9))  # sometimes faster, sometimes slower
    answer = judge(
        1024,
        [unpaired("full-math", "exact", 1e-3, steady, 0.0), unpaired("strided", "strided", 0.95e-3, noisy, 0.1)],
        "full",
    )
    assert answer.sentence.startswith("Fastest of the choices: ")
    assert "within noise of it" in answer.sentence and "full did not run here" in answer.sentence
    slow = tuple(2e-3 for _ in range(9))
    answer = judge(
        1024,
        [unpaired("full-math", "exact", 1e-3, steady, 0.0), unpaired("strided", "strided", 2e-3, slow, 0.1)],
        "full",
    )
    assert answer.sentence.startswith("Fastest of the choices: full-math (1 ms per call); full did not run")


def test_a_different_operator_is_never_recommended_on_its_error() -> None:
    """Gated linear attention (approximates_softmax = False) is left out however fast and however small its error
    vs softmax, with that reason; the answer is made from the rest, and `min_speedup` ranks only the rest."""
    other = choice("gla", "gated-linear", 9.0, 8.5, 9.5, 0.05)
    other.approximates = False
    answer = judge(
        8192,
        [choice("full", "exact", 1.0, 1.0, 1.0, 0.0), other, choice("band", "band", 3.0, 2.8, 3.2, 0.3)],
        "full",
        AccuracyBudget(min_speedup=2.0),
    )
    assert [c.label for c in answer.choices] == ["full", "band"]
    assert [(c.label, c.left_out) for c in answer.left_out] == [("gla", DIFFERENT_OPERATOR)]
    assert answer.use == "band" and "gla" not in answer.sentence
    assert answer.asked.startswith("At least 2× faster than full, least error: band")


def test_the_rows_say_whether_a_variant_approximates_softmax(tmp_path: Path) -> None:
    """The row field the verdict reads; a row without it (a run written before it) reads as approximating."""
    run = synthetic_run(tmp_path / "run")
    assert read_results(run).approximates_softmax.all()

    def mark(rows: list[dict]) -> list[dict]:
        for row in rows:
            row["approximates_softmax"] = {"full": "True", "band": "False"}.get(row["label"], "")
        return rows

    edit_rows(run, mark)
    frame = read_results(run).drop_duplicates("label").set_index("label").approximates_softmax
    assert frame.to_dict() == {"full": True, "band": False, "strided": True}


def test_nothing_beats_the_baseline_still_names_a_faster_different_operator() -> None:
    other = choice("retnet", "gated-linear", 2.44, 2.3, 2.6, 265.0)
    other.approximates = False
    answer = judge(2048, [choice("full", "exact", 1.0, 1.0, 1.0, 0.0), other], "full")
    assert answer.use == ""
    assert answer.sentence == (
        "Nothing beats full here. Faster, but different operators from softmax (not judged on error): "
        "retnet (2.44× [2.3–2.6])."
    )


def test_min_speedup_never_answers_with_a_different_operator() -> None:
    other = choice("retnet", "gated-linear", 9.0, 8.5, 9.5, 265.0)
    other.approximates = False
    candidates = [choice("full", "exact", 1.0, 1.0, 1.0, 0.0), other, choice("band", "band", 1.2, 1.1, 1.3, 0.3)]
    answer = judge(2048, candidates, "full", AccuracyBudget(min_speedup=2.0))
    assert answer.asked == "At least 2× faster than full: none is, beyond noise; the fastest is band at 1.2× [1.1–1.3], error 0.3."
    alone = judge(2048, candidates[:2], "full", AccuracyBudget(min_speedup=2.0))
    assert alone.asked == "At least 2× faster than full: no speedup against full was measured here but of other operators."


def test_a_decoded_needles_input_is_described_by_its_probes_not_as_a_context(tmp_path: Path) -> None:
    """Decode's steps on `needles` are the probes, peaked on their needles by construction: the sentence says so
    instead of calling the input's attention peaked (it read 'entropy 0.00 of uniform' on SmolLM2's heads)."""
    from attnbench.report.verdict import input_sentence

    run = synthetic_run(tmp_path / "run")
    edit_rows(run, lambda rows: [{**r, "input": "needles(pairs=16)", "mode": "decode"} for r in rows])
    assert "needles' probes" in input_sentence(read_results(run))
    edit_rows(run, lambda rows: [{**r, "mode": "fwd"} for r in rows])
    assert input_sentence(read_results(run)).startswith("Attention on this input is")


def test_a_table_too_wide_for_the_terminal_wraps_its_cells_and_never_cuts_a_figure() -> None:
    headers = ["variant", "speedup vs full", "error (rel)", "peak memory", "notes"]
    rows = [
        ["band+sinks(window=256,sinks=4)", "2.31× [2.20–2.45]", "1.2e-01", "52.3 MiB (1.06×)", "noisy: spread 30%"],
        ["full", "1.00×", "0", "17.4 MiB", "exact"],
    ]
    wide = aligned_table(headers, rows)
    assert len(wide.splitlines()) == 4  # headers, rule, a line per row
    for width in (80, 64):
        table = aligned_table(headers, rows, width=width, breakable=(0, 4))
        lines = table.splitlines()
        assert max(map(len, lines)) <= width and "…" not in table
        words = table.split()
        for figure in ("2.31×", "[2.20–2.45]", "1.2e-01", "52.3", "(1.06×)", "17.4", "30%"):
            assert figure in words  # each figure whole on one line
    narrow = aligned_table(headers, rows, width=40, breakable=(0, 4))
    assert max(map(len, narrow.splitlines())) <= 40 and "…" not in narrow
    assert "left out to fit 40 columns" in narrow and "notes" in narrow.split("left out")[1]
    assert "[2.20–2.45]" in narrow.split()  # the kept columns' figures stay whole


def test_the_verdict_concludes_nothing_from_a_group_timed_on_a_changed_machine(tmp_path: Path) -> None:
    """Issue 39: after a resume under load one group was timed 3-6x slower than the same calls minutes later, and the
    verdict concluded from it. Timings that contradict their neighbours' now withhold that N's conclusion, say why,
    and keep the figures; the other N are judged as before. A lone pair (two N, nothing to tell them apart) is
    withheld at both."""
    run = synthetic_run(tmp_path / "run")

    def slow_group(rows: list[dict]) -> list[dict]:
        for row in rows:
            if row["time_median_s"]:
                median = float(row["time_median_s"]) * (8 if row["seq_len"] == "1024" else 1)
                row.update(time_median_s=median, time_p10_s=0.95 * median, time_p90_s=1.05 * median)
        return rows

    before = {a.n: a for a in verdicts(read_results(run))[0].answers}
    edit_rows(run, slow_group)
    (verdict,) = verdicts(read_results(run))
    after = {a.n: a for a in verdict.answers}
    held = after[1024]
    assert held.sentence.startswith("No conclusion at this N: its timings are implausible (") and held.use == ""
    assert "full at N=1024" in held.sentence and "measure N=1024 again in one run" in held.sentence
    assert [c.label for c in held.choices] == [c.label for c in before[1024].choices]  # the figures stay
    for n in (256, 512, 2048):  # N=1024 contradicts both its neighbours, which agree: it alone is the odd one
        assert after[n].sentence == before[n].sentence and after[n].use == before[n].use
    text = verdict_terminal(verdict_blocks([verdict]), 80)
    assert "N=1024: No conclusion at this N" in text
    two = read_results(run)
    two = two[two.seq_len.isin([512, 1024])]  # one pair only: which of the two changed cannot be told
    assert all(a.sentence.startswith("No conclusion") for a in verdicts(two)[0].answers)
