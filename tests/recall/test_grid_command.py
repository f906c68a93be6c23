"""`attnbench recall`: a grid checked whole before any training, each training a row the moment it ends, a resume
(after a kill too) training only what has no row, a failing training its own row, and the report's parts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from attnbench.cli import main
from attnbench.plan.config import ConfigError
from attnbench.recall.grid import grid_names, parse_grid, read_grid, training_key
from attnbench.report.mqar import sanity, summarize, verdict_lines
from attnbench.runfolder.trainings import read_trainings

# a few optimiser steps on a tiny task: the plumbing, not the learning (test_mqar checks the learning)
FAST = 'seq_lens = [16]\npairs = [2]\nseeds = [0, 1]\ntest_examples = 8\nbatch = 8\nd_model = 16\n'


def grid_file(tmp_path: Path, variants: str = '["full", "blind"]', steps: int = 3) -> Path:
    path = tmp_path / "g.toml"
    path.write_text(f"variants = {variants}\nmax_steps = {steps}\n{FAST}")
    return path


def recall(*argv: str) -> int:
    return main(["recall", *argv])


def test_shipped_grids_parse() -> None:
    assert "mqar" in grid_names()
    for name in grid_names():
        assert read_grid(name).specs()


@pytest.mark.parametrize(
    "raw, said",
    [
        ({"variants": ["full"], "seq_lens": [64], "pairs": [4], "max_step": 3}, "max_step: unknown key"),
        ({"variants": ["ful"], "seq_lens": [64], "pairs": [4]}, "Did you mean: full"),
        ({"variants": ["bigbird"], "seq_lens": [64], "pairs": [4]}, "cannot be an MQAR mixer"),
        ({"variants": ["full"], "seq_lens": [64], "pairs": [0]}, "pairs: expected a whole number >= 1"),
        ({"variants": ["full"], "seq_lens": [64], "pairs": [4], "lr": -1}, "lr: expected a number > 0"),
        ({"variants": ["full"], "seq_lens": [64], "pairs": [4], "d_model": 64.5}, "d_model: expected a whole number"),
        ({"variants": [{"name": "blind", "window": 3}], "seq_lens": [64], "pairs": [4]}, "blind: takes no parameters"),
        ({"variants": ["full"], "seq_lens": [8], "pairs": [64]}, "no (N, pairs) point fits the task"),
        ({"seq_lens": [64], "pairs": [4]}, "variants: missing"),
        ({"variants": [], "seq_lens": [64], "pairs": [4]}, "variants: empty"),
        ({"variants": ["full"], "seq_lens": [64], "pairs": [4], "vocab": 100.5}, "vocab: expected a whole number"),
        ({"variants": ["full"], "seq_lens": [64], "pairs": [4], "batch": 2.5}, "batch: expected a whole number"),
        ({"variants": ["full"], "seq_lens": [64], "pairs": [4], "heads": 3}, "not a multiple of heads"),
        ({"variants": ["full"], "seq_lens": [64], "pairs": [4], "name": "../x"}, "must be a plain file name"),
    ],
)
def test_a_bad_grid_names_every_problem(raw: dict, said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_grid({"name": "t", **raw})
    assert any(said in problem for problem in raised.value.problems), raised.value.problems


def test_points_the_task_cannot_hold_are_left_out_and_said() -> None:
    grid = parse_grid({"name": "t", "variants": ["full"], "seq_lens": [16, 256], "pairs": [4, 64]})
    assert {(s.seq_len, s.pairs) for s in grid.specs()} == {(16, 4), (256, 4), (256, 64)}
    assert len(grid.left_out) == 1 and "N=16 × pairs=64" in grid.left_out[0]


def test_a_bad_flag_or_grid_stops_before_any_folder(tmp_path: Path, capsys) -> None:
    grid = grid_file(tmp_path)
    assert recall(str(grid), "--out", str(tmp_path / "out"), "--pairs", "x") == 2
    assert recall(str(grid), "--out", str(tmp_path / "out"), "--min-recall", "1.5") == 2
    assert recall(str(grid), "--out", str(tmp_path / "out"), "--variants", "full,lienar") == 2
    assert "Did you mean: linear" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_grid_writes_a_row_per_training_and_its_report(tmp_path: Path, capsys) -> None:
    grid = grid_file(tmp_path)
    code = recall(str(grid), "--out", str(tmp_path / "out"), "--jobs", "1")
    assert code in (0, 1)  # 3 steps do not solve the task: the sanity check may say so (exit 1)
    folder = next((tmp_path / "out").iterdir())
    rows = read_trainings(folder)
    assert len(rows) == 4 and (rows.status == "ok").all()
    assert set(rows.label) == {"full", "blind"} and (rows.steps == 3).all()
    assert (rows.train_seconds > 0).all() and rows.state_bytes.loc[rows.label == "full"].gt(0).all()
    report = (folder / "report.md").read_text()
    assert report.index("## Verdict") < report.index("## Sanity checks") < report.index("Test accuracy")
    assert (folder / "report.html").is_file() and (folder / "grid.toml").is_file()
    out = capsys.readouterr().out
    assert "sanity: full reaches" in out and "N=16, P=2" in out


def test_a_resume_trains_only_what_has_no_row(tmp_path: Path, capsys) -> None:
    grid = grid_file(tmp_path)
    assert recall(str(grid), "--out", str(tmp_path / "out"), "--jobs", "1", "--seeds", "0") in (0, 1)
    folder = next((tmp_path / "out").iterdir())
    first = read_trainings(folder)
    assert len(first) == 2
    assert recall("--resume", str(folder), "--seeds", "0,1", "--jobs", "1") in (0, 1)  # more seeds: two more
    assert "2 trainings to run (2 done already)" in capsys.readouterr().err
    rows = read_trainings(folder)
    assert len(rows) == 4 and sorted(rows.seed) == [0, 0, 1, 1]
    pd.testing.assert_frame_equal(rows[rows.seed == 0].reset_index(drop=True), first)  # kept, not trained again
    assert recall("--resume", str(folder), "g.toml") == 2  # a resume trains its folder's own grid


def test_a_failing_training_is_its_row_and_the_rest_go_on(tmp_path: Path, monkeypatch) -> None:
    import attnbench.recall.execute as execute

    real = execute.train_mqar

    def flaky(spec):
        if spec.variant == "blind":
            raise RuntimeError("boom")
        return real(spec)

    monkeypatch.setattr(execute, "train_mqar", flaky)
    assert recall(str(grid_file(tmp_path)), "--out", str(tmp_path / "out"), "--jobs", "1") == 1
    rows = read_trainings(next((tmp_path / "out").iterdir()))
    assert set(rows[rows.status == "error"].label) == {"blind"} and (rows.reason.str.contains("boom")).sum() == 2
    assert (rows[rows.label == "full"].status == "ok").all()


def test_the_verdict_and_the_sanity_checks_read_the_trainings() -> None:
    rows = pd.DataFrame(
        [dict(key=f"{label}{n}{p}{s}", label=label, seq_len=n, pairs=p, seed=s, status="ok", accuracy=acc,
              train_seconds=1.0, steps=10, state_bytes=state, chance=1 / 128)
         for label, acc, state in (("full", 1.0, 4096.0), ("linear", 0.5, 512.0), ("blind", 0.01, 0.0))
         for n in (64,) for p in (4, 16) for s in (0, 1, 2)]  # fmt: skip
    )
    rows.loc[(rows.label == "linear") & (rows.pairs == 4), "accuracy"] = 0.95
    summary = summarize(rows)
    line = verdict_lines(summary, 0.9)[0]
    assert "full (state 4 KiB)" in line and "linear (50% at 16 pairs)" in line and "blind" not in line
    assert [check.holds for check in sanity(rows)] == [True, True]
    rows.loc[rows.label == "blind", "accuracy"] = 0.2
    assert [check.holds for check in sanity(rows)] == [True, False]


def test_keys_tell_every_training_apart() -> None:
    specs = read_grid("mqar").specs()
    assert len({training_key(spec) for spec in specs}) == len(specs)


@pytest.mark.slow
def test_a_grid_killed_mid_run_resumes_to_exactly_the_planned_trainings(tmp_path: Path) -> None:
    grid = grid_file(tmp_path, steps=40)
    command = [sys.executable, "-m", "attnbench.cli", "recall", str(grid), "--out", str(tmp_path / "out"), "--jobs", "2"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    csv = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill the driver and its workers once the first row is on disk
        found = list((tmp_path / "out").glob("*/trainings.csv"))
        if found and len(found[0].read_text().splitlines()) >= 2:
            csv = found[0]
            break
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert csv is not None
    folder = csv.parent
    kept = len(read_trainings(folder))
    assert 1 <= kept <= 4
    assert recall("--resume", str(folder), "--jobs", "1") in (0, 1)
    rows = read_trainings(folder)
    assert len(rows) == 4 and rows.key.is_unique and (rows.status == "ok").all()


@pytest.mark.slow
def test_ray_trains_each_training_as_a_task(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="Ray is an optional extra")
    assert recall(str(grid_file(tmp_path)), "--out", str(tmp_path / "out"), "--executor", "ray") in (0, 1)
    rows = read_trainings(next((tmp_path / "out").iterdir()))
    assert len(rows) == 4 and (rows.status == "ok").all() and rows.node.str.len().gt(0).all()


def test_variants_take_settings_as_reports_label_them(tmp_path: Path, capsys) -> None:
    assert recall(str(grid_file(tmp_path)), "--variants", "band(window=4, sinks=2),blind", "--dry-run") == 0
    listed = capsys.readouterr().out
    assert "band(sinks=2, window=4) N=16 pairs=2 seed=0" in listed and "total: 4 trainings" in listed


def test_a_diverging_training_is_an_error_row_and_the_report_exits_as_the_run(tmp_path: Path) -> None:
    path = grid_file(tmp_path, variants='["full"]')
    path.write_text(path.read_text() + "lr = 1e6\nwarmup_steps = 1\n")
    assert recall(str(path), "--out", str(tmp_path / "out"), "--jobs", "1") == 3  # nothing ran ok
    folder = next((tmp_path / "out").iterdir())
    rows = read_trainings(folder)
    assert (rows.status == "error").all() and rows.reason.str.contains("diverged").all()
    assert recall("--report", str(folder)) == 3


def test_a_resume_dry_run_lists_only_what_is_missing(tmp_path: Path, capsys) -> None:
    assert recall(str(grid_file(tmp_path)), "--out", str(tmp_path / "out"), "--jobs", "1", "--seeds", "0") in (0, 1)
    folder = next((tmp_path / "out").iterdir())
    capsys.readouterr()
    assert recall("--resume", str(folder), "--seeds", "0,1", "--dry-run") == 0
    assert "total: 2 trainings (2 done already)" in capsys.readouterr().out
    meta = __import__("json").loads((folder / "meta.json").read_text())
    assert meta["command"][:2] == ["attnbench", "recall"] and "--resume" not in meta["command"]


def test_the_verdict_names_a_mixer_missing_a_setting_as_incomplete() -> None:
    rows = pd.DataFrame(
        [dict(key=f"{p}{s}", label="full", seq_len=16, pairs=p, seed=s, status="ok", accuracy=1.0, train_seconds=1.0,
              steps=1, state_bytes=1.0, chance=0.1) for p in (2, 4) for s in (0, 1)]
        + [dict(key=f"l{s}", label="linear", seq_len=16, pairs=2, seed=s, status="ok", accuracy=1.0,
                train_seconds=1.0, steps=1, state_bytes=1.0, chance=0.1) for s in (0, 1)]
    )  # fmt: skip
    line = verdict_lines(summarize(rows), 0.9)[0]
    assert "full (state" in line and "linear (not every number of pairs ran ok)" in line
