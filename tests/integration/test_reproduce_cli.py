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


QUEST_2K, QUEST_10K = (next(c for c in CLAIMS if c.id == name) for name in ("quest-passkey", "quest-passkey-10k"))


@pytest.fixture
def no_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache without any model: `make model`'s folders (SmolLM2's default, Gemma's by name) point into it."""
    import attnbench.generation.preflight

    cache = tmp_path / "cache"
    monkeypatch.setenv("ATTNBENCH_CACHE", str(cache))
    monkeypatch.setattr(attnbench.generation.preflight, "DEFAULT_MODEL", cache / "SmolLM2-135M")
    return cache


def test_list_says_a_generation_claim_cannot_run_without_its_own_model(no_models: Path, capsys) -> None:
    """--list checks each generation claim's model folder: Gemma's for the claim at 10K, SmolLM2's for the others;
    the two Quest claims are told apart by where they run."""
    assert main(["reproduce", "--list", "quest-passkey", "quest-passkey-10k", SINKS.id]) == 0
    lines = capsys.readouterr().out.splitlines()
    two_k, ten_k, sinks = (next(line for line in lines if line.startswith(f"{name} "))
                           for name in ("quest-passkey", "quest-passkey-10k", SINKS.id))  # fmt: skip
    assert "scaled to SmolLM2 at 2K" in two_k and f"{no_models}/SmolLM2-135M holds no model" in two_k
    assert "`make model` writes SmolLM2-135M there" in two_k and "--model" not in two_k
    assert "at 10K on Gemma-3-270M" in ten_k and f"{no_models}/Gemma-3-270M holds no model" in ten_k
    assert "`make model MODEL=gemma-3-270m` writes Gemma-3-270M there" in ten_k
    assert "--quick runs it only when named" in ten_k and "--quick" not in two_k
    assert sinks.endswith("[runs here]")
    for name in ("SmolLM2-135M", "Gemma-3-270M"):  # a model folder written: the claim runs here
        (no_models / name).mkdir(parents=True)
        (no_models / name / "config.json").write_text("{}")
    assert main(["reproduce", "--list", "quest-passkey", "quest-passkey-10k"]) == 0
    out = capsys.readouterr().out
    assert "scaled to SmolLM2 at 2K [runs here]" in out
    assert "at 10K on Gemma-3-270M [runs here; --quick runs it only when named]" in out


def test_a_generation_claim_without_its_model_names_the_make_command_not_generate_s_flags(
    no_models: Path, tmp_path: Path
) -> None:
    for claim, make in ((QUEST_2K, "`make model` writes SmolLM2-135M"),
                        (QUEST_10K, "`make model MODEL=gemma-3-270m` writes Gemma-3-270M")):  # fmt: skip
        checked = command.run_claim(claim, tmp_path / "out", quick=True, progress=False)
        assert checked.outcome.verdict == "cannot run here" and checked.folder is None
        assert make in checked.outcome.detail and "--model" not in checked.outcome.detail
    assert not (tmp_path / "out").exists()


def test_quick_leaves_a_long_claim_out_of_the_catalogue_but_runs_it_when_named(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = []

    def fake(claim, out, *, quick, progress):
        ran.append(claim.id)
        return command.Checked(claim, None, command.Outcome(command.CANNOT, "–", "not run in this test"))

    monkeypatch.setattr(command, "run_claim", fake)
    monkeypatch.setattr(command, "CLAIMS", [SINKS, QUEST_10K])
    assert main(["reproduce", "--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    assert ran == [SINKS.id]
    err = " ".join(capsys.readouterr().err.split())
    assert "--quick leaves out quest-passkey-10k: its --quick run saves nothing" in err
    assert main(["reproduce", QUEST_10K.id, "--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    assert main(["reproduce", "--no-progress", "--out", str(tmp_path)]) == 0  # the whole catalogue, not --quick
    assert ran == [SINKS.id, QUEST_10K.id, SINKS.id, QUEST_10K.id]
