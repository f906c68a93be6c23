"""Configs are validated whole before any work; every problem is listed with where it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from attnbench.plan.config import ConfigError, load_config, parse_config, read_config_text


def test_presets_load_and_cover_every_builtin() -> None:
    """default measures every built-in variant with a full-sequence call; quick every one but full-math (full's math
    backend, half the quick run's time at N=4096, is left to default); decode every one with a decode form (the
    KV-cache methods, decode only, among them)."""
    from attnbench.registry import registry

    built_in = {name for name in registry.names() if registry.load(name).__module__.startswith("attnbench.")}
    assert {"full", "band", "topk", "bigbird", "nystromformer"} <= built_in
    options = dict(device="cpu", dtype="float32", padded=False, n_q=8, n_k=8)

    def decode_only(name: str) -> bool:
        variant = registry.create(name)
        refused = all(variant.unsupported_reason(**options, causal=causal) is not None for causal in (False, True))
        in_model = variant.unsupported_reason(**options, causal=True, decode=True, in_model=True) is None
        return refused and in_model  # (a press that needs the model decodes inside it alone: KVzip)

    def causal_only(name: str) -> bool:
        variant = registry.create(name)
        # (a variant this machine cannot run at all, e.g. xformers, accepts neither)
        return variant.causal_options(device="cpu", dtype="float32") == [True]

    forward = {name for name in built_in if not decode_only(name) and not causal_only(name)}
    assert {"h2o", "snapkv"} <= built_in - forward
    # a CPU run leaves out a variant that runs on CUDA alone, full-xformers (attnbench.plan.devices); a GPU run keeps it
    forward = {name for name in forward if "cpu" in registry.load(name).supports.devices}
    assert "full-xformers" not in forward
    assert {spec.name for spec in load_config("default").variants} >= forward  # non-causal presets
    assert {spec.name for spec in load_config("quick").variants} == forward - {"full-math"}
    recurrences = {name for name in built_in if causal_only(name)}  # the gated linear attentions: causal only
    assert {"retnet", "gla", "deltanet", "gated-deltanet"} <= recurrences
    assert {spec.name for spec in load_config("recurrent").variants} >= recurrences
    decoding = {name for name in built_in if registry.load(name).decodes() and not registry.load(name).needs_model}
    per_call = {spec.name for preset in ("decode", "presses") for spec in load_config(preset).variants}
    assert per_call >= decoding  # kvpress's presses have their own preset; a press needing the model is generate's


def test_every_problem_is_listed_at_once() -> None:
    raw = {
        "seq_lens": [256, -4],
        "dtype": "float33",
        "device": "tpu",
        "mode": ["fwd", "backward"],
        "padding": 1.5,
        "time_budget": 3,
        "inputs": [{"name": "gausian"}],
        "variants": {"fulll": {}, "full": {"window": 3}},
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, source="bad.toml")
    text = str(caught.value)
    for expected in [
        "seq_lens: -4",
        "float33",
        "'tpu'",
        "'backward'",
        "padding: 1.5",
        "unknown key 'time_budget'. Did you mean: time_budget_s?",
        "unknown input distribution 'gausian'",
        "Unknown variant 'fulll'. Did you mean: full",
        "unknown hyperparameter 'window'",
    ]:
        assert expected in text, expected
    assert len(caught.value.problems) == 9


def test_wrong_types_are_named() -> None:
    with pytest.raises(ConfigError, match=r"heads: expected int .* got '8'"):
        parse_config({"heads": "8", "variants": ["full"]})
    with pytest.raises(ConfigError, match="variants: missing"):
        parse_config({})


def test_lists_expand_to_cells_ordered_by_n() -> None:
    config = parse_config(
        {"variants": ["full", "full-math"], "seq_lens": [512, 128], "causal": [False, True], "mode": ["fwd", "fwd+bwd"]}
    )
    cells = config.plan().cells
    assert len(cells) == 2 * 2 * 2 * 2
    series = [c for c in cells if not c.causal and c.mode == "fwd"]  # one setting: N grows, variants inside
    assert [c.seq_len for c in series] == [128] * 2 + [512] * 2
    assert len({c.key() for c in cells}) == len(cells)


def test_cli_overrides_keep_the_file_grid(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text("seq_lens = [64]\n[variants.full]\n[variants.full-math]\n")
    config = load_config(str(path), {"variants": ["full-math"], "seq_lens": [32, 48]})
    assert [spec.name for spec in config.variants] == ["full-math"]
    assert config.seq_lens == [32, 48] and config.name == "mine"


def test_malformed_toml_and_missing_files_say_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("seq_lens = [64,\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(str(path))
    with pytest.raises(ConfigError, match="Did you mean: quick"):
        read_config_text("quik")


def test_a_run_without_its_baseline_or_with_an_inexact_one_is_warned_before_any_work() -> None:
    """Issue 39, item 4: `--variants band,topk` ran and showed an empty speedup table; it now says why up front."""
    from attnbench.commands.run import baseline_warning
    from attnbench.plan.config import load_config

    without = load_config("quick", {"variants": "band,topk", "seq_lens": [256]})
    assert "the baseline `full` is not among this run's variant settings (band(sinks=4, window=256), band(window=256), topk)" in baseline_warning(without)
    assert baseline_warning(load_config("quick", {"variants": "full,band", "seq_lens": [256]})) is None
    compiled = load_config("quick", {"variants": "full", "seq_lens": [256], "compile": True})
    assert baseline_warning(compiled) is None  # compiled alone: the baseline is `full compiled`
    other = load_config("quick", {"variants": "full,retnet", "seq_lens": [256], "causal": True, "baseline": "retnet"})
    assert "the baseline `retnet` is not softmax attention: every speedup is against it" in baseline_warning(other)
    sparse = load_config("quick", {"variants": "full,bigbird", "seq_lens": [256], "causal": False, "baseline": "bigbird"})
    assert "the baseline `bigbird` is a sparse pattern of softmax attention" in baseline_warning(sparse)
    noncausal = load_config("quick", {"variants": "full,retnet", "seq_lens": [256], "causal": False, "baseline": "retnet"})
    assert "cannot run this run's causal=False cells" in baseline_warning(noncausal)


def test_a_cell_too_big_only_for_the_reference_names_it_and_the_flag_that_drops_it() -> None:
    """Issue 39, item 4: the huge-N skip named only the memory limit though the float64 reference took most of it;
    it names the reference and `--no-error`, and with it (error = false) the cell is admitted."""
    from attnbench.measure.group import admit
    from attnbench.plan.config import load_config
    from attnbench.registry import registry

    overrides = {"variants": "band", "seq_lens": [524288], "memory_limit_gb": 12, "time_budget_s": 1e6}
    with_error = load_config("quick", overrides)
    reason = admit(with_error.plan().cells[0], with_error.settings, registry).fields["reason"]
    assert "float64 reference" in reason and "--no-error" in reason
    without = load_config("quick", {**overrides, "error": False})
    assert admit(without.plan().cells[0], without.settings, registry).runs
