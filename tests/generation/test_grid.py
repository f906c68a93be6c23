"""A generation grid, checked whole before any work: its units, its methods at each share (each family's knob), the
exact model always present, and every problem named at once (a flag's by the flag)."""

from __future__ import annotations

import pytest
from attnbench.generation.budgets import at_share, knobs
from attnbench.generation.grid import grid_descriptions, parse_grid, read_grid, row_key
from attnbench.plan.config import ConfigError
from attnbench.registry import registry

BASE = {"name": "t", "tasks": ["passkey", "continuation"], "seq_lens": [1024, 2048], "samples": 7, "block": 3,
        "keep": [0.5, 0.125], "protocols": ["question-agnostic", "question-aware"],
        "methods": [{"name": "band", "sinks": 4}, "h2o", {"name": "topk", "score": "minmax", "block_size": 16,
                                                           "dense_layers": 2, "label": "quest"}, "deltanet"]}  # fmt: skip


def test_the_shipped_grid_reads() -> None:
    grid = read_grid("generation")
    assert grid.seq_lens == (2048,) and len(grid.keep) >= 4
    assert {"passkey", "niah_single", "niah_multikey", "continuation"} <= set(grid.tasks)
    assert {m.variant.name for m in grid.methods} == {"full", "band", "h2o", "snapkv", "topk"}  # no untrained RNN
    quest = next(m for m in grid.methods if m.label() == "quest")
    assert dict(quest.variant.params) | {"dense_layers": quest.dense_layers} == {  # Quest as published
        "keep_first_block": False, "select_per": "query-head", "score": "minmax", "block_size": 16, "dense_layers": 2}


@pytest.mark.parametrize("name", sorted(grid_descriptions()))
def test_every_shipped_grid_reads(name: str) -> None:
    """A key added to the grammar must not turn a shipped grid away (a press's `layers = "pyramid"` once did)."""
    grid = read_grid(name)
    assert grid.settings(max(grid.seq_lens))


def test_units_cover_every_sample_once() -> None:
    grid = parse_grid(dict(BASE))
    units = grid.units()
    # passkey: 2 protocols x 3 blocks; continuation: one protocol (no question) x 3 blocks; at each N
    assert len(units) == 2 * (2 * 3 + 3)
    for n in (1024, 2048):
        for task, protocols in (("passkey", 2), ("continuation", 1)):
            samples = [s for u in units if u.seq_len == n and u.task == task for s in u.samples]
            assert sorted(samples) == sorted(list(range(7)) * protocols)


def test_settings_sweep_the_knob_and_keep_the_exact_model_first() -> None:
    grid = parse_grid(dict(BASE))
    settings = grid.settings(2000)
    labels = [s.label() for s in settings]
    assert labels[0] == "full" and labels.count("deltanet") == 1
    assert "quest @ 0.125" in labels and "band(sinks=4) @ 0.5" in labels
    hp = {s.label(): dict(s.hparams) for s in settings}
    assert hp["band(sinks=4) @ 0.5"]["window"] == 1000 - 4 - 1  # sinks + window + the token itself = the share
    assert hp["h2o @ 0.125"]["budget"] == 250
    assert hp["quest @ 0.125"]["top_k"] == 250 // 16 - 2
    assert len({row_key(grid.units()[0], 0, s) for s in settings}) == len(settings)


@pytest.mark.parametrize("name", sorted(knobs()))
def test_every_knob_keeps_about_its_share(name: str) -> None:
    """Each knob at a share keeps that many positions per head after a prompt of n (the cache's own count)."""
    hparams = registry.create(name).hparams
    for share, n in ((0.5, 2048), (0.0625, 2048), (0.25, 1000)):
        variant = registry.create(name, **at_share(name, hparams, share, n))
        kept = {"band": lambda v: v.sinks + v.window + 1, "think": lambda v: v.key_channels * n,  # ThinK: its channels
                "topk": lambda v: (v.top_k + 2) * v.block_size,
                "duo-attention": lambda v: n - v.head_compression_ratio * (n - v.sinks - v.recent),  # a head's mean
                }.get(name, lambda v: v.budget)(variant)  # fmt: skip
        granularity = variant.block_size if name == "topk" else 1  # Quest keeps whole pages
        floor = variant.sinks + variant.recent if name == "duo-attention" else 0  # every head streaming: 384
        assert abs(kept - max(share * n, floor)) <= granularity


def test_a_set_knob_is_not_swept() -> None:
    grid = parse_grid({**BASE, "methods": [{"name": "h2o", "budget": 64}]})
    assert [s.label() for s in grid.settings(2048)] == ["full", "h2o(budget=64)"]


def test_every_problem_at_once_and_flags_by_name() -> None:
    raw = {**BASE, "tasks": ["paskey"], "seq_lens": [0], "keep": [1.5], "protocols": ["aware"], "colour": 1,
           "methods": [{"name": "h2o", "budget": 0}, {"name": "bigbird"}, {"name": "full-math", "prefill": "dense"},
                       {"name": "h2o", "prefill": "lazy", "dense_layers": -1}]}  # fmt: skip
    with pytest.raises(ConfigError) as error:
        parse_grid(raw, "my.toml", flags={"keep", "tasks"})
    text = str(error.value)
    for expected in ("paskey", "Did you mean: passkey", "seq_lens", "--keep", "aware", "colour: unknown key",
                     "budget", "bigbird", "cannot generate", "has no decode form", "prefill must be one of",
                     "dense_layers must be"):  # fmt: skip
        assert expected in text, expected


def test_a_decode_only_method_alone_runs_with_the_exact_model() -> None:
    grid = parse_grid({**BASE, "methods": ["snapkv"]})
    assert [m.variant.name for m in grid.methods] == ["full", "snapkv"]


def test_the_stop_rule_is_checked() -> None:
    assert parse_grid({**BASE, "stop": "end-of-text"}).stop == "end-of-text"
    assert parse_grid(BASE).stop == "newline"
    with pytest.raises(ConfigError, match="stop: 'newlines' is not one of newline, end-of-text"):
        parse_grid({**BASE, "stop": "newlines"})


def test_a_grid_file_s_model_path_is_its_folder_s(tmp_path, monkeypatch) -> None:
    """`model = "models/mine"` in a grid file names a folder beside the file, wherever the command runs from."""
    (tmp_path / "grids").mkdir()
    grid = tmp_path / "grids" / "g.toml"
    grid.write_text('model = "../models/mine"\ntasks = ["passkey"]\nseq_lens = [256]\nkeep = [0.5]\n'
                    '[[methods]]\nname = "h2o"\n')  # fmt: skip
    monkeypatch.chdir("/")
    assert read_grid(str(grid)).model == str(tmp_path / "models" / "mine")
