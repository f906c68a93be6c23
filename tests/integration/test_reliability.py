"""Runs that lose nothing (--isolate, --resume, partial rows) and the plugin kit on real installed packages."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from attnbench.plan.config import parse_config
from attnbench.run.sweep import run_plan as run_sweep
from attnbench.runfolder.results import ResultsWriter, read_results
from attnbench.runfolder.rows import COLUMNS, row_for
from helpers import TESTS, run_cli, write_plugin

pytestmark = pytest.mark.slow  # real runs in subprocesses, faults staged

MISBEHAVING = """
    import os, signal, time
    from attnbench.interface import AttentionVariant

    class Segfaults(AttentionVariant):
        name = "segfaults"
        family = "test"
        exact = False
        def forward(self, q, k, v, *, causal, key_padding_mask):
            os.kill(os.getpid(), signal.SIGSEGV)

    class Hangs(AttentionVariant):
        name = "hangs"
        family = "test"
        exact = False
        def forward(self, q, k, v, *, causal, key_padding_mask):
            time.sleep(600)

    class Sleepy(AttentionVariant):
        name = "sleepy"
        family = "test"
        exact = False
        def forward(self, q, k, v, *, causal, key_padding_mask):
            time.sleep(0.05)
            return v.clone()
"""
ENTRIES = {
    "segfaults": "misbehaving_mod:Segfaults",
    "hangs": "misbehaving_mod:Hangs",
    "sleepy": "misbehaving_mod:Sleepy",
}


@pytest.fixture
def misbehaving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The plugin importable here and in child processes; returns a registry that sees it."""
    from attnbench.registry import Registry

    folder = write_plugin(tmp_path / "plugin", "misbehaving-plugin", ENTRIES, {"misbehaving_mod": MISBEHAVING})
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(folder), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    )
    return folder, Registry()


def test_isolate_turns_a_segfault_and_a_hang_into_rows(misbehaving, tmp_path: Path) -> None:
    _, registry = misbehaving
    config = parse_config(
        {
            "variants": ["segfaults", "hangs", "full"],
            "seq_lens": [16, 32],
            "heads": 1,
            "head_dim": 8,
            "min_run_time": 0.01,
            "cell_timeout_s": 5,
        },
        registry=registry,
    )
    frame = read_results(run_sweep(config, tmp_path / "out", registry=registry, progress=False, isolate=True))
    status = {(r.variant, r.seq_len): (r.status, r.reason) for r in frame.itertuples()}
    assert status[("segfaults", 16)][0] == "crashed" and "SIGSEGV" in status[("segfaults", 16)][1]
    assert status[("hangs", 16)][0] == "timeout" and "cell_timeout_s=5" in status[("hangs", 16)][1]
    assert status[("segfaults", 32)] == ("skipped", "larger N skipped: crashed at N=16")
    assert status[("hangs", 32)] == ("skipped", "larger N skipped: timeout at N=16")
    assert status[("full", 16)][0] == status[("full", 32)][0] == "ok"


