"""Two generation runs of two models side by side (`attnbench generate --report DIR --beside OTHER`): pairs of
settings ordered alike ("agrees"), opposite ways ("reversed") or in one model only, a task beyond one model left out
and said, the settings whose standing against their own exact model differs named, Spearman's ρ, a clear line where
nothing is in common, and the command's section and its refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from attnbench.cli import main
from attnbench.report.cross_model import Side, compare, distinct, spearman
from attnbench.report.cross_model_text import cross_model_blocks
from attnbench.report.document import render_markdown
from attnbench.runfolder.generations import COLUMNS, GENERATIONS

N = 4096
SAMPLES = 20  # 0/20 and 20/20 separate; 10/20 overlaps both 6/20 and 14/20


def run(cells: dict[tuple[str, str, float | None], float], samples: int = SAMPLES, n: int = N) -> pd.DataFrame:
    """generations.csv's rows: per (task, method, share) `samples` rows whose mean score is the given share (the first
    round(share × samples) answer, the rest do not)."""
    out = []
    for (task, method, share), accuracy in cells.items():
        hits = round(accuracy * samples)
        kept = 1.0 if share is None else share
        for sample in range(samples):
            out.append(dict(key=f"{task}|{method}|{share}|{sample}|{n}", task=task, seq_len=n,
                            protocol="question-agnostic", sample=sample, method=method, variant=method, hparams="{}",
                            prefill="dense", dense_layers=0, decode="own", share=share, status="ok",
                            score=float(sample < hits), cache_share=kept, read_share=kept))  # fmt: skip
    return pd.DataFrame(out).reindex(columns=COLUMNS)


def two(a: dict, b: dict) -> tuple[Side, Side]:
    return Side("SmolLM2-135M", run(a), "a"), Side("Gemma-3-270M", run(b), "b")


def text_of(a: Side, b: Side) -> str:
    return render_markdown(cross_model_blocks(a, b))


def base(**methods: float) -> dict:
    """passkey with the exact model at 100% and each method at 1/2 at its accuracy."""
    return {("passkey", "full", None): 1.0, **{("passkey", m, 0.5): acc for m, acc in methods.items()}}


@pytest.mark.parametrize("b, outcome", [
    (dict(snapkv=1.0, h2o=0.0), "agrees"),
    (dict(snapkv=0.0, h2o=1.0), "reversed"),
    (dict(snapkv=0.5, h2o=0.5), "SmolLM2-135M only"),
])  # fmt: skip
def test_a_pair_agrees_reverses_or_is_ordered_in_one_model_only(b: dict, outcome: str) -> None:
    a, b = two(base(snapkv=1.0, h2o=0.0), base(**b))
    [here] = compare(a, b)
    [pair] = here.pairs
    assert (pair.kind, pair.first, pair.second) == ("at 1/2", "snapkv at 1/2", "h2o at 1/2")  # higher in A first
    assert pair.outcome(a.name, b.name) == outcome
    text = text_of(a, b)
    assert f"| at 1/2 | snapkv at 1/2 | h2o at 1/2 | 100% [83–100] vs 0% [0–17] |" in text
    if outcome == "reversed":
        assert ("**Reversed** (at 1/2): snapkv at 1/2 lies clearly above h2o at 1/2 in SmolLM2-135M (100% [83–100] vs "
                "0% [0–17]) but clearly below it in Gemma-3-270M (0% [0–17] vs 100% [83–100]).") in text
        assert "Of the 1 pair both models order, 0 agree and 1 is reversed" in text
    if outcome == "agrees":
        assert "Of the 1 pair both models order, 1 agrees and 0 are reversed" in text
        assert "**Where they disagree**: nowhere both models can tell" in text


def test_a_setting_whose_standing_against_its_exact_model_differs_is_named() -> None:
    a, b = two(base(snapkv=1.0, h2o=0.0), base(snapkv=0.0, h2o=0.0))
    text = text_of(a, b)
    assert ("**Against its own exact model**, not clearly below it in SmolLM2-135M but clearly below it in "
            "Gemma-3-270M: snapkv at 1/2.") in text
    assert "h2o at 1/2" not in text.split("**Against its own exact model**")[1]  # clearly below in both: alike


def test_a_task_beyond_one_model_is_left_out_and_said() -> None:
    a_cells = {**base(snapkv=1.0, h2o=0.0), ("niah_single", "full", None): 1.0, ("niah_single", "snapkv", 0.5): 0.0,
               ("niah_single", "h2o", 0.5): 1.0, ("qa", "full", None): 1.0}  # fmt: skip
    b_cells = {**base(snapkv=1.0, h2o=0.0), ("niah_single", "full", None): 0.0, ("niah_single", "snapkv", 0.5): 0.0,
               ("niah_single", "h2o", 0.5): 1.0}  # Gemma's exact model fails niah_single: beyond it  # fmt: skip
    a, b = two(a_cells, b_cells)
    [here] = compare(a, b)
    assert here.tasks == ["passkey"]
    assert here.left_out == ["niah_single (beyond Gemma-3-270M)", "qa (run in SmolLM2-135M only)"]
    assert set(here.settings.samples_a) == {SAMPLES}  # niah_single's samples are not pooled in
    assert [p.outcome(a.name, b.name) for p in here.pairs] == ["agrees"]
    said = "pooled over passkey; left out: niah_single (beyond Gemma-3-270M); qa (run in SmolLM2-135M only)."
    assert said in text_of(a, b)


def test_a_setting_missing_a_kept_task_in_one_model_is_not_compared() -> None:
    cells = {**base(snapkv=1.0, h2o=0.0), ("niah_single", "full", None): 1.0, ("niah_single", "snapkv", 0.5): 1.0,
             ("niah_single", "h2o", 0.5): 0.0}  # fmt: skip
    partial = {key: value for key, value in cells.items() if key != ("niah_single", "h2o", 0.5)}  # a run still filling
    a, b = two(cells, partial)
    [here] = compare(a, b)
    assert here.untried == ["h2o at 1/2"] and list(here.settings.label) == ["full", "snapkv at 1/2"]
    assert "Not compared (run on only some of these tasks in one model): h2o at 1/2." in text_of(a, b)


@pytest.mark.parametrize("b, says", [
    ({("passkey", "full", None): 1.0, ("passkey", "quest", 0.5): 1.0},
     "No method setting besides the exact model is in both runs on every one of these tasks: nothing to compare."),
    ({("passkey", "full", None): 1.0},  # only the exact model: no share at all in one run
     "No method setting besides the exact model is in both runs on every one of these tasks: nothing to compare."),
    ({("passkey", "full", None): 0.0, ("passkey", "snapkv", 0.5): 0.0},
     "no task both ran is within both models; left out: passkey (beyond Gemma-3-270M): nothing to compare."),
])  # fmt: skip
def test_nothing_in_common_is_a_clear_line(b: dict, says: str) -> None:
    a, b = two(base(snapkv=1.0), b)
    text = text_of(a, b)
    assert says in text and "| setting |" not in text


def test_no_common_length_is_a_clear_line() -> None:
    a, b = Side("SmolLM2-135M", run(base(snapkv=1.0)), "a"), Side("Gemma-3-270M", run(base(snapkv=1.0), n=8192), "b")
    assert compare(a, b) == []
    assert ("No N and protocol at which both runs finished a needle task: nothing to compare (SmolLM2-135M: N = 4,096 "
            "(question-agnostic); Gemma-3-270M: N = 8,192 (question-agnostic)).") in text_of(a, b)


def test_one_method_at_two_shares_is_a_pair_and_ranks_and_rho_follow_the_accuracies() -> None:
    cells = {("passkey", "full", None): 1.0, ("passkey", "snapkv", 0.5): 1.0, ("passkey", "snapkv", 0.25): 0.0,
             ("passkey", "h2o", 0.5): 0.5, ("passkey", "h2o", 0.25): 0.0}  # fmt: skip
    a, b = two(cells, cells)
    [here] = compare(a, b)
    assert {(p.kind, p.first, p.second) for p in here.pairs} >= {("snapkv", "snapkv at 1/2", "snapkv at 1/4")}
    assert list(here.settings.rank_a) == [1, 3, 1, 4, 4]  # full, h2o 1/2, snapkv 1/2, h2o 1/4, snapkv 1/4
    assert "| full (exact) | 100% [83–100] | 100% [83–100] | 1= | 1= |" in text_of(a, b)
    assert "Spearman's ρ of the 5 settings' accuracies: +1.00" in text_of(a, b)


@pytest.mark.parametrize("x, y, rho", [
    ([0.1, 0.2, 0.3], [0.3, 0.2, 0.1], -1.0),
    ([0.1, 0.2, 0.3, 0.4], [0.1, 0.3, 0.2, 0.4], 0.8),
    ([0.1, 0.1, 0.3], [0.2, 0.2, 0.3], 1.0),  # ties at their mean rank
    ([0.1, 0.2], [0.1, 0.2], math.nan),  # fewer than three settings
    ([0.1, 0.2, 0.3], [0.5, 0.5, 0.5], math.nan),  # one accuracy for every setting
])  # fmt: skip
def test_spearman(x: list, y: list, rho: float) -> None:
    got = spearman(pd.Series(x), pd.Series(y))
    assert (math.isnan(got) and math.isnan(rho)) or math.isclose(got, rho)


def test_two_runs_of_one_model_are_named_by_their_folders() -> None:
    a, b = distinct(Side("SmolLM2-135M", run(base()), "r1"), Side("SmolLM2-135M", run(base()), "r2"))
    assert (a.name, b.name) == ("SmolLM2-135M (r1)", "SmolLM2-135M (r2)")


def run_folder(path: Path, model: str, cells: dict) -> Path:
    """A generation run folder as `attnbench generate` leaves it (meta.json naming its model, generations.csv)."""
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"command": ["attnbench", "generate"], "grid": "g",
                                                "model_dir": f"/models/{model}"}))  # fmt: skip
    run(cells).to_csv(path / GENERATIONS, index=False)
    return path


def test_the_command_writes_the_section_and_refuses_what_is_not_a_run(tmp_path: Path, capsys) -> None:
    ours = run_folder(tmp_path / "smol", "SmolLM2-135M", base(snapkv=1.0, h2o=0.0))
    other = run_folder(tmp_path / "gemma", "Gemma-3-270M", base(snapkv=0.0, h2o=1.0))
    assert main(["generate", "--report", str(ours), "--beside", str(other)]) == 0
    report = (ours / "report.md").read_text()
    assert "## Beside Gemma-3-270M" in report and "This run (SmolLM2-135M) beside Gemma-3-270M (`gemma`)" in report
    assert "**Reversed** (at 1/2)" in report
    assert not (other / "report.md").exists()  # the other run is only read
    (ours / "report.md").unlink()
    for bad in (tmp_path / "nowhere", tmp_path):  # no folder; a folder without generations.csv
        assert main(["generate", "--report", str(ours), "--beside", str(other), "--beside", str(bad)]) == 2
        assert f"--beside {bad}:" in capsys.readouterr().err and not (ours / "report.md").exists()
    assert main(["generate", "--beside", str(other)]) == 2
    assert "give it with --report DIR" in capsys.readouterr().err
