"""tuning.csv: what `--tune` probed (`attnbench.run.tune`), one row per knob value tried at each N, its picks timed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.atomic import write_text_atomic

TUNING = "tuning.csv"


def write_tuning(run_dir: Path, rows: list[dict[str, Any]]) -> Path:
    """The rows to run_dir/tuning.csv, whole or not at all."""
    path = run_dir / TUNING
    write_text_atomic(path, pd.DataFrame(rows).to_csv(index=False))
    return path


def read_tuning(run_dir: Path) -> pd.DataFrame:
    """The run's tuning rows (empty when it was not tuned)."""
    path = run_dir / TUNING
    return pd.read_csv(path) if path.is_file() and path.stat().st_size else pd.DataFrame()
