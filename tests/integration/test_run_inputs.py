"""`attnbench run --inputs`: the inputs typed are the inputs measured, recorded as typed in the run's config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attnbench.cli import main
from attnbench.exit_status import Exit
from attnbench.runfolder.results import read_results
from helpers import only_run, write_tiny


@pytest.mark.slow  # a whole run, ~10 s on 2 cores
def test_a_run_measures_the_inputs_typed_in_place_of_the_files(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "tiny.toml", '[[inputs]]\nname = "realistic"\n', error=False)
    out = tmp_path / "out"
    argv = ["run", str(path), "--inputs", "gaussian(scale=2.0),local(length=8)", "--out", str(out)]
    assert main([*argv, "--no-progress", "--no-report"]) == Exit.OK
    run = only_run(out)
    frame = read_results(run)
    assert sorted(set(frame.input)) == ["gaussian(scale=2.0)", "local(length=8)"]  # realistic, the file's, is gone
    assert (frame.status == "ok").all()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["overrides"]["inputs"] == ["gaussian(scale=2.0)", "local(length=8)"]
