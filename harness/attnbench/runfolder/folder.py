"""The run folder and its one writer: results.csv, samples.csv and meta.json, under a lock.

results.csv gets one row per cell, samples.csv the raw timing samples (a tidy long table: cell_key,
round, seconds per call); both are appended and fsynced as each group ends, so a kill loses at most the
group in flight. meta.json is replaced atomically. A second writer on the same folder is refused: the
lock is an flock on `.lock`, which the kernel releases when its process dies (no stale lock to clean).
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from attnbench.atomic import naming, write_text_atomic
from attnbench.runfolder.meta import read_meta
from attnbench.runfolder.results import (
    ResultsWriter,
    RunFolderUnreadable,
    drop_partial_last_line,
    not_csv,
)

SAMPLE_COLUMNS = ("cell_key", "round", "seconds")


class RunFolderBusy(RuntimeError):
    """Another process writes this run folder."""


def new_run_dir(out_root: Path, name: str) -> Path:
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    candidate, suffix = out_root / stem, 1
    while candidate.exists():
        suffix += 1
        candidate = out_root / f"{stem}-{suffix}"
    candidate.mkdir(parents=True)
    return candidate


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=str))


def take_lock(path: Path) -> Any:
    """The folder's `.lock`, flocked and naming its holder (the open file: closing it releases the lock); RunFolderBusy
    when another process holds it. Every writer of a folder takes it first."""
    path.mkdir(parents=True, exist_ok=True)
    lock = (path / ".lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(lock)
        lock.close()
        raise RunFolderBusy(
            f"{path} is being written by {holder}; one writer per run folder (wait for it, or stop it first)"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"process {os.getpid()} on {os.uname().nodename}")
    lock.flush()
    return lock


class RunFolder:
    """The only writer of one run folder, while it holds the folder's lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = take_lock(path)
        self._results: ResultsWriter | None = None  # both tables opened at the first append: meta.json comes first
        self._samples_file: Any = None

    def _open_writers(self) -> None:
        """Both tables opened for appending, a line cut short by a kill or a full disk trimmed first."""
        if self._results is not None:
            return
        samples = self.path / "samples.csv"
        try:
            self._results = ResultsWriter(self.path / "results.csv")
        except OSError as error:
            raise naming(error, self.path / "results.csv") from None
        try:
            drop_partial_last_line(samples)
            new = not samples.exists() or samples.stat().st_size == 0
            self._samples_file = samples.open("a", newline="")
            self._samples = csv.writer(self._samples_file)
            if new:
                self._samples.writerow(SAMPLE_COLUMNS)
                self._samples_file.flush()
        except OSError as error:
            raise naming(error, samples) from None

    def _close_writers(self, quiet: bool = False) -> None:
        """Both tables closed; `quiet`: a failing flush (a full disk) does not replace the error being raised."""
        for file in (self._results, self._samples_file):
            try:
                if file is not None:
                    file.close()
            except OSError:
                if not quiet:
                    raise
        self._results, self._samples_file = None, None

    def forget(self, keys: set[str]) -> None:
        """Drop the rows and samples of `keys` from both tables (rewritten atomically): a group a kill cut short
        while its rows were being written is measured again whole, with its baseline, never half."""
        if not keys:
            return
        self._close_writers()
        for name in ("results.csv", "samples.csv"):
            path = self.path / name
            if not path.exists():
                continue
            with path.open(newline="") as file:
                records = list(csv.reader(file))
            if not records or "cell_key" not in records[0]:
                continue
            column, width = records[0].index("cell_key"), len(records[0])
            # a line of another width is half a line (a kill, a full disk): it goes with the forgotten cells
            kept = [records[0]] + [r for r in records[1:] if len(r) == width and r[column] not in keys]
            if len(kept) == len(records):
                continue
            buffer = io.StringIO()
            csv.writer(buffer).writerows(kept)
            write_text_atomic(path, buffer.getvalue())

    @property
    def meta_path(self) -> Path:
        return self.path / "meta.json"

    def read_meta(self) -> dict[str, Any]:
        return read_meta(self.path)

    def write_meta(self, meta: dict[str, Any]) -> None:
        write_json_atomic(self.meta_path, meta)

    def write_text(self, name: str, text: str) -> None:
        write_text_atomic(self.path / name, text)

    def append(self, rows: list[Any], samples: list[tuple[str, int, float]]) -> None:
        """One group's rows and samples, flushed to disk before returning (samples first: rows mark done)."""
        self._open_writers()
        try:
            self._samples.writerows(samples)
            self._samples_file.flush()
            os.fsync(self._samples_file.fileno())
        except OSError as error:  # a full disk: which file (a resume trims the half line it may leave)
            raise naming(error, self.path / "samples.csv") from None
        try:
            for row in rows:
                self._results.append(row)
        except OSError as error:
            raise naming(error, self.path / "results.csv") from None

    def close(self, quiet: bool = False) -> None:
        try:
            self._close_writers(quiet)
        finally:
            self._lock.close()  # releases the flock

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self.close(quiet=kind is not None)  # an error in flight (a full disk) stays the one reported


def being_written(run_dir: Path) -> str | None:
    """Who holds the run folder's lock ("process 12 on host"), or None when no process writes it now."""
    lock = run_dir / ".lock"
    if not lock.exists():
        return None
    with lock.open("r") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _lock_holder(file)
        fcntl.flock(file, fcntl.LOCK_UN)
    return None


def _lock_holder(lock: Any) -> str:
    """What the writer holding the lock wrote into it: "process 12 on host"."""
    lock.seek(0)
    return lock.read().strip() or "another process"


def read_samples(run_dir: Path) -> dict[str, list[float]]:
    """cell_key -> its timing samples in round order (a folder without samples.csv gives {})."""
    path = run_dir / "samples.csv"
    if not path.exists():
        return {}
    out: dict[str, dict[int, float]] = {}
    try:
        with path.open(newline="") as file:
            for record in csv.DictReader(file):
                try:  # a group measured again after a kill overwrites its earlier samples, round by round
                    seconds = float(record["seconds"])
                    if 0 < seconds < math.inf:  # a hand-edited 0, negative or NaN is no time
                        out.setdefault(record["cell_key"], {})[int(record["round"])] = seconds
                except (TypeError, ValueError, KeyError):  # a line cut short by a kill
                    continue
    except (UnicodeDecodeError, csv.Error) as error:
        raise RunFolderUnreadable(not_csv(path, error)) from None
    return {key: [rounds[r] for r in sorted(rounds)] for key, rounds in out.items()}
