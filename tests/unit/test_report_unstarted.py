"""`attnbench report` on a run stopped before its first cell was recorded (meta.json written, no results.csv yet):
the run's own words and its resume command, with the exit status for "none finished", never "not a run folder"."""

from __future__ import annotations

import json
from pathlib import Path

from attnbench.cli import main
from attnbench.exit_status import Exit


def test_a_run_with_no_cell_yet_is_a_run_to_resume(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "20261128-000000-quick"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps({"interrupted": "2026-11-28T00:00:20+0000"}))
    assert main(["report", str(folder)]) == Exit.NOTHING_RAN
    said = capsys.readouterr().err
    assert "has no finished cell" in said and f"attnbench run --resume {folder}" in said
    assert "not a run folder" not in said
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert main(["report", str(empty)]) == Exit.USAGE  # no meta.json: not a run
    assert "not a run folder" in capsys.readouterr().err
