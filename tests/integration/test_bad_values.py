"""Bad values are refused before any work, and a wrong output is caught (issue 22, items 4, 6 and 7)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attnbench import AttentionVariant
from attnbench.cli import main
from attnbench.plan.config import ConfigError, parse_config
from attnbench.run.sweep import run_plan
from attnbench.runfolder.results import read_results
from helpers import tiny

FULL_AT_16 = 'variants = ["full"]\nseq_lens = [16]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.01\n'  # as a config file


def finished_run(tmp_path: Path, toml: str, *flags: str) -> Path:
    """The folder of a run of the config text `toml` (written to tmp_path/c.toml) into tmp_path/out, which ended ok."""
    config = tmp_path / "c.toml"
    config.write_text(toml)
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress", *flags]) == 0
    (run,) = (tmp_path / "out").iterdir()
    return run


@pytest.mark.parametrize(
    "key, value",
    [
        ("min_run_time", float("nan")),
        ("min_run_time", float("inf")),
        ("time_budget_s", float("nan")),
        ("memory_limit_gb", float("nan")),
        ("memory_limit_gb", float("inf")),
        ("cell_timeout_s", float("inf")),
        ("threads", 100000),
        ("self_check_len", 0),
        ("min_run_time", 1e308),  # finite, and never ends
        ("seeds", [2**64]),  # every cell failed: overflow when unpacking long long
    ],
)
def test_non_finite_and_out_of_range_settings_are_refused(key: str, value: float) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(tiny(**{key: value}))
    assert f"{key}: must be" in str(refused.value)


def test_a_non_finite_input_parameter_is_refused() -> None:
    with pytest.raises(ConfigError, match="temperature must be a finite positive number, got nan"):
        parse_config(tiny(inputs=[{"name": "gaussian", "temperature": float("nan")}]))


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "x" * 300, "two\nlines"])
def test_a_config_name_must_be_a_plain_file_name(name: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="name: "):
        parse_config(tiny(name=name))
    config = tmp_path / "c.toml"
    config.write_text(f'name = "{name}"\nvariants = ["full"]\nseq_lens = [16]\n')
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    assert not (tmp_path / "out").exists() and not any(p.name.endswith("x") for p in tmp_path.parent.iterdir())


def test_compare_refuses_a_nan_gate(tmp_path: Path) -> None:
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "results.csv").write_text("cell_key\n")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--fail-above", "nan"]) == 2


class OneRow(AttentionVariant):
    name, family, exact = "one-row", "test", False

    def forward(self, q, k, v, *, causal, key_padding_mask):
        return v.mean(dim=-2, keepdim=True)  # (b, h, 1, e): broadcastable, and wrong


class Half(AttentionVariant):
    name, family, exact = "half", "test", False

    def forward(self, q, k, v, *, causal, key_padding_mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).double()


def test_run_refuses_an_output_of_the_wrong_shape_or_dtype(toy_registry, tmp_path: Path) -> None:
    """A broadcastable (b, h, 1, Dv) output was recorded ok and faster than full; now it is an error."""
    registry = toy_registry(OneRow, Half)
    config = parse_config(
        tiny(variants=["full", "one-row", "half"]), registry=registry
    )
    frame = read_results(run_plan(config, tmp_path, registry=registry, progress=False)).set_index("variant")
    assert frame.loc["full", "status"] == "ok"
    assert frame.loc["one-row", "status"] == "error"
    assert frame.loc["one-row", "reason"] == "output is (1, 1, 1, 8) float32, expected (b, h, Nq, Dv) = (1, 1, 16, 8) float32, the inputs' dtype"
    assert frame.loc["half", "status"] == "error" and "output is (1, 1, 16, 8) float64" in frame.loc["half", "reason"]


@pytest.mark.parametrize("version", ["v2", "v2-hybrid", "v1"])
def test_the_memory_guard_reads_the_control_groups_limit(version: str, tmp_path: Path, monkeypatch) -> None:
    """Inside a 3 GiB container the guard must not see the host's memory (full-math once ran into the OOM killer).
    A hybrid host mounts v2 under unified/ beside the v1 controllers."""
    import attnbench.measure.machine as machine

    gib = 2**30
    if version.startswith("v2"):
        group = tmp_path / ("unified" if version == "v2-hybrid" else "") / "job.slice"
        group.mkdir(parents=True)
        (group / "memory.max").write_text(f"{3 * gib}\n")
        (group / "memory.current").write_text(f"{1 * gib}\n")
        membership = "0::/job.slice\n"
    else:
        group = tmp_path / "memory" / "slurm" / "job_7"
        group.mkdir(parents=True)
        (group / "memory.limit_in_bytes").write_text(f"{3 * gib}\n")
        (group / "memory.usage_in_bytes").write_text(f"{1 * gib}\n")
        membership = "12:cpuset:/slurm/job_7\n11:memory:/slurm/job_7\n"
    (tmp_path / "self-cgroup").write_text(membership)
    monkeypatch.setattr(machine, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(machine, "PROC_CGROUP", tmp_path / "self-cgroup")
    assert machine.cgroup_headroom_bytes() == 2 * gib
    assert machine.available_memory_bytes("cpu") <= 2 * gib
    (group / ("memory.max" if version.startswith("v2") else "memory.limit_in_bytes")).write_text(
        "max\n" if version.startswith("v2") else f"{2**63 - 4096}\n"
    )
    assert machine.cgroup_headroom_bytes() is None  # no limit: the machine's own memory counts


@pytest.mark.slow
def test_a_group_cut_short_while_its_rows_were_written_is_measured_again_whole(tmp_path: Path) -> None:
    """Issue 22, items 1 and 2: a kill between a group's rows (the last row lost) and in the middle of a samples
    line (its tail cut) must not leave a row without its baseline's speedup, nor samples merged from two runs."""
    import csv

    from attnbench.runfolder.folder import read_samples

    run = finished_run(
        tmp_path,
        'variants = ["full", "band"]\nseq_lens = [16, 32]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.01\n'
        "min_rounds = 3\nerror = false\n",
        "--no-report",
    )
    lines = (run / "results.csv").read_text().splitlines(keepends=True)
    (run / "results.csv").write_text("".join(lines[:-1]))  # the last group's second row never written
    samples = (run / "samples.csv").read_bytes()
    (run / "samples.csv").write_bytes(samples[:-7])  # and the samples' last line cut in the middle
    assert main(["run", "--resume", str(run), "--no-progress", "--no-report"]) == 0
    frame = read_results(run)
    assert frame.cell_key.is_unique and len(frame) == 4
    assert frame.speedup.notna().all()  # every row measured in turns with its baseline
    counts = read_samples(run)
    assert all(len(counts[row.cell_key]) == row.time_repeats for row in frame.itertuples())  # one measurement each
    with (run / "samples.csv").open(newline="") as file:
        assert all(len(record) == 3 for record in csv.reader(file))  # no half line left anywhere


