"""`attnbench run`'s flags as a new user meets them: `--inputs` in the syntax of `--variants` (one parser), every
problem a flag causes naming that flag as typed, and a decode-only variant refused in a full-sequence run before any
run folder exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attnbench.cli import main
from attnbench.exit_status import Exit
from attnbench.inputs.catalogue import DISTRIBUTIONS
from attnbench.plan.cells import InputSpec, Spec
from attnbench.plan.config import ConfigError, decode_only, flag_text, load_config, parse_config
from attnbench.registry import registry
from helpers import tiny, write_tiny


def problems_of(name: str, overrides: dict) -> tuple[str, list[str]]:
    """The ConfigError's message and problems of loading `name` with `overrides` (it must be refused)."""
    with pytest.raises(ConfigError) as raised:
        load_config(name, overrides)
    return str(raised.value), raised.value.problems


# ---- --inputs: the syntax of --variants, replacing the config's [[inputs]] ----------------------------------------


def test_inputs_flag_replaces_the_configs_inputs_with_the_settings_typed() -> None:
    config = load_config("quick", {"inputs": "gaussian(scale=2.0, temperature=0.5),local(length=8),realistic"})
    assert config.axes["input"] == [
        InputSpec("gaussian", (("scale", 2.0), ("temperature", 0.5))),
        InputSpec("local", (("length", 8),)),
        InputSpec("realistic"),
    ]  # the preset's realistic, gaussian and needles are gone
    assert config.overrides["inputs"] == ["gaussian(scale=2.0, temperature=0.5)", "local(length=8)", "realistic"]
    assert {cell.input.name for cell in config.plan().cells} == {"gaussian", "local", "realistic"}


def test_inputs_and_variants_are_read_by_one_parser_and_a_list_is_one_inputs_value() -> None:
    """`layer=[4,16]` is one value of an input (its heads from two layers), while --variants, whose list would be
    several settings, still refuses it."""
    [spec] = Spec.parse("captured(path=real.pt, layer=[4,16], beyond=tile)", lists=True)
    assert spec == InputSpec("captured", (("beyond", "tile"), ("layer", (4, 16)), ("path", "real.pt")))
    with pytest.raises(ValueError, match="layer takes one value here"):
        Spec.parse("captured(layer=[4,16])")


@pytest.mark.filterwarnings("ignore::attnbench.inputs.captured.CapturedFileWarning")
def test_a_captured_file_named_by_inputs_is_read_from_where_the_command_runs(tmp_path: Path, monkeypatch) -> None:
    """The path is made absolute: the stored config reads the same file when resumed or compared elsewhere."""
    (tmp_path / "data").mkdir()
    torch.save({name: torch.randn(2, 1, 2, 32, 16) for name in "qkv"}, tmp_path / "data" / "real.pt")  # 2 layers
    path = write_tiny(tmp_path / "mine.toml", seq_lens=[32], heads=4, head_dim=16)  # 2 heads of each layer
    monkeypatch.chdir(tmp_path / "data")
    config = load_config(str(path), {"inputs": "captured(path=real.pt, layer=[0,1]),needles(pairs=4)"})
    captured = dict(config.axes["input"][0].params)
    assert captured == {"path": str(tmp_path / "data" / "real.pt"), "layer": (0, 1)}
    reread = parse_config(config.to_dict())  # as meta.json stores it
    assert reread.axes["input"] == config.axes["input"]


@pytest.mark.parametrize(
    "typed, said",
    [
        ("gausian", "--inputs: gausian: unknown input distribution 'gausian' (known: " + ", ".join(DISTRIBUTIONS)),
        ("local(lenght=8)", "--inputs: local(lenght=8): input 'local': unknown parameter 'lenght'"),
        ("needles(pairs=0)", "--inputs: needles(pairs=0): input 'needles': pairs must be a finite positive number"),
        ("gaussian(scale=true)", "--inputs: gaussian(scale=True): input 'gaussian': scale must be a finite positive"),
        ("realistic(", "--inputs: unbalanced parentheses"),
        ("", "--inputs: empty; give at least one input"),
    ],
)
def test_a_bad_input_is_refused_naming_the_flag(typed: str, said: str) -> None:
    message, problems = problems_of("quick", {"inputs": typed})
    assert any(p.startswith(said) for p in problems), problems
    assert "the command line has 1 problem(s)" in message and "preset 'quick'" not in message
    if typed in ("realistic(", ""):  # unreadable text: the known inputs are listed with the syntax
        assert "realistic,needles(pairs=16)" in message and ", ".join(DISTRIBUTIONS) in message


def test_run_help_says_inputs_replace_the_configs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--inputs INPUTS" in help_text and "they replace the config's [[inputs]] list" in help_text


# ---- every problem a flag causes names the flag -------------------------------------------------------------------


def test_a_flag_conflicting_with_the_preset_is_named_as_typed() -> None:
    message, problems = problems_of("decode", {"causal": [False]})
    assert problems == [
        "--causal false: decode is generation, causal only: use --causal true (a sweep with non-causal cells too "
        "runs decode in a run of its own)"
    ]
    assert message.startswith("the command line has 1 problem(s)") and "preset 'decode'" not in message


def test_a_flag_conflicting_with_the_file_is_named_and_the_advice_is_a_flag(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "mine.toml", causal=False)
    _, problems = problems_of(str(path), {"mode": ["decode"]})  # the file's causal = false, the flag's mode
    assert problems == [
        "--mode decode: decode is generation, causal only: use --causal true (a sweep with non-causal cells too runs "
        "decode in a run of its own)"
    ]