def test_resume_after_sigkill_gives_exactly_the_uninterrupted_cell_set(misbehaving, tmp_path: Path) -> None:
    config = tmp_path / "sweep.toml"
    config.write_text(
        "seq_lens = [8, 16, 24, 32, 40, 48]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.1\nmin_rounds = 2\n"
        'error = false\nvariants = ["sleepy", "full"]\n'
    )
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "attnbench.cli", "run", str(config), "--out", str(out), "--no-progress", "--no-report"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = list(out.glob("*/results.csv"))
        if found and len(found[0].read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    run_dir = found[0].parent
    with found[0].open("a") as file:  # as if killed in the middle of writing a row
        file.write("half,a,row")
    kept = read_results(run_dir)  # every finished row survives the kill, the half row does not count
    assert 3 <= len(kept) < 12 and (kept.status == "ok").all() and kept.time_median_s.notna().all()
    resumed = run_cli("run", "--resume", str(run_dir), "--no-progress", "--no-report")
    assert resumed.returncode == 0, resumed.stderr
    reference = run_cli("run", str(config), "--out", str(tmp_path / "reference"), "--no-progress", "--no-report")
    assert reference.returncode == 0, reference.stderr
    keys = read_results(run_dir).cell_key
    assert keys.is_unique and len(keys) == 12
    assert set(keys) == set(read_results(next((tmp_path / "reference").iterdir())).cell_key)


def test_resume_refuses_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    result = run_cli("run", "--resume", str(tmp_path))
    assert result.returncode == 2 and "not a run folder" in result.stderr


def test_resume_refuses_a_results_file_it_would_corrupt(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text('{"config": {"variants": ["full"], "seq_lens": [64]}}')
    (tmp_path / "results.csv").write_text("a,b\n1,2\n")
    result = run_cli("run", "--resume", str(tmp_path), "--no-progress")
    assert result.returncode == 2 and "not an attnbench results table" in result.stderr
    assert (tmp_path / "results.csv").read_text() == "a,b\n1,2\n"


def test_writer_cuts_a_half_written_row(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    header, row = ",".join(COLUMNS), ",".join("1" * len(COLUMNS))
    path.write_text(f"{header}\n{row}\n3,")
    ResultsWriter(path).close()
    assert path.read_text() == f"{header}\n{row}\n"


def test_writer_refuses_to_append_to_a_csv_that_is_not_a_results_table(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not an attnbench results table"):
        ResultsWriter(path)
    assert path.read_text() == "a,b\n1,2\n"


def test_installed_plugin_is_listed_with_its_package_and_the_broken_one_with_its_error(installed_plugins) -> None:
    listing = run_cli("list", env=installed_plugins)
    assert listing.returncode == 0, listing.stderr
    line = next(line for line in listing.stdout.splitlines() if line.startswith("chunked "))
    assert "attnbench-example-plugin 0.1.0" in line
    broken = listing.stdout.split("broken plugins")[1]
    assert "broken (attnbench-broken-plugin 0.1.0)" in broken and "a_library_that_is_not_installed" in broken
    assert "band " in listing.stdout  # the built-ins are unaffected


def test_installed_plugin_is_benchmarked_beside_the_builtins_and_passes_check(
    installed_plugins, tmp_path: Path
) -> None:
    run = run_cli(
        "run",
        "quick",
        "--variants",
        "chunked,full,band",
        "--seq-lens",
        "64,200",
        "--out",
        str(tmp_path),
        "--no-progress",
        "--no-report",
        env=installed_plugins,
    )
    assert run.returncode == 0, run.stderr
    frame = read_results(next(tmp_path.iterdir()))
    assert (frame.status == "ok").all() and set(frame.variant) == {"chunked", "full", "band"}
    assert frame[frame.variant == "chunked"].self_check.str.startswith("pass").all()
    check = run_cli("check", "chunked", "--param", "chunk=7", env=installed_plugins)
    assert check.returncode == 0 and "0 failed" in check.stdout, check.stdout


def test_a_broken_plugin_named_in_a_config_stops_it_before_any_work(installed_plugins, tmp_path: Path) -> None:
    run = run_cli("run", "quick", "--variants", "broken,full", "--out", str(tmp_path), env=installed_plugins)
    assert run.returncode == 2
    assert "Variant 'broken' from attnbench-broken-plugin 0.1.0 cannot be used" in run.stderr
    assert not any(tmp_path.iterdir())


def test_writer_resuming_a_file_from_an_older_version_keeps_every_row_aligned(tmp_path: Path) -> None:
    # an older results.csv: one of today's columns missing, one column today's version no longer writes
    path = tmp_path / "results.csv"
    older = [column for column in COLUMNS if column != "label"] + ["retired"]
    old_row = {column: "" for column in older} | {"cell_key": "old", "variant": "full", "status": "ok", "seq_len": "32"}
    old_row["retired"] = "x"
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=older)
        writer.writeheader()
        writer.writerow(old_row)
    cell = parse_config({"variants": ["full"], "seq_lens": [64]}).plan().cells[0]
    with ResultsWriter(path) as writer:
        writer.append(row_for(cell, family="exact", exact=True))
    frame = read_results(tmp_path)
    assert list(frame.cell_key) == ["old", cell.key()]
    assert list(frame.variant) == ["full", "full"] and frame.label.iloc[0] == ""
    assert next(csv.DictReader(path.open()))["retired"] == "x"  # kept in the file, not read into reports


@pytest.mark.parametrize("how", ["console-script", "python-m"])
def test_the_command_exits_when_done_whatever_threads_a_plugin_left(installed_plugins, tmp_path: Path, how: str) -> None:
    """Issue 22, item 12: a run hung at exit about 1 in 70 (a library's thread pool shut down at interpreter
    exit). A plugin leaving a thread that never ends is the same hang made certain: an ordinary exit waits for
    it forever; `attnbench` exits with its code once its files are written, still running exit hooks."""
    config = tmp_path / "c.toml"
    config.write_text('variants = ["full", "never-lets-go", "chatty"]\nseq_lens = [16]\nheads = 1\nhead_dim = 8\n'
                      "min_run_time = 0.01\n")  # fmt: skip
    command = [str(Path(sys.executable).parent / "attnbench")] if how == "console-script" else [
        sys.executable, "-m", "attnbench.cli"]  # fmt: skip
    finished = subprocess.run(
        [*command, "run", str(config), "--out", str(tmp_path / "out"), "--no-progress"],
        env=installed_plugins, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.rstrip().endswith("chatty plugin: bye")  # a plugin's atexit hook ran, last
    (run,) = (tmp_path / "out").iterdir()
    assert (run / "report.md").stat().st_size > 0


def test_a_plugin_calling_sys_exit_costs_its_cell_not_the_run(installed_plugins, tmp_path: Path) -> None:
    """Review of issue 22: in process, a plugin's sys.exit() ended the run silently with exit 0 (3 of 9 cells, no
    summary, meta.json neither finished nor interrupted). It is now that cell's error and the sweep goes on."""
    config = tmp_path / "c.toml"
    config.write_text('variants = ["full", "exits"]\nseq_lens = [16, 32, 64]\nheads = 1\nhead_dim = 8\n'
                      "min_run_time = 0.01\n")  # fmt: skip
    finished = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", "run", str(config), "--out", str(tmp_path / "out"), "--no-progress",
         "--no-report"], env=installed_plugins, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr
    (run,) = (tmp_path / "out").iterdir()
    frame = read_results(run).set_index(["variant", "seq_len"])
    assert len(frame) == 6 and (frame.loc["full"].status == "ok").all()
    assert frame.loc[("exits", 16), "status"] == "ok"
    assert frame.loc[("exits", 32), "status"] == "error"
    assert frame.loc[("exits", 32), "reason"].startswith("the variant called sys.exit(3)")
    assert (run / "summary.md").exists() and "finished" in json.loads((run / "meta.json").read_text())


def test_the_command_started_with_its_output_closed_exits_cleanly(tmp_path: Path) -> None:
    """Review of issue 22: `attnbench list >&-` ended in a traceback in the exit path (sys.stdout is None)."""
    listed = subprocess.run(
        f"{Path(sys.executable).parent / 'attnbench'} list >&-", shell=True, capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