@pytest.mark.slow
def test_io_errors_are_a_message_and_exit_2_never_a_traceback(tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 22, item 3: an --out under a regular file, and a full disk while the report is written (injected at
    the write call): exit 2 with the path and the reason; the report left is the old one, never 0 bytes."""
    import errno

    import attnbench.report.run_report as report

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["run", "quick", "--seq-lens", "16", "--out", str(blocker / "out"), "--no-progress"]) == 2
    assert "cannot read or write" in capsys.readouterr().err

    run = finished_run(tmp_path, FULL_AT_16)
    before = (run / "report.md").read_text()

    def full_disk(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(report, "write_text_atomic", full_disk)
    capsys.readouterr()
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"cannot read or write {run / 'report.md'}: No space left on device" in err and "Traceback" not in err
    assert (run / "report.md").read_text() == before


def test_compare_refuses_a_folder_being_written_or_unreadable(tmp_path: Path, capsys) -> None:
    """Issue 22, item 11: a run still being written is not compared (its missing cells are no regressions), and a
    garbage results.csv is 'unreadable', exit 2."""
    import multiprocessing
    import time

    config = tmp_path / "c.toml"
    config.write_text('variants = ["full"]\nseq_lens = [16]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.01\n')
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress", "--no-report"]) == 0
    (done,) = (tmp_path / "out").iterdir()
    busy = tmp_path / "busy"

    holder = multiprocessing.get_context("fork").Process(target=_hold_lock, args=(busy,), daemon=True)
    holder.start()
    try:
        deadline = time.monotonic() + 30
        while not ((busy / ".lock").exists() and (busy / ".lock").read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert main(["compare", str(done), str(busy)]) == 2
        assert "is still being written (process" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.join()
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "results.csv").write_bytes(b"cell_key,status\n\x00\xff\xfe garbage, \"unclosed\n")
    assert main(["compare", str(done), str(garbage)]) == 2
    assert "unreadable" in capsys.readouterr().err


def _hold_lock(folder: Path) -> None:
    """A run's writer, holding the folder's lock (RunFolder's), as a run in progress does."""
    import time

    from attnbench.runfolder.folder import RunFolder

    with RunFolder(folder):
        time.sleep(60)


@pytest.mark.parametrize("fault", ["nan", "inf", "complex", "sparse"])
def test_a_captured_file_with_non_finite_or_complex_values_is_refused(fault: str, tmp_path: Path) -> None:
    """Issue 22, item 5 (and the complex values of item 12): refused at validation, naming the file and where."""
    import torch

    q, k, v = (torch.randn(1, 2, 32, 8) for _ in range(3))
    if fault == "complex":
        k = torch.complex(k, torch.ones_like(k))
    elif fault == "sparse":  # review of issue 22: a sparse (or meta) tensor was a traceback
        q = q.to_sparse()
    else:
        v[0, 1, 5, 3] = float(fault)
    path = tmp_path / "qkv.pt"
    torch.save({"q": q, "k": k, "v": v}, path)
    with pytest.raises(ConfigError) as refused:
        parse_config(tiny(inputs=[{"name": "captured", "path": str(path)}]))
    text = str(refused.value)
    assert str(path) in text
    if fault == "complex":
        assert "k is complex64; expected real floating point" in text
    elif fault == "sparse":
        assert "q is a torch.sparse_coo tensor on cpu; expected a dense (strided) tensor" in text
    else:
        assert "v has 1 NaN or Inf value(s), the first at index (0, 1, 5, 3)" in text


@pytest.mark.slow
def test_a_worker_stuck_in_a_group_step_is_not_blamed_on_one_cell(tmp_path: Path) -> None:
    """Issue 22, item 9: an isolated worker killed while computing the group's exact reference marks every cell of
    the group with that step, instead of blaming the baseline and running the group again without it."""
    config = tmp_path / "c.toml"
    config.write_text(
        'variants = ["full", "band"]\nseq_lens = [4096]\ncell_timeout_s = 1.0\n'
        '[[inputs]]\nname = "gaussian"\n'
    )  # the float64 reference at N=4096 and 8 heads takes seconds: past the 1 s watchdog
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress", "--no-report", "--isolate"]) == 3
    (run,) = (tmp_path / "out").iterdir()
    frame = read_results(run)
    assert list(frame.status) == ["timeout", "timeout"]
    assert frame.reason.nunique() == 1 and "computing the exact reference of the whole group" in frame.reason.iloc[0]


def test_check_finds_a_causal_leak_that_appears_only_at_longer_lengths() -> None:
    """Issue 22, item 10: a plugin leaking only from N >= 128 passed the single N=96 check; now it fails, and an
    honest causal variant still passes."""
    import torch
    from attnbench import AttentionVariant
    from attnbench.conformance import check_contexts, run_check

    class LeaksFrom128(AttentionVariant):
        name, family, exact = "leaks-from-128", "test", False

        def forward(self, q, k, v, *, causal, key_padding_mask):
            n = q.shape[-2]
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal and n < 128)
            return out

    class Honest(LeaksFrom128):
        name = "honest"

        def forward(self, q, k, v, *, causal, key_padding_mask):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    for ctx in check_contexts(lambda: LeaksFrom128()):
        result = run_check("causal_leakage", ctx)
        assert result.status == "fail" and "(N=160" in result.detail, result
    for ctx in check_contexts(lambda: Honest()):
        assert run_check("causal_leakage", ctx).status == "pass"


def test_a_damaged_meta_json_or_a_utf16_config_is_a_message_and_exit_2(tmp_path: Path, capsys) -> None:
    """Issue 22, item 12: corrupt meta.json in report, compare and resume, and a UTF-16 config: no traceback."""
    run = finished_run(tmp_path, FULL_AT_16, "--no-report")
    (run / "meta.json").write_text('{"config": {"name": "cut sho')
    capsys.readouterr()
    for command in (["report", str(run)], ["compare", str(run), str(run)], ["run", "--resume", str(run)]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert "meta.json is not valid JSON" in err and "Traceback" not in err, command
    utf16 = tmp_path / "u.toml"
    utf16.write_text('variants = ["full"]\n', encoding="utf-16")
    assert main(["run", str(utf16), "--out", str(tmp_path / "out2")]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err


def test_a_garbage_line_in_results_csv_is_no_cell(tmp_path: Path) -> None:
    """Issue 22, item 12: a hand-edited line is not read as a bogus cell, and the report still builds."""
    from attnbench.report.run_report import write_report

    run = finished_run(tmp_path, FULL_AT_16, "--no-report")
    with (run / "results.csv").open("a") as file:
        file.write("some,garbage,typed,by,hand\n")
    frame = read_results(run)
    assert len(frame) == 1 and frame.status.iloc[0] == "ok"
    assert write_report(run).exists()


@pytest.mark.slow
def test_resume_without_meta_json_runs_the_config_toml_beside_it(tmp_path: Path) -> None:
    """Issue 22, item 12: a run folder whose meta.json is gone still resumes from the config.toml every run writes."""
    run = finished_run(tmp_path, FULL_AT_16.replace("[16]", "[16, 32]"), "--no-report")
    lines = (run / "results.csv").read_text().splitlines(keepends=True)
    (run / "results.csv").write_text("".join(lines[:-1]))  # the N=32 group lost
    (run / "meta.json").unlink()
    assert main(["run", "--resume", str(run), "--no-progress", "--no-report"]) == 0
    assert sorted(read_results(run).seq_len) == [16, 32] and (run / "meta.json").exists()


def test_resume_with_a_config_named_too_is_refused_not_ignored(tmp_path: Path, capsys) -> None:
    """`run --resume DIR default` ran the stored config and said nothing of `default`: now exit 2, before any work."""
    run = tmp_path / "run"
    run.mkdir()
    assert main(["run", "--resume", str(run), "default"]) == 2
    assert "--resume runs the stored config; drop default" in capsys.readouterr().err
    assert not any(run.iterdir())


def test_an_isolated_run_removes_worker_folders_a_killed_run_left(tmp_path: Path) -> None:
    """Issue 22, item 12: `kill -9` of an --isolate run leaves its worker's temporary folder; the next one removes
    it (its parent is gone) and leaves a live process's alone."""
    import os
    import subprocess
    import tempfile

    from attnbench.plan.config import Settings
    from attnbench.run.executors import WORKER_FOLDER, Isolated

    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = Path(tempfile.mkdtemp(prefix=f"{WORKER_FOLDER}{gone.pid}-"))
    live = Path(tempfile.mkdtemp(prefix=f"{WORKER_FOLDER}{os.getpid()}-"))
    try:
        Isolated(Settings())
        assert not stale.exists() and live.exists()
    finally:
        for folder in (stale, live):
            if folder.exists():
                folder.rmdir()


def test_a_captured_file_at_a_deep_path_gets_a_report_with_plots(tmp_path: Path) -> None:
    """Issue 22, item 3: an input label holds its captured file's path; a 300-character path made a plot's file name
    over the file system's 255 bytes (OSError while the report was written)."""
    import torch

    deep = tmp_path
    while len(str(deep)) < 300:
        deep = deep / ("captured-attention-of-a-model-" + "x" * 40)
    deep.mkdir(parents=True)
    path = deep / "qkv.pt"
    torch.save({name: torch.randn(1, 1, 16, 8) for name in "qkv"}, path)
    run = finished_run(
        tmp_path,
        'seq_lens = [16]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.01\n'
        f'[[inputs]]\nname = "captured"\npath = "{path}"\n[variants.full]\n[variants.band]\nwindow = 4\n',
    )
    plots = list((run / "plots").glob("*-pareto-N16.png"))
    assert plots and all(len(p.name.encode()) <= 120 for p in plots)
    assert "pareto-N16.png" in (run / "report.md").read_text()


def test_a_results_header_narrower_than_its_rows_is_unreadable_not_a_traceback(tmp_path: Path, capsys) -> None:
    """Issue 22, item 12: a cut header put every value under the wrong column; resume raised ValueError and report
    said the run had no finished cell. Now resume, report and compare name the file, exit 2."""
    run = finished_run(tmp_path, FULL_AT_16, "--no-report")
    header, *rows = (run / "results.csv").read_text().splitlines(keepends=True)
    (run / "results.csv").write_text(",".join(header.split(",")[:5]) + "\n" + "".join(rows))
    capsys.readouterr()
    for command in (["run", "--resume", str(run)], ["report", str(run)], ["compare", str(run), str(run)]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert "its header names 5 columns but a row has" in err and "Traceback" not in err, command


def test_model_refuses_a_min_run_time_that_never_ends(tmp_path: Path, capsys) -> None:
    """Issue 22, item 6: `model --min-run-time inf` hung; refused with the other problems, before any loading."""
    assert main(["model", str(tmp_path), "--variants", "band", "--random-tokens", "8", "--min-run-time", "inf",
                 "--out", str(tmp_path / "o")]) == 2  # fmt: skip
    assert "--min-run-time must be a finite number > 0, got inf" in capsys.readouterr().err



def test_a_config_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Review of issue 22: a UTF-8 config with a BOM (some Windows editors) got 'Invalid statement (line 1)'."""
    from attnbench.plan.config import load_config

    config = tmp_path / "bom.toml"
    config.write_bytes(b"\xef\xbb\xbf" + b'variants = ["full"]\nseq_lens = [16]\n')
    assert [c.seq_len for c in load_config(str(config)).plan().cells] == [16]


def _damage(run: Path, how: str) -> None:
    import json

    results, samples, meta = run / "results.csv", run / "samples.csv", run / "meta.json"
    if how == "results-not-utf8":
        results.write_bytes(results.read_bytes() + b"\xff\xfe\x00 binary\n")
    elif how == "results-empty":
        results.write_bytes(b"")
    elif how in ("time-not-a-number", "speedup-not-a-number"):
        column = "time_median_s" if how.startswith("time") else "speedup"
        header, *rows = results.read_text().splitlines()
        index = header.split(",").index(column)
        import csv
        import io

        records = list(csv.reader(io.StringIO(results.read_text())))
        for record in records[1:]:
            record[index] = "zzz"
        buffer = io.StringIO()
        csv.writer(buffer).writerows(records)
        results.write_text(buffer.getvalue())
    elif how == "samples-not-utf8":
        samples.write_bytes(samples.read_bytes() + b"\xff\xfe garbage\n")
    elif how == "samples-nonsense":
        samples.write_text(samples.read_text().replace(",0,", ",0,-5e3,").replace("\n", "\n", 1))
    else:
        key, value = how.split("=")
        data = json.loads(meta.read_text())
        data[key] = json.loads(value)
        meta.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "how",
    ["results-not-utf8", "results-empty", "time-not-a-number", "speedup-not-a-number", "samples-not-utf8",
     "samples-nonsense", 'config="hello"', "machine=null", 'peaks="zzz"', "command=5"],
)  # fmt: skip
@pytest.mark.slow
def test_a_damaged_run_file_is_a_message_never_a_traceback(how: str, tmp_path: Path, capsys) -> None:
    """Review of issue 22: each of these damages gave a traceback (exit 1) in report, compare or resume. Each
    command now reads what it can or names the file and exits 2."""
    run = finished_run(tmp_path, FULL_AT_16.replace('["full"]', '["full", "band"]'), "--no-report")
    _damage(run, how)
    commands = (["report", str(run)], ["compare", str(run), str(run)], ["run", "--resume", str(run), "--no-progress"])
    for command in commands:
        code = main(command)  # an exception here is the failure
        err = capsys.readouterr().err
        assert code in (0, 2, 3), (command, code, err)
        if code == 2:
            assert str(run) in err, (command, err)


@pytest.mark.slow
@pytest.mark.parametrize("rows_lost", ["two-of-three", "all-three"])
def test_a_resume_keeps_no_sample_of_a_cell_it_measures_again(rows_lost: str, tmp_path: Path) -> None:
    """Review of issue 22: a group whose rows were cut short (or whose samples reached the disk and none of its rows,
    as a full disk leaves it) kept the old samples of its cells without a row, so samples.csv held two
    measurements of a cell (25 samples for a row saying 5). Every sample of a cell measured again is dropped."""
    from attnbench.runfolder.folder import read_samples

    run = finished_run(
        tmp_path,
        'seq_lens = [16, 32]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.01\n[variants.full]\n[variants.band]\n'
        "window = [4, 8]\n",
        "--no-report",
    )
    lines = (run / "results.csv").read_text().splitlines(keepends=True)
    cut = 2 if rows_lost == "two-of-three" else 3  # the last group (N=32) has three rows
    (run / "results.csv").write_text("".join(lines[:-cut]))
    assert main(["run", "--resume", str(run), "--no-progress", "--no-report"]) == 0
    frame = read_results(run)
    assert len(frame) == 6 and frame.cell_key.is_unique and frame.speedup.notna().all()
    samples = read_samples(run)
    assert {row.cell_key: len(samples[row.cell_key]) for row in frame.itertuples()} == {
        row.cell_key: row.time_repeats for row in frame.itertuples()
    }
    with (run / "samples.csv").open() as file:
        assert sum(1 for _ in file) - 1 == int(frame.time_repeats.sum())  # no stray line of a forgotten cell
