"""The results table: one tidy row per cell, appended to results.csv and flushed as each cell ends."""

from __future__ import annotations

import csv
import io
import os
from dataclasses import asdict, dataclass, fields, make_dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from attnbench.plan import CELL_COLUMNS, Cell

STATUSES = ("ok", "oom", "error", "unsupported", "skipped", "crashed", "timeout")


@dataclass
class Measured:
    """What a cell's row says beyond the cell itself. None where the cell did not get that far."""

    status: str = "ok"
    reason: str = ""
    family: str = ""
    exact: bool = False
    host: str = ""  # where it ran: host name and device name
    device_name: str = ""
    node: str = ""  # the Ray node that measured it ("" outside Ray): two nodes on one host told apart
    reruns: str = ""  # why its group was measured again from the start (a Ray node lost mid-group), "" if not
    threads: int | None = None
    load_before: float | None = None  # 1-minute load average before and after the cell's group
    load_after: float | None = None
    cpu_mhz: float | None = None  # mean current CPU frequency during the group, where readable
    noisy: str = ""  # why the cell's timing is not to be trusted alone ("" when it is)
    timed: bool = True  # False: error only; time and memory were measured on the setting's first input
    time_median_s: float | None = None
    time_p10_s: float | None = None
    time_p25_s: float | None = None  # quartiles: the spread bands of the plots
    time_p75_s: float | None = None
    time_p90_s: float | None = None
    time_iqr_s: float | None = None
    time_repeats: int | None = None  # samples (one per round)
    compile_s: float | None = None  # first call minus a timed call: compilation, lazy set-up
    baseline: str = ""  # the group's baseline variant the speedup is measured against
    speedup: float | None = None  # median over rounds of baseline time / this time, same round (paired)
    speedup_low: float | None = None  # distribution-free interval of that median (order statistics of the rounds)
    speedup_high: float | None = None
    speedup_coverage: float | None = None  # the interval's coverage: >= 0.95 from 6 rounds, min–max below
    processes: int | None = None  # --processes k: the worker processes its timing came from (two-level interval)
    peak_mem_bytes: int | None = None  # per call, state kept between calls excluded (attnbench.memory)
    state_mem_bytes: int | None = None  # kept between calls: what a fresh instance's first call leaves behind
    mem_method: str = ""
    err_rel_fro: float | None = None
    err_max_abs: float | None = None
    err_row_cosine: float | None = None
    err_vs_uniform: float | None = None
    self_check: str = ""  # exact variants: "pass (max err ...)" against their own support_mask
    dropped_mass: float | None = None  # exact-pattern variants: exact attention mass outside their support
    input_entropy: float | None = None  # of exact attention on this cell's inputs: 1 uniform, 0 one-hot
    input_band_mass: float | None = None  # share of exact attention within |i - j| <= 64
    input_sink_mass: float | None = None  # share of exact attention on the first key
    input_head_spread: float | None = None  # std across heads of their mean entropy: how much heads differ
    flops: float | None = None
    bytes_moved: float | None = None


Row = make_dataclass(
    "Row",
    [("cell_key", str), ("group_key", str)]
    + [(column, Any, None) for column in CELL_COLUMNS]
    + [(f.name, f.type, f.default) for f in fields(Measured)],
    slots=True,  # a misspelt column raises instead of adding an attribute
    namespace={"__doc__": "The CSV schema: the cell's key and columns (from attnbench.plan), then `Measured`."},
)


def row_for(cell: Cell, **measured: Any) -> Any:
    """A row for `cell`; `measured` sets fields of `Measured` by name (an unknown name raises TypeError)."""
    return Row(cell_key=cell.key(), group_key=cell.group_key(), **cell.columns(), **measured)


COLUMNS = [f.name for f in fields(Row)]


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
    # a cell recorded twice (a folder written by two processes before the lock, or an old duplicate plan): the
    # later row stands, so report, resume and compare see one row per cell
    return frame.drop_duplicates("cell_key", keep="last").reset_index(drop=True)
