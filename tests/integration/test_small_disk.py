"""Real file systems that say no (issue 22, item 3): a read-only mount, and a small disk that fills up mid-run.

Each case runs the CLI inside a private mount namespace (`unshare -rm`: no root needed where user namespaces are
allowed) on a tmpfs made for it; the case is skipped where such a namespace cannot be made.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from attnbench.runfolder.folder import read_samples
from attnbench.runfolder.results import read_results

CLI = f"{sys.executable} -m attnbench.cli"
CONFIG = (
    'name = "disk"\nvariants = ["full", "band"]\nseq_lens = [16, 32, 48, 64, 80, 96, 112, 128]\n'
    "heads = 1\nhead_dim = 8\nmin_run_time = 0.2\nerror = false\n"
)


def _namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


pytestmark = [
    pytest.mark.skipif(not _namespaces_work(), reason="no user mount namespace here (unshare -rm)"),
    pytest.mark.slow,  # real runs in subprocesses, a disk made full
]


def _in_namespace(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """`script` (sh) in a private mount namespace, with $M a mount point and $T the test's folder."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"set -u\nM={mount}\nT={tmp_path}\n{script}"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_read_only_out_is_a_message_and_exit_2(tmp_path: Path) -> None:
    """run, report, capture and model with --out on a read-only mount: exit 2, the path and the reason, no
    traceback."""
    (tmp_path / "c.toml").write_text(CONFIG.replace("[16, 32, 48, 64, 80, 96, 112, 128]", "[16]"))
    done = subprocess.run(
        [*CLI.split(), "run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "done"), "--no-progress",
         "--no-report"], capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = (tmp_path / "done").iterdir()
    script = f"""
mount -t tmpfs -o size=1m tmpfs $M && cp -r {run} $M/run && mount -o remount,ro $M || exit 99
{CLI} run $T/c.toml --out $M/out --no-progress > $T/run.log 2>&1; echo "run $?"
{CLI} report $M/run > $T/report.log 2>&1; echo "report $?"
{CLI} capture $T --random-tokens 4 --out $M/qkv.pt > $T/capture.log 2>&1; echo "capture $?"
{CLI} model $T --variants band --random-tokens 4 --out $M/model > $T/model.log 2>&1; echo "model $?"
"""
    shell = _in_namespace(script, tmp_path)
    assert shell.returncode != 99, shell.stderr
    codes = dict(line.split() for line in shell.stdout.splitlines())
    assert codes == {"run": "2", "report": "2", "capture": "2", "model": "2"}, shell.stdout
    for name in ("run", "report"):
        log = (tmp_path / f"{name}.log").read_text()
        assert f"cannot read or write {tmp_path / 'mnt'}" in log and "Read-only file system" in log, log
        assert "Traceback" not in log
    capture = (tmp_path / "capture.log").read_text()
    assert f"--out {tmp_path / 'mnt' / 'qkv.pt'}: its folder cannot be written" in capture  # before any loading
    assert "Traceback" not in capture
    model = (tmp_path / "model.log").read_text()  # every problem at once, the read-only --out among them
    assert f"--out {tmp_path / 'mnt' / 'model'}: Read-only file system" in model and "Traceback" not in model


def test_a_disk_that_fills_up_mid_run_loses_nothing_and_the_run_resumes(tmp_path: Path) -> None:
    """The disk is filled (a real ENOSPC) once two rows are on it: the run stops with exit 2 naming the file and
    the resume command; with room made, `--resume` ends with exactly the planned cells, each measured once, in
    turns with its baseline, and no half line in either table."""
    (tmp_path / "c.toml").write_text(CONFIG)
    script = f"""
mount -t tmpfs -o size=4m tmpfs $M || exit 99
{CLI} run $T/c.toml --out $M/out --no-progress --no-report > $T/run.log 2>&1 &
driver=$!
for i in $(seq 600); do
  rows=$(cat $M/out/*/results.csv 2>/dev/null | wc -l)
  [ "$rows" -ge 3 ] && break
  sleep 0.05
done
head -c 8m /dev/zero > $M/filler 2>/dev/null  # the disk full, mid-run
wait $driver; echo "run $?"
cp -r $M/out $T/full
rm $M/filler
{CLI} run --resume $M/out/* --no-progress > $T/resume.log 2>&1; echo "resume $?"
cp -r $M/out $T/resumed
"""
    shell = _in_namespace(script, tmp_path)
    assert shell.returncode != 99, shell.stderr
    codes = dict(line.split() for line in shell.stdout.splitlines())
    log = (tmp_path / "run.log").read_text()
    assert codes["run"] == "2", log
    assert "No space left on device" in log and "Traceback" not in log
    assert f"cannot read or write {tmp_path / 'mnt' / 'out'}/" in log  # the file, never a bare "cannot write"
    assert "continue with: attnbench run --resume" in log
    (stopped,) = (tmp_path / "full").iterdir()
    assert 1 <= len(read_results(stopped)) < 16  # stopped mid-run, rows of finished groups kept
    assert codes["resume"] == "0", (tmp_path / "resume.log").read_text()
    (run,) = (tmp_path / "resumed").iterdir()
    frame = read_results(run)
    assert frame.cell_key.is_unique and len(frame) == 16 and (frame.status == "ok").all()
    assert frame.speedup.notna().all()  # every cell measured in turns with its group's baseline
    samples = read_samples(run)
    assert all(len(samples[row.cell_key]) == row.time_repeats for row in frame.itertuples())
    for name in ("results.csv", "samples.csv"):
        with (run / name).open(newline="") as file:
            records = list(csv.reader(file))
        assert len({len(record) for record in records}) == 1, name  # no half line kept anywhere
    assert (run / "report.md").stat().st_size > 0 and not list(run.rglob("*.tmp"))


def test_a_disk_full_while_the_report_is_written_keeps_every_cell_and_report_writes_it_later(tmp_path: Path) -> None:
    """Room for the results but not for the plots: exit 2 naming the image and `attnbench report`; no half
    file or temporary file left; with room made, `attnbench report` writes summary, report and plots."""
    small = CONFIG.replace("[16, 32, 48, 64, 80, 96, 112, 128]", "[16, 32]").replace("0.2", "0.01")
    (tmp_path / "c.toml").write_text(small)  # its run folder ~20 KiB before the report, an image ~50 KiB
    script = f"""
mount -t tmpfs -o size=64k tmpfs $M || exit 99
{CLI} run $T/c.toml --out $M/out --no-progress > $T/run.log 2>&1; echo "run $?"
cp -r $M/out $T/full
umount $M && mount -t tmpfs -o size=8m tmpfs $M && cp -r $T/full $M/out || exit 99
{CLI} report $M/out/* > $T/report.log 2>&1; echo "report $?"
cp -r $M/out $T/written
"""
    shell = _in_namespace(script, tmp_path)
    assert shell.returncode != 99, shell.stderr
    codes = dict(line.split() for line in shell.stdout.splitlines())
    log = (tmp_path / "run.log").read_text()
    assert codes["run"] == "2" and "No space left on device" in log and "Traceback" not in log, log
    assert ".png: No space left on device" in log and "write the report with: attnbench report" in log
    (full,) = (tmp_path / "full").iterdir()
    assert len(read_results(full)) == 4 and not list(full.rglob("*.tmp"))
    assert all(p.stat().st_size > 0 for p in full.rglob("*.png"))  # an image is whole or absent
    assert codes["report"] == "0", (tmp_path / "report.log").read_text()
    (written,) = (tmp_path / "written").iterdir()
    assert (written / "summary.md").stat().st_size > 0 and (written / "report.md").stat().st_size > 0
    assert list((written / "plots").glob("*.png"))


@pytest.mark.parametrize("size, first_refused", [("4k", "meta.json"), ("8k", "config.toml")])
def test_a_disk_full_at_the_first_writes_names_the_file_and_a_follow_up_that_works(
    size: str, first_refused: str, tmp_path: Path
) -> None:
    """Review of issue 22: meta.json is the first file a run writes (the tables open at the first row); a disk that
    refuses it says nothing was recorded (no --resume to offer); one that refuses the next file offers the resume,
    which completes once there is room."""
    (tmp_path / "c.toml").write_text(CONFIG.replace("[16, 32, 48, 64, 80, 96, 112, 128]", "[16]"))
    script = f"""
mount -t tmpfs -o size={size} tmpfs $M || exit 99
{CLI} run $T/c.toml --out $M/out --no-progress --no-report > $T/run.log 2>&1; echo "run $?"
mount -o remount,size=4m $M || exit 99
{CLI} run --resume $M/out/* --no-progress --no-report > $T/resume.log 2>&1; echo "resume $?"
cp -r $M/out $T/after
"""
    shell = _in_namespace(script, tmp_path)
    assert shell.returncode != 99, shell.stderr
    codes = dict(line.split() for line in shell.stdout.splitlines())
    log = (tmp_path / "run.log").read_text()
    assert codes["run"] == "2" and f"/{first_refused}: No space left on device" in log, log
    (run,) = (tmp_path / "after").iterdir()
    if first_refused == "meta.json":
        assert "nothing was recorded in" in log and "then run again" in log
        assert codes["resume"] == "2"  # not a run folder: as the message said, run again instead
    else:
        assert "continue with: attnbench run --resume" in log
        assert codes["resume"] == "0", (tmp_path / "resume.log").read_text()
        assert len(read_results(run)) == 2 and (read_results(run).status == "ok").all()
