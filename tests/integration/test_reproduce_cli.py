"""`attnbench reproduce` end to end on its cheapest claim: a run folder per claim, reused when finished, resumed when
not; the table and reproduce.md; exit 0 / 1 / 2; a claim that cannot run here says so."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from attnbench.cli import main
from attnbench.reproduce import command
from attnbench.reproduce.claims import CLAIMS

SINKS = next(claim for claim in CLAIMS if claim.id == "streamingllm-sinks")


def test_list_names_every_claim(capsys) -> None:
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(claim.id in out for claim in CLAIMS) and "[runs here]" in out


def test_an_unknown_claim_is_a_usage_error_before_any_work(tmp_path: Path, capsys) -> None:
    assert main(["reproduce", "streamingllm-sink", "--out", str(tmp_path)]) == 2
    assert "Did you mean: streamingllm-sinks" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_claim_runs_is_checked_and_is_reused_or_resumed(tmp_path: Path, capsys) -> None:
    assert main(["reproduce", SINKS.id, "--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| claim | paper | published | ours | verdict |" in out and "**holds**" in out
    folder = tmp_path / f"{SINKS.id}-quick"
    report = (tmp_path / "reproduce-quick.md").read_text()
    assert report.startswith("# Published claims, checked here (--quick)") and str(folder) in report
    results = (folder / "results.csv").read_text()
    # finished: checked again without running
    assert main(["reproduce", SINKS.id, "--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    assert (folder / "results.csv").read_text() == results
    # not finished (killed before the end): resumed, nothing measured twice
    meta = json.loads((folder / "meta.json").read_text())
    del meta["finished"]
    (folder / "meta.json").write_text(json.dumps(meta))
    assert main(["reproduce", SINKS.id, "--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    assert (folder / "results.csv").read_text() == results
    assert "resumed" in json.loads((folder / "meta.json").read_text())


def test_a_claim_that_does_not_hold_exits_1_and_one_that_cannot_run_says_why(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    inverted = dataclasses.replace(
        SINKS, id="inverted", params={"window": SINKS.params["sinks"], "sinks": SINKS.params["window"]}
    )
    absent = dataclasses.replace(
        SINKS, id="absent", sweep={**SINKS.sweep, "variants": [{"name": "full"}, {"name": "no-such-variant"}]}
    )
    monkeypatch.setattr(command, "CLAIMS", [inverted, absent])
    assert main(["reproduce", "--quick", "--no-progress", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "does not hold here: inverted" in captured.err
    report = (tmp_path / "reproduce-quick.md").read_text()
    assert "**does not hold**" in report
    assert "cannot run here: needs variant(s) not installed here: no-such-variant" in report
    assert "0 of 1 claims that could run hold at least in trend; 1 could not run here." in report


def test_ctrl_c_keeps_the_folders_and_says_how_to_continue(tmp_path: Path, capsys, monkeypatch) -> None:
    import attnbench.run.sweep as sweep

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_plan", interrupted)
    assert main(["reproduce", SINKS.id, "--quick", "--no-progress", "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert f"interrupted during {SINKS.id}" in err and f"attnbench reproduce {SINKS.id} --quick --out {tmp_path}" in err


def test_list_takes_names_duplicates_count_once_and_a_stale_folder_is_said(tmp_path: Path, capsys) -> None:
    assert main(["reproduce", "--list", SINKS.id]) == 0
    out = capsys.readouterr().out
    assert SINKS.id in out and "linformer-table3" not in out
    assert main(["reproduce", "--list", "bogus"]) == 2
    capsys.readouterr()
    args = ["reproduce", SINKS.id, SINKS.id, "--quick", "--no-progress", "--out", str(tmp_path)]
    assert main(args) == 0
    assert capsys.readouterr().out.count(f"| `{SINKS.id}` |") == 1
    # the folder of another setting (here: the quick run copied where the full one goes) is not taken for it
    (tmp_path / f"{SINKS.id}-quick").rename(tmp_path / SINKS.id)
    assert main(["reproduce", SINKS.id, "--no-progress", "--out", str(tmp_path)]) == 0
    assert "holds a run of another setting of this claim" in (tmp_path / "reproduce.md").read_text()
    # a damaged meta.json: the folder's problem, exit 2, no traceback
    (tmp_path / SINKS.id / "meta.json").write_text('{"run_id": ')
    assert main(["reproduce", SINKS.id, "--no-progress", "--out", str(tmp_path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