def test_a_conflict_within_the_file_names_the_file_and_its_keys(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "mine.toml", mode="decode", causal=False, kv_lens=[8])
    message, problems = problems_of(str(path), {"seeds": [1]})
    assert message.startswith(f"{path} has 2 problem(s)") and "the command line" not in message
    assert problems[0].startswith("mode: decode is generation") and "set causal = true" in problems[0]
    assert problems[1].startswith("mode: decode attends over the context itself")


@pytest.mark.filterwarnings("ignore::attnbench.inputs.captured.CapturedFileWarning")
def test_seq_lens_beyond_a_captured_file_name_the_flag_and_the_files_own_misfit_the_file(tmp_path: Path) -> None:
    torch.save({name: torch.randn(1, 2, 32, 16) for name in "qkv"}, tmp_path / "short.pt")
    path = write_tiny(tmp_path / "mine.toml", '[[inputs]]\nname = "captured"\npath = "short.pt"\n', seq_lens=[32],
                      heads=4, head_dim=16)  # fmt: skip
    message, problems = problems_of(str(path), {"seq_lens": [64]})
    flagged, own = message.split(f"{path} has")
    assert "the command line has 1 problem(s)" in flagged and "--seq-lens 64: captured" in flagged
    assert "has 32 positions and N=64 is asked" in flagged
    assert "holds batch 1 and 2 heads; the config asks batch 1, heads 4" in own  # the file's heads, not the flag's


@pytest.mark.parametrize(
    "key, value, typed",
    [
        ("seq_lens", [512, 4096], "--seq-lens 512,4096"),
        ("causal", [False, True], "--causal both"),
        ("causal", [True], "--causal true"),
        ("max_error", 0.3, "--max-error 0.3"),
        ("variants", "band,full", "--variants"),  # each problem of theirs names its setting
    ],
)
def test_flags_are_written_back_as_typed(key: str, value: object, typed: str) -> None:
    assert flag_text(key, value) == typed


def test_a_switch_is_named_as_typed_not_as_its_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--compile-only sets `compile`: the baseline it leaves out is blamed on --compile-only, not on the file."""
    path = write_tiny(tmp_path / "mine.toml", variants=["full", "band"], baseline="band")
    assert main(["run", str(path), "--compile-only", "--out", str(tmp_path / "out")]) == Exit.USAGE
    err = capsys.readouterr().err
    assert "the command line has 1 problem(s)" in err and "--compile-only: 'band' is not one of this run's" in err
    assert not (tmp_path / "out").exists()


def test_min_recall_without_needles_in_inputs_names_both_flags() -> None:
    _, problems = problems_of("quick", {"inputs": "realistic", "min_recall": 0.9})
    assert problems == [
        "--min-recall 0.9, --inputs: recall is measured on the input `needles`: name needles in --inputs (e.g. "
        "--inputs 'realistic,needles(pairs=16)')"
    ]


def test_the_cli_names_the_flag_and_exits_with_the_usage_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "decode", "--causal", "false", "--dry-run"]) == Exit.USAGE
    err = capsys.readouterr().err
    assert "--causal false: decode is generation" in err and "preset 'decode' has" not in err


def test_resume_refuses_a_flag_by_its_name_as_typed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--resume", str(tmp_path), "--seq-lens", "64", "--no-error"]) == Exit.USAGE
    assert "--resume runs the stored config; drop --seq-lens 64, --no-error" in capsys.readouterr().err


# ---- a decode-only variant in a full-sequence run -----------------------------------------------------------------


@pytest.mark.parametrize("name", registry.names())
def test_every_kv_cache_method_and_no_other_variant_is_refused_in_a_full_sequence_run(name: str) -> None:
    variant_class = registry.load(name)
    if variant_class.needs_model:  # a press that needs a pass of the model (KVzip): refused per call, said where it runs
        why = registry.create(name).unsupported_reason(device="cpu", dtype="float32", causal=True, padded=False,
                                                       n_q=8, n_k=8, decode=True)  # fmt: skip
        assert why is not None and "attnbench generate" in why
        return
    try:
        parse_config(tiny(variants=[name], causal=[False, True]))
        refused = []
    except ConfigError as error:
        refused = [p for p in error.problems if "runs only in decode" in p]
    assert bool(refused) == (variant_class.family == "kv-cache"), refused
    if refused:
        assert refused[0].startswith(f"variants: {name} runs only in decode")
        assert "run it with --mode decode --causal true" in refused[0]  # the run has non-causal cells: the advice runs
        parse_config(tiny(variants=[name], causal=[True], mode="decode"))  # where it belongs, it is planned


def test_full_without_a_kv_cache_is_decode_only_and_full_is_not() -> None:
    assert decode_only(registry.create("full", kv_cache=False), ["cpu"], ["float32"]) is not None
    assert decode_only(registry.create("full"), ["cpu"], ["float32"]) is None
    assert decode_only(registry.create("h2o"), ["cpu"], ["float32"]) is not None
    assert decode_only(registry.create("band"), ["cpu"], ["float32"]) is None


@pytest.mark.parametrize("variants", ["h2o", "snapkv,full", "full(kv_cache=false)"])
def test_a_decode_only_variant_is_refused_before_any_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], variants: str
) -> None:
    out = tmp_path / "out"
    assert main(["run", "quick", "--variants", variants, "--out", str(out), "--no-progress"]) == Exit.USAGE
    err = capsys.readouterr().err
    assert not out.exists()  # no run folder, not even an empty one
    label = variants.split(",")[0].replace("false", "False")
    assert f"--variants: {label} runs only in decode" in err
    assert "run it with --mode decode" in err and "attnbench run decode --variants" in err
