"""What a verdict rests on, said first, through the command line: the terminal's verdict, summary.md and report.md
open with one evidence line, real heads (which model, which files) or synthetic inputs (and `make model`), from
`run` and from `report` alike. A run folder that lacks planned cells is reported unfinished (exit 5): cells recorded
of those planned, what has no cell at all, per comparison group what is missing, and the `--resume` command; once
resumed it is finished. Intervals of fewer than 6 rounds are labelled as the min–max they are."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from attnbench.cli import main
from attnbench.exit_status import Exit
from helpers import edit_rows, only_run, run_cli, write_tiny

pytestmark = pytest.mark.slow  # real runs, one in a subprocess

SETTING = "cpu, float32, forward, causal, batch 1 × 1 heads × head_dim 8"
TWO_INPUTS = ('[[variants]]\nname = "full"\n[[variants]]\nname = "band"\nwindow = 16\n'
              '[[inputs]]\nname = "realistic"\n[[inputs]]\nname = "gaussian"\n')  # fmt: skip


WIDE = "400"  # columns: no line wrapped (a wrap may break a word at its hyphen, SmolLM2-135M)


def said(text: str) -> str:
    """Text as read: lines wrapped to the terminal joined with single spaces."""
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", WIDE)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One small synthetic run (no real heads here), through the command line: full and band, causal, on realistic
    and gaussian, N 32 and 64, 3 rounds a group (a min_run_time that never asks for more). Its folder and stdout."""
    root = tmp_path_factory.mktemp("measured")
    config = write_tiny(root / "c.toml", TWO_INPUTS, seq_lens=[32, 64], causal=True, min_run_time=1e-9, min_rounds=3)
    done = run_cli("run", str(config), "--out", str(root / "out"), "--no-progress", env={**os.environ, "COLUMNS": WIDE})
    assert done.returncode == 0, done.stderr
    return only_run(root / "out"), done.stdout


def copy_of(run: Path, tmp_path: Path) -> Path:
    """A copy of a run folder this test may change."""
    return Path(shutil.copytree(run, tmp_path / run.name))


def test_a_synthetic_run_opens_every_view_with_its_evidence(measured, tmp_path, capsys) -> None:
    source, stdout = measured
    first = said(stdout.split("\n\n")[0])
    assert first == ("Evidence: synthetic inputs only (realistic, gaussian), no real model's attention: run make "
                     "model for real heads (SmolLM2-135M's, which then judge the causal cells).")  # fmt: skip
    summary = (source / "summary.md").read_text().splitlines()
    assert summary[0].startswith("# attnbench summary") and summary[1] == ""
    assert summary[2].startswith("**Evidence: synthetic inputs only** (`realistic`, `gaussian`), no real model's "
                                 "attention: run `make model` for real heads")  # fmt: skip
    verdict = (source / "report.md").read_text().split("## Verdict\n\n", 1)[1]
    assert verdict.startswith("**Evidence: synthetic inputs only**")
    run = copy_of(source, tmp_path)
    assert main(["report", str(run)]) == Exit.OK  # re-rendered, it says so again
    assert said(capsys.readouterr().out).startswith(first)
    assert (run / "summary.md").read_text().splitlines()[2] == summary[2]


def test_a_run_on_real_heads_names_the_model_and_the_files_it_read(tmp_path, fake_heads, capsys) -> None:
    folder = fake_heads(positions=300, head_dim=16)
    config = write_tiny(tmp_path / "heads.toml", '[[inputs]]\nname = "realistic"\n[[inputs]]\nname = "heads"\n'
                        'text = "code"\n', seq_lens=[64], heads=4, head_dim=16, causal=True)  # fmt: skip
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress"]) == Exit.OK
    run = only_run(tmp_path / "out")
    expected = (f"Evidence: a real model's attention — SmolLM2-135M's captured heads (code.pt in {folder}); the other "
                "inputs are synthetic (realistic).")  # fmt: skip
    assert said(capsys.readouterr().out).startswith(expected)
    line = (f"**Evidence: a real model's attention** — SmolLM2-135M's captured heads (`code.pt` in `{folder}`); the "
            "other inputs are synthetic (`realistic`).")  # fmt: skip
    assert (run / "summary.md").read_text().splitlines()[2] == line
    assert (run / "report.md").read_text().split("## Verdict\n\n", 1)[1].startswith(line)


