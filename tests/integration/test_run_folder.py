"""Through the CLI, as a user meets it: a plan checked before any work, a run folder nothing can break,
exit codes that mean something, and a package that works outside its checkout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from attnbench.cli import build_parser
from attnbench.runfolder.results import read_results
from helpers import (
    TESTS,
    answer_ctrl_c,
    only_run,
    run_cli,
    source_modules,
    write_tiny,
)

SMALL = ["--seq-lens", "64", "--no-progress", "--no-report"]


def start_run(config: Path, out: Path, env: dict, log: Path) -> tuple[subprocess.Popen, Path]:
    """A run in the background, its stderr in a file (a pipe nobody drains would block a chatty run); returns
    the process and the run folder it names as it starts."""
    process = subprocess.Popen(
        [sys.executable, "-m", "attnbench.cli", "run", str(config), "--out", str(out), "--no-progress", "--no-report"],
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        env=env,
        preexec_fn=answer_ctrl_c,
    )
    deadline = time.monotonic() + 120
    while "results in " not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    line = next(line for line in log.read_text().splitlines() if "results in " in line)
    return process, Path(line.rsplit("results in ", 1)[1].strip().rstrip("/"))


# ---- the plan is checked before any work ---------------------------------------------------------


def test_every_plan_problem_is_listed_at_once_before_any_work(installed_plugins, tmp_path: Path) -> None:
    captured = tmp_path / "short.pt"
    import torch

    torch.save({name: torch.randn(1, 2, 32, 16) for name in "qkv"}, captured)
    config = write_tiny(
        tmp_path / "bad.toml",
        'seq_lens = [64]\ndevice = "cuda"\nfrobnicate = 1\n'
        f'[[inputs]]\nname = "captured"\npath = "{captured}"\n'
        "[variants.full]\n[variants.band]\nwindow = []\nwndow = 4\n"
        "[variants.fails-to-build]\n[variants.exact-without-mask]\n", heads=2, head_dim=16
    )
    out = tmp_path / "out"
    result = run_cli("run", str(config), "--out", str(out), env=installed_plugins)
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert "window = [] gives no setting" in err
    assert "could not build fails-to-build: RuntimeError: needs a GPU library" in err
    assert "exact-without-mask" in err and "does not implement support_mask" in err
    assert "unknown key 'frobnicate'" in err and "unknown hyperparameter 'wndow'" in err  # all in one listing
    if not torch.cuda.is_available():
        assert "CUDA is not available" in err
    assert "has 32 positions and N=64 is asked" in err
    assert not out.exists() or not any(out.iterdir())  # nothing was started


def test_machine_problems_are_found_once_the_config_itself_is_valid(tmp_path: Path) -> None:
    import torch

    captured = tmp_path / "short.pt"
    torch.save({name: torch.randn(1, 2, 32, 16) for name in "qkv"}, captured)
    config = write_tiny(
        tmp_path / "bad.toml",
        f'seq_lens = [64]\ndevice = ["cpu", "cuda"]\n[[inputs]]\nname = "captured"\npath = "{captured}"\n'
        "[variants.full]\n", heads=2, head_dim=16
    )
    result = run_cli("run", str(config), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    if not torch.cuda.is_available():
        assert "cuda asked for, but CUDA is not available on this machine" in result.stderr
    assert "has 32 positions and N=64 is asked" in result.stderr


@pytest.mark.slow
def test_reserved_hyperparameter_name_makes_the_plugin_broken_by_name(installed_plugins) -> None:
    listing = run_cli("list", env=installed_plugins)
    broken = listing.stdout.split("broken plugins")[1]
    assert "reserved-name" in broken and "hyperparameter 'seed' uses a reserved name" in broken
    assert "hyperparameter 'family' uses a reserved name" in broken
    run = run_cli("run", "quick", "--variants", "reserved-name,full", *SMALL, env=installed_plugins)
    assert run.returncode == 2 and "reserved name" in run.stderr


@pytest.mark.slow
def test_default_cost_is_dense_so_the_memory_guard_sees_a_plugins_scores(installed_plugins, tmp_path: Path) -> None:
    config = write_tiny(
        tmp_path / "guard.toml", "seq_lens = [64, 8192]\nmemory_limit_gb = 0.5\nvariants = ['dense-scores', 'full']\n", heads=2, head_dim=16
    )
    result = run_cli(
        "run", str(config), "--out", str(tmp_path), "--no-progress", "--no-report", env=installed_plugins
    )
    assert result.returncode == 0, result.stderr
    frame = read_results(only_run(tmp_path)).set_index(["variant", "seq_len"])
    assert frame.loc[("dense-scores", 64), "status"] == "ok"
    assert frame.loc[("dense-scores", 8192), "status"] == "skipped"  # 2 x 2 x 8192^2 x 4 bytes = 1 GiB of scores
    assert "estimated peak memory" in frame.loc[("dense-scores", 8192), "reason"]
    assert "does not override cost()" in frame.loc[("dense-scores", 8192), "reason"]  # and says where to fix it
    assert frame.loc[("full", 8192), "status"] == "ok"  # the fused kernel's tiles fit


# ---- the run folder -------------------------------------------------------------------------------


@pytest.mark.slow
def test_duplicate_cells_are_removed_when_the_plan_is_built(tmp_path: Path) -> None:
    config = write_tiny(tmp_path / "dup.toml", "seq_lens = [64, 64]\nseeds = [0, 0]\nvariants = ['full', 'band']\n", heads=2, head_dim=16)
    result = run_cli("run", str(config), "--seq-lens", "64,64", "--out", str(tmp_path / "out"), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "duplicate cell(s) removed" in result.stderr
    run = only_run(tmp_path / "out")
    assert read_results(run).cell_key.is_unique and len(read_results(run)) == 2
    assert run_cli("report", str(run)).returncode == 0
    assert run_cli("compare", str(run), str(run)).returncode == 0
    resumed = run_cli("run", "--resume", str(run), "--no-progress", "--no-report")
    assert resumed.returncode == 0 and len(read_results(run)) == 2


@pytest.mark.slow
def test_seeds_are_an_axis_each_with_its_own_speedups(tmp_path: Path) -> None:
    config = write_tiny(tmp_path / "seeds.toml", "seq_lens = [64]\nseeds = [0, 1]\nvariants = ['full', 'band']\n", heads=2, head_dim=16)
    result = run_cli("run", str(config), "--out", str(tmp_path / "out"), "--no-progress")
    assert result.returncode == 0, result.stderr
    frame = read_results(only_run(tmp_path / "out"))
    assert set(frame.seed) == {0, 1} and (frame[frame.variant == "full"].speedup == 1.0).all()
    plots = {p.name for p in (only_run(tmp_path / "out") / "plots").glob("*-time.png")}
    assert len(plots) == 2  # one per seed: settings never share a plot file
    assert ", seed 0\n" in result.stdout and ", seed 1\n" in result.stdout  # the verdict of each seed


@pytest.mark.slow
def test_a_second_writer_is_refused_while_the_first_runs(installed_plugins, tmp_path: Path) -> None:
    config = write_tiny(tmp_path / "slow.toml", "seq_lens = [16, 32, 48, 64, 80]\nvariants = ['chatty', 'full']\n", heads=2, head_dim=16)
    first, run = start_run(config, tmp_path / "out", installed_plugins, tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 60
        while not (run / "meta.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = run_cli("run", "--resume", str(run), "--no-progress", "--no-report", env=installed_plugins)
        assert second.returncode == 2 and "is being written by process" in second.stderr
    finally:
        first.wait(timeout=300)
    assert first.returncode == 0
    assert read_results(run).cell_key.is_unique and len(read_results(run)) == 10


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_names_the_resume_command(installed_plugins, tmp_path: Path) -> None:
    config = write_tiny(
        tmp_path / "long.toml", "seq_lens = [16, 32, 48, 64, 80, 96, 112, 128]\nvariants = ['chatty', 'full']\n", heads=2, head_dim=16
    )
    log = tmp_path / "run.log"
    process, run = start_run(config, tmp_path / "out", installed_plugins, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
        (run / "results.csv").exists() and len((run / "results.csv").read_text().splitlines()) >= 3
    ):
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    process.wait(timeout=120)
    err = log.read_text()
    assert process.returncode == 130, err
    assert f"attnbench run --resume {run}" in err and "Traceback" not in err
    assert "interrupted" in json.loads((run / "meta.json").read_text())
    resumed = run_cli("run", "--resume", str(run), "--no-progress", "--no-report", env=installed_plugins)
    assert resumed.returncode == 0, resumed.stderr
    assert len(read_results(run)) == 16 and read_results(run).cell_key.is_unique


@pytest.mark.slow
def test_isolate_is_not_fooled_by_a_plugin_that_prints(installed_plugins, tmp_path: Path) -> None:
    result = run_cli(
        "run", "quick", "--variants", "chatty,full", *SMALL, "--isolate", "--out", str(tmp_path), env=installed_plugins
    )
    assert result.returncode == 0, result.stderr
    frame = read_results(only_run(tmp_path))
    assert (frame.status == "ok").all(), frame[["variant", "status", "reason"]]


@pytest.mark.slow
def test_reasons_are_kept_whole_in_the_csv_and_escaped_in_tables(installed_plugins, tmp_path: Path) -> None:
    result = run_cli("run", "quick", "--variants", "odd-reason,full", "--seq-lens", "64", "--out", str(tmp_path),
                       "--no-progress", env=installed_plugins)  # fmt: skip
    assert result.returncode == 0, result.stderr
    run = only_run(tmp_path)
    reasons = read_results(run).set_index("variant").loc[["odd-reason"], "reason"]
    assert all(r.endswith(" END") and "\n" in r and "|" in r for r in reasons)  # whole in the CSV
    for text in ((run / "summary.md").read_text(), (run / "report.md").read_text()):
        assert "head_dim \\| must be 32" in text and "head_dim | must" not in text  # the pipe is escaped
        assert not any(line.startswith("second line") for line in text.splitlines())  # the newline is gone
    assert "…" in (run / "summary.md").read_text()  # shortened for display, with an ellipsis
    assert (
        "2 cell(s) did not run ok (error 2): reasons in summary.md" in result.stderr
    )  # the terminal counts them (one an input), points to summary


@pytest.mark.slow
def test_run_exits_3_when_no_cell_ran_ok(installed_plugins, tmp_path: Path) -> None:
    result = run_cli(
        "run", "quick", "--variants", "odd-reason", *SMALL, "--out", str(tmp_path), env=installed_plugins
    )
    assert result.returncode == 3 and "no cell ran ok" in result.stderr


# ---- the command line and the package -------------------------------------------------------------


def test_every_subcommand_and_argument_has_help() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    assert set(helps) == set(commands.choices) and all(helps.values())
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.dest} has no help"
    assert "exit status" in parser.format_help() and "presets:" in commands.choices["run"].format_help()


def test_version_and_presets() -> None:
    from attnbench import __version__

    assert run_cli("--version").stdout.strip() == f"attnbench {__version__}"
    presets = run_cli("presets")
    assert presets.returncode == 0 and "quick" in presets.stdout and "All built-in variants" in presets.stdout


@pytest.mark.slow
def test_check_exit_codes(installed_plugins) -> None:
    assert run_cli("check", "band", "--param", "window=8", env=installed_plugins).returncode == 0
    assert run_cli("check", "no-such-variant").returncode == 2
    cannot = run_cli("check", "full-xformers")
    import torch

    if not torch.cuda.is_available():
        assert cannot.returncode == 2 and "cannot be checked on this machine" in cannot.stderr


@pytest.mark.slow
def test_the_wheel_ships_its_presets_and_works_outside_the_checkout(tmp_path: Path) -> None:
    """Build the wheel, install it into a fresh venv (dependencies borrowed from this one), and from a folder
    that is not the checkout list the variants and resolve every preset."""
    root = TESTS.parent
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels),
         str(root)],
        check=True, capture_output=True,
    )  # fmt: skip
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [wheel] = wheels.glob("attnbench-*.whl")
    site = next((venv / "lib").glob("python*/site-packages"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    borrowed = next(p for p in sys.path if p.endswith("site-packages") and (Path(p) / "torch").is_dir())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), borrowed])}
    python = str(venv / "bin" / "python")
    where = subprocess.run(
        [python, "-c", "import attnbench, attnbench.configs; print(attnbench.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert str(site) in where.stdout, where.stdout + where.stderr  # the wheel's copy, not the checkout
    listing = subprocess.run(
        [python, "-m", "attnbench.cli", "list"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert listing.returncode == 0 and "band " in listing.stdout, listing.stderr
    script = (
        "from attnbench.plan.config import load_config, preset_names\n"
        "for n in preset_names(): load_config(n, cluster=True)\nprint(preset_names())"  # cluster: gpu-check's CUDA
    )
    presets = subprocess.run([python, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert presets.returncode == 0, presets.stderr
    assert {"quick", "default", "lsh", "error-study"} <= set(eval(presets.stdout))
    # every module of the checkout is in the wheel and imports from there: no sub-package left out by a list
    names = sorted(source_modules())
    script = "import importlib, sys\nfor n in sys.argv[1:]: print(importlib.import_module(n).__file__)"
    imported = subprocess.run([python, "-c", script, *names], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    files = imported.stdout.split()
    assert len(files) == len(names) and all(f.startswith(str(site)) for f in files), imported.stdout
