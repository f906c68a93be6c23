"""The folder of an MQAR grid (`attnbench recall`) and its one writer: trainings.csv (one row per training, appended
and fsynced as each ends, so a kill loses only the trainings in flight), meta.json, under the run folder's lock.

A resumed grid reads trainings.csv and trains only what has no row yet (a failed training is tried again).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from attnbench.runfolder.keyed_rows import KeyedRowsFolder, read_keyed_rows

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


class TrainingsFolder(KeyedRowsFolder):
    """The only writer of one grid's folder, while it holds the folder's lock."""

    file_name, columns = TRAININGS, COLUMNS


def read_trainings(path: Path) -> pd.DataFrame:
    """trainings.csv as a DataFrame, the later row of a training standing (a resume tries a failed one again)."""
    what = f"{path} is not an MQAR grid folder (no {TRAININGS}); grids live in results/<id>/"
    return read_keyed_rows(path / TRAININGS, COLUMNS, ("key", "label", "variant", "hparams", "status", "reason", "host", "node"), what)


def trained_keys(path: Path) -> set[str]:
    """The keys of the trainings that ended ok in `path` (none when it has no trainings.csv yet): what a resume skips."""
    if not (path / TRAININGS).is_file():
        return set()
    return set(read_trainings(path).query("status == 'ok'").key)