def cut_short(run: Path) -> None:
    """The run as a kill leaves it: no `finished` in meta.json, `interrupted` there, and rows missing: every
    gaussian cell, and band's at N=64 on realistic."""
    edit_rows(run, lambda rows: [r for r in rows if r["input"] != "gaussian"
                                 and not (r["label"] == "band(window=16)" and r["seq_len"] == "64")])  # fmt: skip
    meta = json.loads((run / "meta.json").read_text())
    meta.pop("finished")
    meta["interrupted"] = "2026-11-28T08:00:00+0000"
    (run / "meta.json").write_text(json.dumps(meta))


def test_an_unfinished_run_says_what_is_missing_and_how_to_go_on_then_resumes(measured, tmp_path, capsys) -> None:
    run = copy_of(measured[0], tmp_path)
    cut_short(run)
    assert main(["report", str(run)]) == Exit.UNFINISHED
    out, err = capsys.readouterr()
    head = said(out.split("Accuracy budget")[0])
    assert (f"Unfinished run: 3 of 8 planned cells recorded (interrupted 2026-11-28T08:00:00+0000). The verdict rests "
            "on the recorded cells alone; nothing was recorded for input gaussian. Measure the missing cells with "
            f"attnbench run --resume {run}, then read the report again.") in head  # fmt: skip
    assert f"- realistic — {SETTING}: N=64: band(window=16)" in head
    assert f"- gaussian — {SETTING}: none of its 4 cells (N=32, 64)" in head
    assert head.index("Evidence: synthetic") < head.index("Unfinished run")  # the evidence line first
    assert "unfinished run: 3 of 8 planned cells recorded" in err and f"attnbench run --resume {run}" in err
    summary = (run / "summary.md").read_text()
    assert "**Unfinished run: 3 of 8 planned cells recorded**" in summary
    assert f"- gaussian — {SETTING}: none of its 4 cells (N=32, 64)" in summary
    report = (run / "report.md").read_text()
    block = report.split(f"### realistic — {SETTING}\n\n", 1)[1]
    assert block.startswith("**Unfinished here, not measured:** N=64: band(window=16).")  # under its verdict
    page = (run / "report.html").read_text()  # the groups as a list
    assert f"<ul><li>realistic — {SETTING}: N=64: band(window=16)</li><li>gaussian — {SETTING}: none" in page
    assert main(["run", "--resume", str(run), "--no-progress", "--no-report"]) == Exit.OK
    capsys.readouterr()
    assert main(["report", str(run)]) == Exit.OK
    assert "Unfinished" not in capsys.readouterr().out and "Unfinished" not in (run / "summary.md").read_text()


def test_where_the_plan_cannot_be_read_here_the_recorded_count_still_says_unfinished(measured, tmp_path, capsys):
    run = copy_of(measured[0], tmp_path)
    cut_short(run)
    meta = json.loads((run / "meta.json").read_text())
    meta["config"]["variants"].append({"name": "a-plugin-not-installed-here"})
    (run / "meta.json").write_text(json.dumps(meta))
    assert main(["report", str(run)]) == Exit.UNFINISHED
    head = said(capsys.readouterr().out.split("Accuracy budget")[0])
    assert "Unfinished run: 3 of 8 planned cells recorded" in head and "Missing, by comparison group" not in head


def test_intervals_of_three_rounds_are_labelled_min_max_with_their_coverage(measured) -> None:
    run = measured[0]
    label = "min–max of 3 rounds, coverage 75%"
    tables = (run / "summary.md").read_text().split("## By N")[1]
    assert f"speedup vs full [{label}]" in tables and "95% CI" not in tables
    report = (run / "report.md").read_text()
    assert f"Intervals: {label}." in report and f"bars are its intervals ({label})" in report
    for text in ((run / "summary.md").read_text(), report):  # the reach of an interval, said once
        assert text.count("An interval covers the rounds of this one run only") == 1
