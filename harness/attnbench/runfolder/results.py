"""The results table: one tidy row per cell, appended to results.csv and flushed as each cell ends."""

from __future__ import annotations

import csv
import io
import os
from dataclasses import asdict, fields
from pathlib import Path

import pandas as pd

from attnbench.runfolder.rows import COLUMNS, STATUSES, Measured, Row


def drop_partial_last_line(path: Path) -> None:
    """A kill in the middle of a write can leave half a row; cut it so appending starts on a fresh line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        with path.open("r+b") as file:
            file.truncate(data.rfind(b"\n") + 1)


class RunFolderUnreadable(ValueError):
    """A file of a run folder that cannot be read as what it should be (a hand edit, a disk fault)."""


def not_csv(path: Path, error: Exception) -> str:
    """Why a run folder's table (results.csv, samples.csv) cannot be read: not text, or not CSV."""
    return f"{path} cannot be read as CSV text ({error}); restore it, or start a new run"


def results_table_problem(path: Path) -> str | None:
    """Why the CSV at `path` cannot be read as results or appended to (None when it can, or does not exist yet):
    no `cell_key` column, or a header narrower than its rows (values would land under the wrong columns)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        with path.open(newline="") as file:
            reader = csv.reader(file)
            header = next(reader, [])
            widest = max((len(record) for record in reader), default=0)
    except (UnicodeDecodeError, csv.Error) as error:
        return not_csv(path, error)
    if "cell_key" not in header:
        return f"{path} is not an attnbench results table (no cell_key column); not appending to it"
    if widest > len(header):
        return (
            f"{path}: its header names {len(header)} columns but a row has {widest} values (a damaged or hand-edited "
            "header); restore it, or start a new run"
        )
    return None


def _columns_of(path: Path) -> list[str]:
    """The columns rows appended to `path` must follow: today's, after rewriting a file an older version wrote.

    A run resumed after an upgrade must not append rows under a header with other columns: the file is
    rewritten once (atomically) with today's columns first, rows keeping their values, columns today's
    version lacks kept at the end, ones the old file lacked left empty.
    """
    if not path.exists() or path.stat().st_size == 0:
        return COLUMNS
    problem = results_table_problem(path)
    if problem:
        raise ValueError(problem)
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        old = list(reader.fieldnames or [])
        if old == COLUMNS:
            return COLUMNS
        rows = list(reader)
    columns = COLUMNS + [column for column in old if column not in COLUMNS]
    rewritten = path.with_name(path.name + ".upgrading")
    with rewritten.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
        file.flush()
        os.fsync(file.fileno())
    os.replace(rewritten, path)
    return columns


class ResultsWriter:
    """Appends rows to a CSV, flushing and syncing each so a crash loses at most the cell in flight."""

    def __init__(self, path: Path) -> None:
        self.path = path
        drop_partial_last_line(path)
        new = not path.exists() or path.stat().st_size == 0
        columns = _columns_of(path)
        self._file = path.open("a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=columns, restval="")
        if new:
            self._writer.writeheader()
            self._sync()

    def append(self, row: Row) -> None:
        self._writer.writerow(asdict(row))
        self._sync()

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_results(run_dir: Path) -> pd.DataFrame:
    """results.csv as a DataFrame (a trailing partial line from a killed run is dropped)."""
    text_columns = {f.name: str for f in fields(Measured) if f.type == "str"} | {"hparams": str, "label": str}
    problem = results_table_problem(run_dir / "results.csv")
    if problem:
        raise RunFolderUnreadable(problem)
    data = (run_dir / "results.csv").read_text()
    complete = data[: data.rfind("\n") + 1]  # a row cut short by a kill has no line end yet
    if not complete.strip():  # no header yet (a run stopped before its first row, a full disk)
        return pd.DataFrame(columns=COLUMNS)
    frame = pd.read_csv(io.StringIO(complete), on_bad_lines="skip", dtype=text_columns)
    frame = frame.reindex(columns=COLUMNS)  # a run written before a column existed reads it as missing
    frame = frame.fillna({column: "" for column in text_columns})
    numeric = [f.name for f in fields(Measured) if "float" in str(f.type) or "int" in str(f.type)]
    for column in numeric:  # a hand-edited value that is no number reads as missing, never as text
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    # a line that is not a cell's row (a hand edit, a disk fault): no known status, or no sequence length
    frame = frame[frame.status.isin(STATUSES) & pd.to_numeric(frame.seq_len, errors="coerce").notna()]
    frame = frame.astype({"seq_len": int})
    # a run written before the compile axis has no `compiled` column: its cells ran eager
    frame["compiled"] = frame.compiled.map(lambda v: str(v) == "True").astype(bool)
    # a run written before the column: every variant then approximated softmax (or was exact)
    frame["approximates_softmax"] = frame.approximates_softmax.map(lambda v: str(v) != "False").astype(bool)
    # a cell recorded twice (a folder written by two processes before the lock, or an old duplicate plan): the
    # later row stands, so report, resume and compare see one row per cell
    return frame.drop_duplicates("cell_key", keep="last").reset_index(drop=True)
