"""A folder whose one CSV file gets a row per finished unit of work, each with a stable `key` (an MQAR grid's
trainings.csv, a generation grid's generations.csv): appended and fsynced as each ends, so a kill loses only the work
in flight; meta.json beside it; under the run folder's lock, one writer. A resume reads the file and runs only what
has no ok row (a later row of a key stands over an earlier one)."""

from __future__ import annotations

import csv
import io
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from attnbench.atomic import naming, write_text_atomic
from attnbench.runfolder.folder import take_lock, write_json_atomic
from attnbench.runfolder.meta import read_meta
from attnbench.runfolder.results import RunFolderUnreadable, drop_partial_last_line


class KeyedRowsFolder:
    """The only writer of one folder's rows file (`file_name`, `columns`: a subclass says), while it holds the lock."""

    file_name: ClassVar[str]
    columns: ClassVar[list[str]]

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = take_lock(path)
        self._file: Any = None

    def write_meta(self, meta: dict[str, Any]) -> None:
        write_json_atomic(self.path / "meta.json", meta)

    def read_meta(self) -> dict[str, Any]:
        return read_meta(self.path)

    def started_meta(self, command: list[str], **fields: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the meta.json a resumed folder had ({} for a new one), the meta of this start): the first command kept,
        this one added to `resumed`, the machine and versions, `fields`, and the first start's time."""
        import platform
        import socket
        import time

        import torch

        from attnbench import __version__

        before = self.read_meta() if (self.path / "meta.json").is_file() else {}
        meta = {
            "command": before.get("command") or command, "resumed": before.get("resumed", []) + ([command] if before else []),
            **fields,
            "host": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
            "attnbench": __version__, "started": before.get("started") or time.strftime("%Y-%m-%dT%H:%M:%S"),
        }  # fmt: skip
        return before, meta

    def write_text(self, name: str, text: str) -> None:
        write_text_atomic(self.path / name, text)

    def append(self, row: Any) -> None:
        """One row (a dataclass with the file's columns), on disk before returning."""
        path = self.path / self.file_name
        try:
            if self._file is None:
                drop_partial_last_line(path)
                new = not path.exists() or path.stat().st_size == 0
                self._file = path.open("a", newline="")
                self._writer = csv.DictWriter(self._file, fieldnames=self.columns)
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

    def __enter__(self) -> "KeyedRowsFolder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_keyed_rows(file: Path, columns: list[str], text_columns: tuple[str, ...], missing: str) -> pd.DataFrame:
    """The rows file as a DataFrame, the later row of a key standing; `text_columns` read as text (empty: "");
    RunFolderUnreadable with `missing` when there is no such file."""
    if not file.is_file():
        raise RunFolderUnreadable(missing)
    text = file.read_text()
    text = text[: text.rfind("\n") + 1]  # a row cut short by a kill has no line end yet
    if not text.strip():
        return pd.DataFrame(columns=columns)
    frame = pd.read_csv(io.StringIO(text), on_bad_lines="skip", dtype={name: str for name in text_columns})
    frame = frame.reindex(columns=columns).fillna({name: "" for name in text_columns})
    return frame.drop_duplicates("key", keep="last").reset_index(drop=True)
