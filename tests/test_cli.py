"""The command line: list, run with overrides, and bad input that stops before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from attnbench.cli import main


def test_list_shows_builtins_with_capabilities_and_package(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "full-xformers" in out and "cuda" in out and "attnbench 0.1.0" in out


def test_run_writes_results_and_prints_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        [
            "run",
            "quick",
            "--variants",
            "full,full-math",
            "--seq-lens",
            "32,64",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--causal",
            "both",
        ]
    )
    assert status == 0
    out = capsys.readouterr().out
    assert "speedup vs full" in out and "N=64" in out and "causal=True" in out
    run_dir = next(tmp_path.iterdir())
    assert {p.name for p in run_dir.iterdir()} >= {
        "results.csv",
        "meta.json",
        "summary.md",
        "report.md",
        "report.html",
        "plots",
    }


def test_bad_config_stops_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["run", "quick", "--variants", "bnad,full", "--dtype", "float8", "--out", str(tmp_path)])
    assert status == 2
    err = capsys.readouterr().err
    assert "Unknown variant 'bnad'" in err and "unknown 'float8'" in err
    assert not any(tmp_path.iterdir())


def test_bad_flag_value_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--seq-lens", "1k"])
    assert "comma-separated list of int" in capsys.readouterr().err


def test_run_warns_when_the_machine_is_already_busy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    args = ["run", "quick", "--variants", "full", "--seq-lens", "32", "--out", str(tmp_path), "--no-progress"]
    assert main([*args, "--no-report"]) == 0
    assert "the machine is already busy (load 3.0" in capsys.readouterr().err
