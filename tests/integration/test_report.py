"""Reports and comparisons built from small synthetic runs (failed and skipped cells included)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from attnbench.cli import main
from attnbench.report.analysis import crossover
from attnbench.report.compare import compare_runs
from attnbench.report.run_report import write_report
from helpers import CURVES, edit_rows, empty_run, synthetic_run


# time = a * N^slope, memory = m * N^slope; full quadratic, band linear but slower at small N
def report_text(run: Path) -> str:
    write_report(run)
    return (run / "report.md").read_text()


def test_report_has_every_table_and_plot(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "run")
    text = report_text(run)
    for expected in [
        "Time per call",
        "Speedup against `full`",
        "Peak memory",
        "Error against exact",
        "Achieved FLOP/s",
        "log-log slopes",
        "Crossover",
        "constructed failure",
        "over time_budget_s",
    ]:
        assert expected in text, expected
    plots = sorted(p.name for p in (run / "plots").iterdir())
    assert len(plots) == 5 + 4  # speedup, time, roofline, memory, error, and a Pareto chart per N
    assert all((run / "plots" / name).stat().st_size > 10_000 for name in plots)
    page = (run / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(plots) and "src='plots/" not in page


def test_report_slopes_and_crossovers_recover_the_constructed_curves(tmp_path: Path) -> None:
    text = report_text(synthetic_run(tmp_path / "run"))
    assert "| full | 256–2048 | 2.00 | 1.00 |" in text
    assert "| band | 512–2048 | 1.00 | 1.00 |" in text  # the failed N=256 cell is left out of the fit
    assert "| strided | 256–1024 | 1.50 | 1.00 |" in text
    # band: 1e-5 N vs 1e-8 N^2 -> equal at N = 1000; memory 50 N vs 100 N: smaller everywhere
    # the median crosses near 1,000, but N=1024's interval (0.97–1.08×) reaches 1×: beyond noise from 2048
    assert "| band | N ≈ 1,000 (between 512 and 1024); beyond noise from N=2048 | already at N=512 (smallest swept) |" in text


def test_report_of_a_run_written_before_newer_columns(tmp_path: Path) -> None:
    import pandas as pd

    run = synthetic_run(tmp_path / "run")
    old = pd.read_csv(run / "results.csv").drop(columns=["input_entropy", "input_band_mass", "dropped_mass"])
    old.to_csv(run / "results.csv", index=False)
    assert "Time per call" in report_text(run)


def test_verdict_names_the_fastest_exact_the_pareto_set_and_crossovers(tmp_path: Path) -> None:
    """On the constructed curves: band beats full from N = 1000 at error 0.3; strided (error 0.1) is slower
    than full at every N, so full, exact and faster, dominates it: it is in no Pareto set."""
    from attnbench.report.verdict import verdicts
    from attnbench.runfolder.results import read_results

    run = synthetic_run(tmp_path / "run")
    (verdict,) = verdicts(read_results(run))
    assert verdict.input == "gaussian" and verdict.baseline == "full"
    by_n = {answer.n: answer.choices for answer in verdict.answers}
    assert [c.label for c in by_n[256]] == ["full"]  # band failed at 256, strided is slower and less accurate
    assert [c.label for c in by_n[2048]] == ["full", "band"]
    full, band = by_n[2048]
    assert full.fastest_exact and not band.fastest_exact
    assert band.speedup == pytest.approx(2.048) and band.error == 0.3
    assert (band.speedup_low, band.speedup_high) == pytest.approx((0.95 * 2.048, 1.05 * 2.048))
    assert band.memory_ratio == pytest.approx(0.5) and band.pays_off == "≈ 1,000, clear ≥ 2,048"
    assert "structured (at N=256: entropy 0.70" in verdict.sentence and "50% of the mass within ±64" in verdict.sentence
    text = report_text(run)
    verdict_section = text.split("## Verdict")[1].split("## Plots")[0]
    assert ("**N=2048:** Use band, the fastest within the error budget 0.5: 2.05× [1.95–2.15] faster than full at "
            "error 0.3 vs uniform on `gaussian`, 0.5× the peak memory of a call.") in text  # fmt: skip
    # of roofline: 4·N²·64 flops at 1e11 FLOP/s over the median time: full 1e-8·N², band 1e-5·N
    assert "| full (fastest exact) | 1.00× [0.95–1.05] | exact | 0.2 (1.00×) | 26% | – |" in verdict_section
    assert "| band | 2.05× [1.95–2.15] | 0.3 | 0.1 (0.50×) | 52% | ≈ 1,000, clear ≥ 2,048 |" in verdict_section
    # strided is offered nowhere, and says why where it ran
    assert "**N=256:** Nothing beats full here: the approximate variants are slower (strided)." in verdict_section
    assert "Left out: strided (slower than full beyond noise and not more accurate; 0.16× [0.15–0.17], error 0.1)." in text
    assert text.index("## Verdict") < text.index("## Plots") < text.index("Time per call")  # the answer first


def test_verdict_on_a_near_uniform_input_says_accuracy_cannot_separate_variants(tmp_path: Path) -> None:
    from attnbench.report.verdict import verdicts
    from attnbench.runfolder.results import read_results

    run = synthetic_run(tmp_path / "run")
    edit_rows(run, lambda rows: [{**r, "input_entropy": "0.93" if r["input_entropy"] else ""} for r in rows])
    (verdict,) = verdicts(read_results(run))
    assert verdict.sentence.startswith("Attention on this input is near-uniform (at N=256: entropy 0.93")
    assert "accuracy barely separates the variants" in verdict.sentence


@pytest.mark.slow
def test_a_run_over_two_kinds_of_machine_is_judged_per_machine(tmp_path: Path) -> None:
    """Groups that ran on different device names (a Ray cluster) are never compared across machines."""
    from attnbench.report.verdict import verdicts
    from attnbench.runfolder.results import read_results

    run = synthetic_run(tmp_path / "run")
    edit_rows(run, lambda rows: [{**r, "device_name": "GPU A" if int(r["seq_len"]) <= 512 else "CPU B"} for r in rows])
    found = verdicts(read_results(run))
    assert [v.setting.rsplit(" on ", 1)[1] for v in found] == ["GPU A", "CPU B"]
    assert {a.n for a in found[0].answers} == {256, 512} and {a.n for a in found[1].answers} == {1024, 2048}
    text = report_text(run)
    assert text.count("-time.png") == 2 and "on GPU A" in text and "on CPU B" in text  # a plot per machine kind
    # slopes are fitted per machine: band's 1.00 over 512–2048 would mix them; per kind each has its own N range
    assert "| band | 1024–2048 | 1.00 | 1.00 |" in text and "| full | 256–512 | 2.00 | 1.00 |" in text


def test_colours_stay_with_the_variant_name_across_runs() -> None:
    """Two runs with different subsets draw a variant in the same colour; settings of one variant share its
    colour and differ by marker; a plugin's colour comes from its name alone."""
    from attnbench.report.plots import styles

    first = styles(["full", "band(window=64)", "band(window=256)", "lsh", "my-plugin"])
    second = styles(["lsh", "performer", "band(window=256)", "my-plugin", "linear"])
    for label in ("lsh", "band(window=256)", "my-plugin"):
        assert first[label].colour == second[label].colour
    assert first["band(window=64)"].colour == first["band(window=256)"].colour
    assert first["band(window=64)"].marker != first["band(window=256)"].marker
    assert len({style.colour for style in first.values()}) == 4  # full, band, lsh, my-plugin


