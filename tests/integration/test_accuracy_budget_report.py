"""The accuracy budget end to end: its flags refused before any work when bad, recorded with the run, used again (or
replaced) by `attnbench report`, said first on the page, and never contradicted by a plot title."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attnbench.cli import main
from attnbench.report.run_report import write_report
from helpers import synthetic_run

BAND_AND_FULL_AT_16 = 'variants = ["full", "band"]\nseq_lens = [16]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.01\n'


@pytest.mark.parametrize("flag, value", [("--max-error", "nan"), ("--max-error", "0"), ("--max-error", "-0.5"),
                                         ("--max-error", "inf"), ("--max-error", "0.95"), ("--max-error", "1.5"),
                                         ("--min-speedup", "1")])  # fmt: skip
def test_a_bad_budget_is_refused_before_any_work(flag: str, value: str, tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.toml"
    config.write_text(BAND_AND_FULL_AT_16)
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress", flag, value]) == 2
    assert not (tmp_path / "out").exists()  # no run folder: nothing was measured
    said = "must be a number > 0 and below 0.95" if flag == "--max-error" else "must be a finite number"
    assert f"{flag}: {said}" in capsys.readouterr().err
    run = synthetic_run(tmp_path / "run")
    assert main(["report", str(run), flag, value]) == 2
    assert not (run / "report.md").exists() and not (run / "summary.md").exists()
    assert main(["report", str(tmp_path / "not-a-run"), flag, value]) == 2  # the flag is checked first
    assert f"{flag}: {said}" in capsys.readouterr().err


@pytest.mark.slow
def test_the_run_records_its_budget_and_a_report_says_which_it_used(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.toml"
    config.write_text(BAND_AND_FULL_AT_16)
    out = tmp_path / "out"
    flags = ["--max-error", "0.3", "--min-speedup", "2"]
    assert main(["run", str(config), "--out", str(out), "--no-progress", *flags]) == 0
    (run,) = out.iterdir()
    recorded = json.loads((run / "meta.json").read_text())["config"]
    assert (recorded["max_error"], recorded["min_speedup"]) == (0.3, 2.0)
    assert "max_error = 0.3" in (run / "config.toml").read_text()
    text = (run / "report.md").read_text()
    assert "**Accuracy budget: error vs uniform ≤ 0.3**" in text and "from the run's settings (`max_error`: its config or `--max-error`)" in text
    assert "**Asked (`--min-speedup 2`):**" in text
    capsys.readouterr()
    assert main(["report", str(run), "--max-error", "0.05"]) == 0
    assert "Accuracy budget: error vs uniform ≤ 0.05" in capsys.readouterr().out  # judged again, printed as run does
    text = (run / "report.md").read_text()
    assert "≤ 0.05**" in text and "from `attnbench report --max-error 0.05` (the run recorded 0.3)" in text
    assert json.loads((run / "meta.json").read_text())["config"]["max_error"] == 0.3  # the run's record is its own
    assert main(["report", str(run)]) == 0
    assert "≤ 0.3**" in (run / "report.md").read_text()


def plot_titles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The titles the report's plots are drawn with (the speed-error plots, whose title is the verdict's own sentence,
    left aside), collected as the report is written."""
    import attnbench.report.run_report as report

    titles: list[str] = []

    def spy(name: str, at: int):
        real = getattr(report, name)

        def drawn(*args, **kwargs):
            titles.append(args[at])
            return real(*args, **kwargs)

        monkeypatch.setattr(report, name, drawn)

    for name, at in (("plot_speedup", 2), ("plot_versus_n", 3), ("plot_roofline", 1), ("plot_error", 1)):
        spy(name, at)
    return titles


def test_plot_titles_headline_the_verdicts_choice_or_no_variant(tmp_path: Path, monkeypatch) -> None:
    titles = plot_titles(monkeypatch)
    run = synthetic_run(tmp_path / "run")  # at N=2048 band is 2.05× faster at error 0.3; strided is slower
    write_report(run)
    assert len(titles) == 5 and all("strided" not in title for title in titles)
    assert titles[0] == "At N=2048, band (the verdict's choice) runs 2.0× as fast as full"
    assert all("band (the verdict's choice)" in title for title in titles)
    titles.clear()
    assert main(["report", str(run), "--max-error", "0.2"]) == 0  # band over the budget now: no title may crown it
    assert len(titles) == 5 and not any("band" in title or "strided" in title for title in titles)
    assert "Speedup against full: at N=2048 the verdict recommends no variant over full" in titles


def test_the_verdict_is_the_first_thing_on_the_page(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "run")
    write_report(run)
    text = (run / "report.md").read_text()
    order = ["# attnbench report", "## Verdict", "**Accuracy budget", "**N=2048:** Use band", "| variant |",
             "## This run", "## Plots"]  # fmt: skip
    assert [text.index(part) for part in order] == sorted(text.index(part) for part in order)
    page = (run / "report.html").read_text()
    answer = page.index("Use band, the fastest within the error budget 0.5")
    assert page.index("Accuracy budget") < answer < page.index("<table>") < page.index("<img")
    assert page.index("<nav>") > answer  # the contents and the run's facts come after the answer
    between = page[page.index("</h1>") : page.index("id='verdict'")]
    assert "<p>" not in between and "<nav>" not in between
