"""`attnbench generate`'s own checks that need no model: a resume keeps its grid, a report is not rewritten under a
writer, an unfinished grid says so, and a grid file's problems are named (the flag, the file, the table)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from attnbench.cli import main
from attnbench.generation.grid import parse_grid, read_grid
from attnbench.generation.run import GRID_FILE, grid_toml
from attnbench.plan.config import ConfigError
from attnbench.runfolder.folder import take_lock
from attnbench.runfolder.generations import COLUMNS, GENERATIONS

GRID = {"name": "g", "tasks": ["passkey"], "seq_lens": [256], "samples": 2, "block": 1, "keep": [0.5],
        "methods": ["h2o"]}  # fmt: skip


def folder_with_rows(tmp_path: Path, done: int) -> Path:
    """A grid folder whose first `done` units have their rows (ok), the rest none."""
    grid = parse_grid(dict(GRID))
    folder = tmp_path / "grid"
    folder.mkdir()
    (folder / GRID_FILE).write_text(grid_toml(grid))
    (folder / "meta.json").write_text(json.dumps({"command": ["attnbench", "generate"], "grid": "g"}))
    from attnbench.generation.run import unit_keys

    rows = [dict(key=key, task="passkey", seq_len=256, protocol="question-agnostic", sample=0, method="full",
                 variant="full", status="ok", score=1.0, cache_share=1.0, read_share=1.0)
            for unit in grid.units()[:done] for key in unit_keys(grid, unit)]  # fmt: skip
    pd.DataFrame(rows).reindex(columns=COLUMNS).to_csv(folder / GENERATIONS, index=False)
    return folder


def test_a_resume_refuses_flags_that_would_change_its_grid(tmp_path: Path, capsys) -> None:
    folder = folder_with_rows(tmp_path, 1)
    assert main(["generate", "--resume", str(folder), "--seq-lens", "1024", "--methods", "snapkv"]) == 2
    err = capsys.readouterr().err
    assert "--seq-lens, --methods would change it" in err


def test_an_unfinished_grid_says_so_and_a_busy_one_is_not_rewritten(tmp_path: Path, capsys) -> None:
    folder = folder_with_rows(tmp_path, 1)
    assert main(["generate", "--report", str(folder)]) == 0
    err = capsys.readouterr().err
    assert f"1 unit(s) of the grid have not run yet: attnbench generate --resume {folder}" in err
    assert "**Unfinished**: 1 unit(s)" in (folder / "report.md").read_text()
    lock = take_lock(folder)  # another process writing the grid
    try:
        (folder / "report.md").unlink()
        assert main(["generate", "--report", str(folder)]) == 2
        assert "is being written by" in capsys.readouterr().err and not (folder / "report.md").exists()
    finally:
        lock.close()


def test_a_finished_grid_says_nothing_is_missing(tmp_path: Path, capsys) -> None:
    folder = folder_with_rows(tmp_path, 2)
    assert main(["generate", "--report", str(folder)]) == 0
    assert "have not run yet" not in capsys.readouterr().err
    assert "Unfinished" not in (folder / "report.md").read_text()


@pytest.mark.parametrize("change, says", [
    ({"protocols": []}, "protocols: empty"),
    ({"methods": [{"name": "h2o", "label": "x"}, {"name": "snapkv", "label": "x"}]}, "two methods are labelled 'x'"),
    ({"methods": [{"name": "band", "label": "full"}]}, "two methods are labelled 'full'"),
    ({"methods": ["h2o", {"budget": 3}]}, "methods[1]: a [[methods]] table needs a `name`"),
    ({"samples": [2, 3]}, "samples: expected a whole number >= 1, got [2, 3]"),
    ({"tasks": ["jsonl:"]}, "jsonl: needs a path"),
])  # fmt: skip
def test_grid_problems_name_the_key_and_the_table(change: dict, says: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_grid({**GRID, **change})
    assert says in str(error.value)


def test_the_papers_names_are_methods() -> None:
    grid = parse_grid({**GRID, "methods": ["quest", {"name": "streamingllm", "sinks": 8}]})
    specs = {m.label(): m for m in grid.methods}
    assert specs["quest"].variant.name == "topk" and specs["quest"].dense_layers == 2
    assert dict(specs["streamingllm(sinks=8)"].variant.params)["sinks"] == 8


def test_a_grid_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    binary = tmp_path / "bad.toml"
    binary.write_bytes(b"\xff\xfe tasks")
    with pytest.raises(ConfigError, match="(?s)bad.toml.*cannot be read as UTF-8"):
        read_grid(str(binary))
    with pytest.raises(ConfigError, match="is a folder"):
        read_grid(str(tmp_path))


def test_overrides_rewrite_the_grid_s_description() -> None:
    grid = read_grid("generation", seq_lens=[512], methods=["h2o"])
    assert grid.raw["description"] == "generation with --seq-lens, --methods given on the command line"
    assert "measured_run_time" not in grid.raw


def test_a_paper_s_name_labels_only_the_paper_s_setting() -> None:
    """What a table changes of a paper's setting is in its label: `quest` alone is Quest as published."""
    grid = parse_grid({**GRID, "methods": [{"name": "quest", "prefill": "own", "decode": "exact"},
                                           {"name": "quest", "top_k": 3}, "quest-first-page"]})  # fmt: skip
    assert [m.label() for m in grid.methods] == ["full", "quest(prefill=own, decode=exact)", "quest(top_k=3)",
                                                  "quest-first-page"]  # fmt: skip
    assert grid.methods[1].decode == "exact" and dict(grid.methods[2].variant.params)["top_k"] == 3


