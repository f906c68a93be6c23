"""Every paper's name is a method name: listed by `attnbench list` with what it runs, offered by an unknown method's
error (did you mean), and taking its paper's own parameter names (Quest's page_size and token_budget, StreamingLLM's
start_size and recent_size) as well as its variant's, a wrong one answered in the alias's terms."""

from __future__ import annotations

import pytest
from attnbench.cli import main
from attnbench.generation.budgets import at_share
from attnbench.generation.grid import ALIASES, PAPER_PARAMETERS, parse_grid
from attnbench.plan.config import ConfigError

GRID = {"name": "g", "tasks": ["passkey"], "seq_lens": [1024], "samples": 1, "keep": [0.5]}


def methods(*items: object) -> dict[str, object]:
    """The grid's methods by label, full left out."""
    grid = parse_grid({**GRID, "methods": list(items)})
    return {m.label(): m for m in grid.methods if m.label() != "full"}


def problems(*items: object) -> str:
    with pytest.raises(ConfigError) as error:
        parse_grid({**GRID, "methods": list(items)})
    return str(error.value)


def test_an_unknown_method_suggests_and_lists_the_papers_names() -> None:
    said = problems("quets")
    assert "unknown method 'quets'. Did you mean: quest?" in said
    assert "Available: band, " in said and "topk" in said
    assert "quest (topk), quest-first-page (topk), streamingllm (band)" in said
    assert "streamingllm" in problems("streamingLLM").split("Did you mean:")[1]


def test_the_command_line_suggests_a_paper_s_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--methods", "quets", "--dry-run"]) == 2
    assert "--methods: unknown method 'quets'. Did you mean: quest?" in capsys.readouterr().err


def test_quest_takes_its_code_s_page_size_and_token_budget() -> None:
    """token_budget // page_size pages are read per query head, the current one among them (Quest's kernels' page
    budget): the share's own rule, so a budget of T tokens reads what the share T / N reads."""
    found = methods({"name": "quest", "page_size": 32, "token_budget": 128}, {"name": "quest", "token_budget": 128},
                    {"name": "quest-first-page", "token_budget": 128}, "quest")  # fmt: skip
    quest = found["quest(page_size=32, token_budget=128)"]
    params = dict(quest.variant.params)
    assert (params["block_size"], params["top_k"]) == (32, 128 // 32 - 1) and not quest.swept
    first_page = dict(found["quest-first-page(token_budget=128)"].variant.params)
    assert first_page["top_k"] == 128 // 16 - 2  # its forced first page among the budget's pages
    by_share = at_share("topk", dict(found["quest"].variant.params), 128 / 1024, 1024)["top_k"]
    assert dict(found["quest(token_budget=128)"].variant.params)["top_k"] == by_share == 128 // 16 - 1


def test_streamingllm_takes_start_size_and_recent_size() -> None:
    """StartRecentKVCache keeps start_size + recent_size positions a step attends to besides itself: band's sinks and
    window."""
    found = methods({"name": "streamingllm", "start_size": 2, "recent_size": 60},
                    {"name": "streamingllm", "start_size": 8})  # fmt: skip
    both = found["streamingllm(start_size=2, recent_size=60)"]
    assert (dict(both.variant.params)["sinks"], dict(both.variant.params)["window"]) == (2, 60) and not both.swept
    assert found["streamingllm(start_size=8)"].swept  # the window still follows the share


def test_the_variant_s_own_names_still_work_and_label_as_given() -> None:
    found = methods({"name": "quest", "block_size": 32, "top_k": 2}, {"name": "streamingllm", "sinks": 8})
    assert dict(found["quest(block_size=32, top_k=2)"].variant.params)["block_size"] == 32
    assert dict(found["streamingllm(sinks=8)"].variant.params)["sinks"] == 8


def test_a_wrong_parameter_is_answered_in_the_alias_s_terms() -> None:
    said = problems({"name": "quest", "page": 16})
    assert "quest(page=16): unknown parameter 'page'. Did you mean: page_size?" in said
    assert "quest takes its paper's page_size, token_budget; or topk's own block_size, top_k" in said
    assert "topk(" not in said and "unknown hyperparameter" not in said  # never in the variant's terms
    assert "recent_size" in problems({"name": "streamingllm", "recent": 3}).split("Did you mean:")[1]
    assert "quest(page_size=0): page_size: 0 is below the minimum 1" in problems({"name": "quest", "page_size": 0})
    assert "token_budget: expected int" in problems({"name": "quest", "token_budget": "512"})
    both = problems({"name": "quest", "page_size": 8, "block_size": 4})
    assert "page_size is block_size in topk's terms: give one of them" in both


def test_attnbench_list_shows_each_alias_and_its_paper_s_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out.split("papers' names")[1]
    for alias, setting in ALIASES.items():
        line = next(line for line in out.splitlines() if line.startswith(f"{alias} "))
        assert f"= {setting['name']}(" in line
        for key, parameter in PAPER_PARAMETERS.get(alias, {}).items():  # a wrapper's alias may take none
            assert f"{key} -> {parameter.sets}:" in out
    assert "[first 2 layers exact]" in out and "window set by --keep" in out


def test_run_names_a_papers_name_and_its_variant(capsys) -> None:
    """`attnbench run` takes variants, not the papers' names `generate` takes: it says which variant to give."""
    from attnbench.cli import main

    assert main(["run", "quick", "--variants", "quest,quets", "--dry-run"]) == 2
    said = capsys.readouterr().err
    assert "quest is a paper's name that `attnbench generate` takes; here give its variant: topk(score=minmax" in said
    assert "did you mean quest? It is a paper's name" in said


def test_a_press_that_needs_downloaded_weights_is_refused_by_name_with_why() -> None:
    """kvpress's QFilter, KVzap and FastKVzip rest on weights from the Hub: refused by name (as kvpress writes it too),
    saying where the weights would come from; a generation grid and a per-call run alike."""
    from attnbench.generation.grid import unknown_method
    from attnbench.plan.config import paper_name_hint

    for name in ("qfilter", "kvzap", "fastkvzip", "KVzapPress", "fast_kvzip"):
        said = unknown_method(name)
        assert said.startswith(f"{name}: kvpress's") and "never downloads weights" in said and "Hub" in said
        assert "never downloads weights" in paper_name_hint(name)
    assert "kvzip, which it approximates" in unknown_method("kvzap")
    assert "kvzip" not in unknown_method("qfilter").split("(")[-1]
