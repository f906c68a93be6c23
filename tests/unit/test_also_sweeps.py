"""`[[also]]`: further sweeps in one config (attnbench.plan.also). quick times every CPU variant non-causal up to
N=4096 and also a few causal at N=8192; a flag changes every sweep; the run's stored config reads back the same."""

from __future__ import annotations

import tomllib

import pytest
from attnbench.plan.config import ConfigError, load_config, parse_config

CAUSAL_QUICK = {"full", "band(window=256)", "band(sinks=4, window=256)", "linear"}


def cells_by_causal(config) -> dict[bool, set[tuple[str, int]]]:
    out: dict[bool, set[tuple[str, int]]] = {False: set(), True: set()}
    for cell in config.plan().cells:
        out[cell.causal].add((cell.label(), cell.seq_len))
    return out


def test_quick_asks_the_causal_long_context_question_beside_the_non_causal_sweep() -> None:
    config = load_config("quick")
    cells = cells_by_causal(config)
    assert {n for _, n in cells[False]} == {256, 1024, 4096} and {n for _, n in cells[True]} == {8192}
    assert {label for label, _ in cells[True]} == CAUSAL_QUICK
    assert {label for label, _ in cells[False]} > CAUSAL_QUICK | {"topk", "bigbird", "nystromformer"}
    causal = [cell for cell in config.plan().cells if cell.causal]
    assert {cell.input.name for cell in causal} == {"needles"}  # real heads too, once `make model` captured them
    assert 8192 in config.seq_lens and True in config.axes["causal"]  # the run's values: every sweep's
    plan = config.plan()
    assert plan.duplicates == 0 and len(plan.cells) == len(set(plan.cells))


def test_a_flag_sets_its_key_in_every_sweep_and_variants_picks_among_each_sweeps_own() -> None:
    cells = cells_by_causal(load_config("quick", {"seq_lens": [64], "variants": "full,bigbird"}))
    assert cells[False] == {("full", 64), ("bigbird", 64)}
    assert cells[True] == {("full", 64)}  # bigbird is not in quick's causal sweep (nor can it run causal)
    assert {label for label, _ in cells_by_causal(load_config("quick", {"variants": "band"}))[True]} == {
        "band(window=256)", "band(sinks=4, window=256)"}  # fmt: skip (a plain name: the sweep's own settings)
    assert cells_by_causal(load_config("quick", {"variants": "topk"}))[True] == set()  # no causal sweep left
    assert cells_by_causal(load_config("quick", {"causal": [True]}))[False] == set()


def test_the_stored_config_reads_back_to_the_same_cells() -> None:
    config = load_config("quick")
    again = parse_config(config.to_dict())  # meta.json's config, what --resume and compare read
    assert again.plan().cells == config.plan().cells
    from_toml = parse_config(tomllib.loads(config.to_toml()))  # config.toml, beside it
    assert from_toml.plan().cells == config.plan().cells and from_toml.sweeps == config.sweeps


def test_every_problem_of_an_also_table_is_named_once() -> None:
    raw = {
        "variants": ["full"],
        "seq_lens": [64],
        "dtype": "float33",
        "also": [{"min_run_time": 1.0}, {"seq_len": [8]}, {"seq_lens": [-1]}, {}, {"causal": True}],
    }
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    problems = error.value.problems
    assert sum("float33" in p for p in problems) == 1  # the file's own problem, not again per sweep
    assert any(p.startswith("also[0]: 'min_run_time' is not a sweep axis") for p in problems)
    assert "also[1]: unknown sweep key 'seq_len'. Did you mean: seq_lens?" in problems
    assert "also[2]: seq_lens: -1 must be >= 1" in problems
    assert any(p.startswith("also[3]: an empty table") for p in problems)
    with pytest.raises(ConfigError) as error:
        parse_config({"variants": ["full"], "also": {"causal": True}})
    assert error.value.problems[0].startswith("also: expected [[also]] tables")