def test_full_is_only_the_exact_model() -> None:
    with pytest.raises(ConfigError, match="full is the exact model"):
        parse_grid({**GRID, "methods": [{"name": "full", "prefill": "own", "decode": "exact"}]})


def test_a_report_refuses_flags_and_a_user_s_file_is_kept_by_its_absolute_path(tmp_path: Path, capsys,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    folder = folder_with_rows(tmp_path, 2)
    assert main(["generate", "--report", str(folder), "--seq-lens", "512"]) == 2
    assert "--seq-lens cannot change them" in capsys.readouterr().err
    assert main(["generate", "--report", str(folder), "--resume", str(folder)]) == 2  # never one of them silently
    assert "give one of them" in capsys.readouterr().err
    (tmp_path / "rows.jsonl").write_text('{"context": "a", "question": "b?", "answers": ["c"]}\n')
    monkeypatch.chdir(tmp_path)
    grid = parse_grid({**GRID, "tasks": ["jsonl:rows.jsonl"]})
    assert grid.tasks == (f"jsonl:{tmp_path / 'rows.jsonl'}",)


def test_one_task_under_two_names_is_refused() -> None:
    """niah_single is niah_single_1's earlier name: both would pool each sample twice."""
    with pytest.raises(ConfigError, match="niah_single and niah_single_1 are one task"):
        parse_grid({**GRID, "tasks": ["niah_single_1", "passkey", "niah_single"]})


def test_two_labels_of_one_setting_are_refused() -> None:
    """Their rows would share keys and the report keep one label (a review found `streamingllm` vanish)."""
    with pytest.raises(ConfigError) as error:
        parse_grid({**GRID, "methods": ["streamingllm", {"name": "band", "sinks": 4},
                                        {"name": "quest", "token_budget": 64}, {"name": "quest", "top_k": 3}]})  # fmt: skip
    said = str(error.value)
    assert "streamingllm and band(sinks=4) are one setting" in said
    assert "quest(token_budget=64) and quest(top_k=3) are one setting" in said


def test_a_knob_past_the_longest_context_and_a_budget_below_a_page_are_refused() -> None:
    """Buffers are sized by the knob: band(window=1000000) at N=512 ran a 24 GB machine out of memory."""
    with pytest.raises(ConfigError) as error:
        parse_grid({**GRID, "seq_lens": [512], "methods": [{"name": "streamingllm", "recent_size": 1000000},
                                                           {"name": "quest", "top_k": 40},
                                                           {"name": "quest", "token_budget": 8}]})  # fmt: skip
    said = str(error.value)
    assert "window=1000000 keeps more than the longest context (N=512)" in said and "give at most 512" in said
    assert "top_k=40 keeps more than the longest context (N=512)" in said and "give at most 32" in said
    assert "token_budget must be at least the page size (16" in said
