"""The folder of an MQAR grid (`attnbench recall`) and its one writer: trainings.csv (one row per training, appended
and fsynced as each ends, so a kill loses only the trainings in flight), meta.json, under the run folder's lock.

A resumed grid reads trainings.csv and trains only what has no row yet (a failed training is tried again).
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.atomic import naming, write_text_atomic
from attnbench.runfolder.folder import take_lock, write_json_atomic
from attnbench.runfolder.meta import read_meta
from attnbench.runfolder.results import RunFolderUnreadable, drop_partial_last_line

TRAININGS = "trainings.csv"


@dataclass
class TrainingRow:
    """One training of the grid: its point, what it reached and what it cost."""

    key: str  # attnbench.recall.grid.training_key: resume matches trainings by it
    label: str  # the mixer as tables name it: `band(window=16)`, `blind`
    variant: str
    hparams: str  # JSON of the variant's hyperparameters
    seq_len: int
    pairs: int
    seed: int
    d_model: int
    vocab: int | None = None  # the task's vocabulary (keys from its lower half, values from its upper)
    chance: float | None = None  # what a blind mixer scores: a guess among the values + the keys the convolutions reach
    status: str = "ok"  # ok | error
    reason: str = ""
    accuracy: float | None = None  # share of the test queries whose value is the model's top prediction
    queries: int | None = None  # test queries scored
    train_accuracy: float | None = None  # the last training batches' recall
    train_seconds: float | None = None  # the training steps' wall time
    steps: int | None = None  # optimiser steps taken (early stop at the grid's stop_accuracy)
    final_loss: float | None = None
    parameters: int | None = None
    state_bytes: int | None = None  # what the mixers keep to decode a prompt of N (KV cache, window, RNN state)
    host: str = ""
    node: str = ""  # the Ray node that trained it ("" outside Ray)
    threads: int | None = None


COLUMNS = [f.name for f in fields(TrainingRow)]


class TrainingsFolder:
    """The only writer of one grid's folder, while it holds the folder's lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = take_lock(path)
        self._file: Any = None

    def write_meta(self, meta: dict[str, Any]) -> None:
        write_json_atomic(self.path / "meta.json", meta)

    def read_meta(self) -> dict[str, Any]:
        return read_meta(self.path)

    def write_text(self, name: str, text: str) -> None:
        write_text_atomic(self.path / name, text)

    def append(self, row: TrainingRow) -> None:
        """One training's row, on disk before returning."""
        path = self.path / TRAININGS
        try:
            if self._file is None:
                drop_partial_last_line(path)
                new = not path.exists() or path.stat().st_size == 0
                self._file = path.open("a", newline="")
                self._writer = csv.DictWriter(self._file, fieldnames=COLUMNS)
                if new:
                    self._writer.writeheader()
            self._writer.writerow(asdict(row))
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as error:
            raise naming(error, path) from None

    def close(self) -> None:
        try:
            if self._file is not None:
                self._file.close()
        finally:
            self._lock.close()

    def __enter__(self) -> "TrainingsFolder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_trainings(path: Path) -> pd.DataFrame:
    """trainings.csv as a DataFrame, the later row of a training standing (a resume tries a failed one again)."""
    file = path / TRAININGS
    if not file.is_file():
        raise RunFolderUnreadable(f"{path} is not an MQAR grid folder (no {TRAININGS}); grids live in results/<id>/")
    text = file.read_text()
    text = text[: text.rfind("\n") + 1]  # a row cut short by a kill has no line end yet
    if not text.strip():
        return pd.DataFrame(columns=COLUMNS)
    frame = pd.read_csv(io.StringIO(text), on_bad_lines="skip", dtype={name: str for name in ("key", "label", "variant", "hparams", "status", "reason", "host", "node")})
    frame = frame.reindex(columns=COLUMNS).fillna({"reason": "", "host": "", "node": ""})
    return frame.drop_duplicates("key", keep="last").reset_index(drop=True)


def trained_keys(path: Path) -> set[str]:
    """The keys of the trainings that ended ok in `path` (none when it has no trainings.csv yet): what a resume skips."""
    if not (path / TRAININGS).is_file():
        return set()
    return set(read_trainings(path).query("status == 'ok'").key)
