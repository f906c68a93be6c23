"""The command line: list, run with overrides, and bad input that stops before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from attnbench.cli import main


def test_list_shows_builtins_with_capabilities_and_package(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "full-xformers" in out and "cuda" in out and "attnbench 0.1.0" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line and not line.startswith(" ")}
    assert rows["name"][:4] == ["name", "family", "softmax", "causal"]
    # softmax: exact on its support, an approximation, or another operator; causal: only = refuses non-causal calls,
    # decode = a KV-cache method that runs in decode alone
    assert rows["band"][1:4] == ["band", "exact", "yes"] and rows["performer"][1:4] == ["linear", "approx.", "yes"]
    for name in ("retnet", "gla", "deltanet", "gated-deltanet"):
        assert rows[name][1:4] == ["gated-linear", "other", "only"], rows[name]
        assert rows[name][7] == "yes"  # decode: a recurrent step
    assert rows["h2o"][3] == "decode"


@pytest.mark.slow
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
    captured = capsys.readouterr()
    out = captured.out
    # the verdict per setting and input, aligned: both causal settings, an answer per N, the speedup column
    assert "speedup vs full" in out and "\nN=64: " in out and ", forward, causal," in out and "non-causal" in out
    assert "|" not in out  # plain aligned columns, not Markdown pipes
    run_dir = next(tmp_path.iterdir())
    assert {p.name for p in run_dir.iterdir()} >= {
        "results.csv",
        "meta.json",
        "config.toml",
        "summary.md",
        "report.md",
        "report.html",
        "plots",
    }
    assert captured.err.strip().splitlines()[-1] == f"attnbench: report: {run_dir / 'report.html'}"  # last


@pytest.mark.slow
def test_an_overridden_run_can_be_reproduced_from_its_folder(tmp_path: Path) -> None:
    """meta.json and the report name the command and the overrides; config.toml runs the same cells again."""
    import json

    import tomllib
    from attnbench.plan.config import load_config, parse_config

    argv = ["run", "quick", "--variants", "full,band", "--seq-lens", "48", "--causal", "true", "--out", str(tmp_path)]
    assert main([*argv, "--no-progress", "--no-report"]) == 0
    run_dir = next(tmp_path.iterdir())
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["overrides"] == {"variants": ["full", "band"], "seq_lens": [48], "causal": [True]}
    assert meta["command"][1:4] == ["run", "quick", "--variants"]
    resolved = parse_config(tomllib.loads((run_dir / "config.toml").read_text()))
    expected = load_config("quick", {"variants": ["full", "band"], "seq_lens": [48], "causal": [True]})
    assert resolved.plan().cells == expected.plan().cells and resolved.settings == expected.settings
    assert main(["report", str(run_dir)]) == 0
    top = (run_dir / "report.md").read_text()  # the verdict comes first, then how to reproduce the run
    assert "`attnbench run quick --variants full,band --seq-lens 48 --causal true" in top
    assert f"attnbench run {run_dir / 'config.toml'}" in top
    assert 'with variants = ["full", "band"], seq_lens = [48], causal = [true]' in top
    assert "Machine: " in top and "cores" in top and "GiB memory" in top and "no GPU" in top


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


@pytest.mark.slow
def test_run_warns_when_other_processes_use_the_cpu_not_on_a_lagging_load_average(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23, item 7: the warning read the 1-minute load average, so it fired after every back-to-back run on an
    idle machine. It now uses the noise flag's measure: other processes' CPU time, watched as the run starts."""
    import os
    import subprocess
    import sys

    import attnbench.measure.noise

    args = ["run", "quick", "--variants", "full", "--seq-lens", "32", "--no-progress", "--no-report"]
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))  # our own previous run, still in the average
    monkeypatch.setattr(attnbench.measure.noise, "competing_now", lambda seconds=0.5: 0.0)
    assert main([*args, "--out", str(tmp_path / "quiet")]) == 0
    assert "already busy" not in capsys.readouterr().err
    monkeypatch.undo()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a real competitor for one core
    try:
        assert main([*args, "--out", str(tmp_path / "busy")]) == 0
    finally:
        spinner.kill()
        spinner.wait()
    assert "the machine is already busy (other processes use" in capsys.readouterr().err