def test_crossover_interpolates_in_log_log() -> None:
    assert crossover([100, 400], [2.0, 0.5])[0] == pytest.approx(200)
    assert crossover([100, 400], [2.0, 1.5]) == (None, "not within the swept range (N ≤ 400)")
    assert crossover([100, 400], [0.5, 0.2])[0] == 100
    assert crossover([], [])[0] is None


def test_compare_decides_from_samples_identical_vs_shifted(tmp_path: Path) -> None:
    base = synthetic_run(tmp_path / "a")
    same = synthetic_run(tmp_path / "same")
    regressed = synthetic_run(tmp_path / "b", scale={"band": 1.5, "strided": 1.02})
    assert set(compare_runs(base, same).table.query("label != 'full'").verdict) == {"same"}
    result = compare_runs(base, regressed)
    verdicts = result.table.groupby("label").verdict.unique()
    assert list(verdicts["band"]) == ["slower"]
    assert list(verdicts["strided"]) == ["same"]  # 2%: its interval does not clear 5%
    assert list(verdicts["full"]) == ["baseline, not judged (its time: same; --measure time judges it)"]
    band = result.table[result.table.label == "band"]
    assert (band.low > 1.4).all() and (band.high < 1.6).all()
    assert result.only_in_a == result.only_in_b == 0 and result.machine_notes == []
    assert main(["compare", str(base), str(same), "--fail-above", "10"]) == 0
    assert main(["compare", str(base), str(regressed), "--fail-above", "40"]) == 1
    assert main(["compare", str(base), str(regressed), "--fail-above", "60"]) == 0


def test_noise_is_reported_not_a_veto_and_other_machines_compare_by_speedup(tmp_path: Path, capsys) -> None:
    """Issue 23, items 2 and 4: a noise flag vetoed every verdict (a 2× slowdown was 'inconclusive'); now the
    interval decides and the flag is reported beside it. Across machines the in-turn speedups still compare;
    absolute times cannot."""
    a = synthetic_run(tmp_path / "a", iqr=0.3)
    b = synthetic_run(tmp_path / "b", iqr=0.3, scale={"band": 2.0})
    band = compare_runs(a, b).table.query("label == 'band'")
    assert (band.verdict == "slower").all() and band.noise.str.startswith("A noisy: IQR 30%").all()
    quiet_a = synthetic_run(tmp_path / "qa")
    other_machine = synthetic_run(tmp_path / "qb", cpu="cpu B", scale={"band": 2.0})
    assert main(["compare", str(quiet_a), str(other_machine), "--fail-above", "10"]) == 1  # band: half the speedup
    out = capsys.readouterr().out
    assert "different machines" in out and "cpu: cpu A vs cpu B" in out
    assert main(["compare", str(quiet_a), str(other_machine), "--fail-above", "10", "--measure", "time"]) == 4
    captured = capsys.readouterr()
    assert "inconclusive (different machines or software)" in captured.out
    assert "no regression found, but 10 of 10 cell(s) are inconclusive" in captured.err


def test_compare_speedups_across_machines(tmp_path: Path) -> None:
    a = synthetic_run(tmp_path / "a")
    b = synthetic_run(tmp_path / "b", cpu="cpu B", scale={name: 3.0 for name in CURVES})  # all 3x slower
    table = compare_runs(a, b, measure="speedup").table
    assert set(table.verdict) == {"same"}  # relative to `full` nothing moved


def test_a_cell_that_stopped_working_is_a_regression(tmp_path: Path, capsys) -> None:
    a = synthetic_run(tmp_path / "a")
    b = synthetic_run(tmp_path / "b")

    def crash_one_and_lose_another(rows: list[dict]) -> list[dict]:
        rows[0]["status"], rows[0]["reason"] = "crashed", "killed by SIGSEGV"
        last_ok = max(i for i, row in enumerate(rows) if row["status"] == "ok")
        return rows[:last_ok] + rows[last_ok + 1 :]  # and one more ok cell is missing

    edit_rows(b, crash_one_and_lose_another)
    result = compare_runs(a, b)
    assert set(result.broken.now) == {"crashed", "missing"}
    assert main(["compare", str(a), str(b), "--fail-above", "50"]) == 1
    assert "no longer ok" in capsys.readouterr().err


def test_compare_without_common_cells_says_so(tmp_path: Path, capsys) -> None:
    a = synthetic_run(tmp_path / "a")
    assert main(["compare", str(a), str(empty_run(tmp_path / "empty", a))]) == 0
    assert "nothing to compare" in capsys.readouterr().out


def test_report_command_refuses_a_folder_that_is_not_a_run(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err


def test_compare_edge_cases(tmp_path: Path, capsys) -> None:
    a = synthetic_run(tmp_path / "a")
    empty = empty_run(tmp_path / "empty", a)
    # nothing in common and B's plan unknown (no meta.json): said plainly, missing cells not judged, no traceback;
    # a gate that compared nothing has not passed (exit 4, not 0)
    assert main(["compare", str(a), str(empty), "--fail-above", "10"]) == 4
    captured = capsys.readouterr()
    assert "nothing to compare" in captured.out and "cells missing from B are not judged" in captured.out
    assert "nothing was compared" in captured.err
    assert main(["compare", str(a), str(a), "--fail-above", "-5"]) == 2
    no_samples = synthetic_run(tmp_path / "b", scale={"band": 2.0})
    (no_samples / "samples.csv").unlink()
    table = compare_runs(a, no_samples, measure="time").table
    assert set(table.verdict) == {"inconclusive (no timing samples in B)"}
    by_speedup = compare_runs(a, no_samples).table.set_index("label").verdict  # from the two intervals' far ends
    assert set(by_speedup["band"]) == {"slower"} and by_speedup["strided"].str.startswith("inconclusive").all()
    skipped = synthetic_run(tmp_path / "c")

    def skip_first_ok(rows: list[dict]) -> list[dict]:
        first_ok = next(row for row in rows if row["status"] == "ok")
        first_ok["status"], first_ok["reason"] = "skipped", "larger N skipped: over time_budget_s"
        return rows

    edit_rows(skipped, skip_first_ok)
    assert compare_runs(a, skipped).broken.empty  # a skip follows from time or load: not a regression by itself
    other_baseline = synthetic_run(tmp_path / "d")
    frame = pd.read_csv(other_baseline / "results.csv")
    frame["baseline"] = "band"
    frame.to_csv(other_baseline / "results.csv", index=False)
    verdicts = compare_runs(a, other_baseline, measure="speedup").table.verdict
    assert verdicts.str.contains("baselines differ: full vs band").all() or set(verdicts) == {"same"}


def test_a_run_without_error_measurement_gets_a_report_without_pareto_plots(tmp_path: Path) -> None:
    """`error = false`: no error to place a point on the speed-error plane (a NaN axis limit was a traceback)."""
    config = tmp_path / "c.toml"
    config.write_text('variants = ["full", "band"]\nseq_lens = [16]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.01\n'
                      "error = false\n")  # fmt: skip
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    (run,) = (tmp_path / "out").iterdir()
    plots = {path.name.rsplit("-", 1)[-1] for path in (run / "plots").glob("*.png")}
    assert plots == {"speedup.png", "time.png", "roofline.png", "memory.png"}  # no pareto, no error plot


def test_compare_says_inconclusive_when_the_interval_cannot_tell() -> None:
    """Issue 23, item 2: a 50% slowdown measured 1.93× [1.03–2.39] was 'same' (its interval did not clear 5%).
    'same' now needs the whole interval within the margin; an interval reaching past it is inconclusive."""
    from attnbench.report.compare import decide
    from attnbench.stats import Interval

    assert decide(Interval(1.93, 1.03, 2.39), 0.05, 0.05).startswith("inconclusive (the interval reaches")
    assert decide(Interval(1.01, 0.98, 1.04), 0.05, 0.05) == "same"
    assert decide(Interval(1.30, 1.12, 1.41), 0.10, 0.10) == "slower"
    assert decide(Interval(0.70, 0.61, 0.80), 0.10, 0.10) == "faster"
    assert decide(Interval(1.08, 1.04, 1.12), 0.10, 0.02).startswith("inconclusive")  # a tighter margin


def test_a_whole_run_slower_as_a_block_is_no_regression_of_any_cell(tmp_path: Path) -> None:
    """Issue 23, item 3: one quiet run 18–51% slower than its twin throughout (the machine, not the code) failed the
    gate on absolute times. Speedups against the in-run baseline cancel such a shift: the default compares them."""
    a = synthetic_run(tmp_path / "a")
    b = synthetic_run(tmp_path / "b", scale={name: 1.35 for name in CURVES})  # every variant, baseline included
    table = compare_runs(a, b).table.set_index("label")
    assert set(table.drop("full").verdict) == {"same"}
    # the baseline is shown by its time, not judged: a slower machine and a slower `full` look alike there
    assert set(table.loc["full"].verdict) == {"baseline, not judged (its time: slower; --measure time judges it)"}
    assert set(compare_runs(a, b, measure="time").table.verdict) == {"slower"}
    assert main(["compare", str(a), str(b), "--fail-above", "10"]) == 0


def test_no_efficiency_exceeds_100_percent_the_peak_is_raised_and_said(tmp_path: Path) -> None:
    """Issue 23, item 6: under load `full` reached 107–114% of a matmul peak measured low. The peak is the best of
    start, between groups and end, and where a cell still beats it, it is raised to that cell's rate and the report
    says so."""
    from attnbench.report.analysis import efficiency, raised_peaks
    from attnbench.runfolder.meta import RunMeta
    from attnbench.runfolder.results import read_results

    run = synthetic_run(tmp_path / "run")  # full: 4·N²·64 flops in 1e-8·N² s = 25.6 GFLOP/s, band more
    meta = json.loads((run / "meta.json").read_text())
    low = {"matmul_flops_per_s": 2.0e10, "copy_bytes_per_s": 1e10}
    meta.update(peaks={"cpu/float32": low}, peaks_between={"cpu/float32": {**low, "matmul_flops_per_s": 2.2e10}})
    (run / "meta.json").write_text(json.dumps(meta))
    assert RunMeta(meta).peaks["cpu/float32"]["matmul_flops_per_s"] == 2.2e10  # best of start and between groups
    frame = read_results(run)
    peaks, notes = raised_peaks(frame, RunMeta(meta).peaks)
    ok = frame[frame.status == "ok"]
    assert peaks["cpu/float32"]["matmul_flops_per_s"] == pytest.approx((ok.flops / ok.time_median_s).max())
    assert efficiency(frame, peaks).max() == pytest.approx(1.0)
    assert notes and "above the measured matmul peak 22.0: the peak is raised to it" in notes[0]
    text = report_text(run)
    assert "the peak is raised to it" in text and "above peak" not in text
    assert "Time over roofline" in text  # issue 27, item 4 (in part): beside the efficiency, the distance to the limit



def test_a_slower_baseline_is_said_even_where_only_speedups_are_judged(tmp_path: Path, capsys) -> None:
    """Review of issue 23: a 2× slower `full` showed as 'same' (its speedup against itself is 1) and every other
    cell 'faster'. The baseline's own time is shown and a line says it moved; `--measure time` judges it."""
    a = synthetic_run(tmp_path / "a")
    b = synthetic_run(tmp_path / "b", scale={"full": 2.0})
    assert main(["compare", str(a), str(b), "--fail-above", "10"]) == 0
    out = capsys.readouterr().out
    assert "The baseline's own time changed in 4 cell(s)" in out
    assert main(["compare", str(a), str(b), "--fail-above", "10", "--measure", "time"]) == 1
