"""What a newcomer meets first: `run --variants` in the syntax reports print, errors that name the flag that
caused them, a did-you-mean for every enumerated value, and `check` catching NaN where no key is seen."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from attnbench.cli import main
from attnbench.commands import check as check_command
from attnbench.conformance import check_contexts, run_check
from attnbench.interface import AttentionVariant
from attnbench.plan.cells import VariantSpec
from attnbench.plan.config import ConfigError, load_config, parse_config
from attnbench.runfolder.results import read_results
from helpers import write_tiny


def labels(config) -> list[str]:
    return [spec.label() for spec in config.variants]


# ---- run --variants: one syntax, a setting as typed ---------------------------------------------------


def test_run_variants_takes_settings_as_reports_label_them() -> None:
    config = load_config("quick", {"variants": "band(window=64),band(window=128),full"})
    assert labels(config) == ["band(window=64)", "band(window=128)", "full"]
    assert config.overrides["variants"] == ["band(window=64)", "band(window=128)", "full"]
    assert load_config("quick", {"variants": "band(window = 64)"}).variants == config.variants[:1]
    # a plain name keeps the preset's grid for it; labels printed by a report read back as the same settings
    assert labels(load_config("quick", {"variants": "strided,band"})) == [
        "strided(pattern=strided)",
        "strided(pattern=fixed)",
        "band(window=256)",
        "band(sinks=4, window=256)",
    ]
    printed = "lsh(shared_qk=True),band(block_size=32, window=64)"
    assert ",".join(labels(load_config("quick", {"variants": printed}))) == printed


def test_a_plain_name_keeps_the_grid_of_a_file_written_as_tables(tmp_path: Path) -> None:
    """`config.toml` of a run folder lists [[variants]] tables: a name given again keeps each of them."""
    path = tmp_path / "tables.toml"
    write_tiny(path, '[[variants]]\nname = "band"\nwindow = [8, 16]\n[[variants]]\nname = "full"\n', error=False)
    config = load_config(str(path), {"variants": "band,band(window=4)"})
    assert labels(config) == ["band(window=8)", "band(window=16)", "band(window=4)"]


def test_variant_specs_read_back_from_their_labels_and_refuse_what_they_cannot_be() -> None:
    """One parser (`VariantSpec.parse`) reads `run --variants`, `model --variants` and a report's labels."""
    text = "band(window=64, block_size=32),lsh,strided(pattern=fixed)"
    specs = VariantSpec.parse(text)
    assert [s.label() for s in specs] == ["band(block_size=32, window=64)", "lsh", "strided(pattern=fixed)"]
    assert VariantSpec.parse(",".join(s.label() for s in specs)) == specs
    with pytest.raises(ValueError, match="window takes one value here"):
        VariantSpec.parse("band(window=[64, 128])")
    with pytest.raises(ValueError, match="window is given twice"):
        VariantSpec.parse("band(window=64, window=128)")
    with pytest.raises(ValueError, match="unbalanced parentheses"):
        VariantSpec.parse("band(window=64")


def test_the_cells_of_a_run_carry_the_label_typed(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    write_tiny(path, error=False)
    argv = ["run", str(path), "--variants", "full,band(window=4),band(window=8)", "--out", str(tmp_path / "out")]
    assert main([*argv, "--no-progress", "--no-report"]) == 0
    frame = read_results(next((tmp_path / "out").iterdir()))
    assert list(dict.fromkeys(frame.label)) == ["full", "band(window=4)", "band(window=8)"]
    assert (frame.status == "ok").all()


# ---- problems name the flag, or the file -----------------------------------------------------------


def test_problems_of_flags_name_the_flag_and_the_file_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "quick", "--variants", "bnad", "--device", "cdua", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--variants: Unknown variant 'bnad'. Did you mean: band?" in err
    assert "--device: unknown 'cdua'" in err and "Did you mean: cuda?" in err
    assert "preset 'quick'" not in err and not any(tmp_path.iterdir())
    path = tmp_path / "mine.toml"
    write_tiny(path, heads=0, error=False)
    assert main(["run", str(path), "--dtype", "fp16", "--variants", "band(window=", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "the command line has 2 problem(s)" in err and f"{path} has 1 problem(s)" in err
    assert "--dtype: unknown 'fp16'" in err and "Did you mean: float16?" in err
    assert "--variants: unbalanced parentheses" in err and "  - heads: 0 must be >= 1" in err


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"dtype": "fp16"}, "dtype: unknown 'fp16' (known: float64, float32, float16, bfloat16). Did you mean: float16"),
        ({"dtype": "half"}, "Did you mean: float16?"),
        ({"dtype": "bf16"}, "Did you mean: bfloat16?"),
        ({"dtype": "fp32"}, "Did you mean: float32?"),
        ({"dtype": "float23"}, "Did you mean: float32"),
        ({"mode": "fwd+bw"}, "mode: unknown 'fwd+bw' (known: fwd, fwd+bwd, decode). Did you mean: fwd+bwd"),
        ({"mode": "backward"}, "Did you mean: fwd+bwd?"),
        ({"device": "cdua"}, "Did you mean: cuda?"),
        ({"device": "gpu"}, "Did you mean: cuda?"),
        ({"inputs": [{"name": "gausian"}]}, "unknown input distribution 'gausian'"),
        ({"inputs": [{"name": "gausian"}]}, "Did you mean: gaussian?"),
        ({"inputs": [{"name": "local", "lenght": 8}]}, "Did you mean: length?"),
        ({"variants": {"strided": {"pattern": "strdied"}}}, "is not one of 'strided', 'fixed'. Did you mean: strided?"),
    ],
)
def test_every_enumerated_value_suggests_the_one_meant(raw: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"variants": ["full"], **raw})
    assert expected in str(caught.value)


def test_check_suggests_a_hyperparameter_choice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "strided", "--param", "pattern=fixd"]) == 2
    assert "pattern: 'fixd' is not one of 'strided', 'fixed'. Did you mean: fixed?" in capsys.readouterr().err


# ---- check: a query that sees no key outputs zeros --------------------------------------------------


class NaiveMaskedSoftmax(AttentionVariant):
    """Dense softmax with padding set to -inf: right wherever a query sees a key, NaN where it sees none."""

    name = "naive-masked"
    family = "test"
    exact = False
    zero_empty_rows = False

    def forward(self, q, k, v, *, causal, key_padding_mask):
        scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], -math.inf)
        if causal:
            future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, -math.inf)
        out = torch.einsum("bhij,bhje->bhie", scores.softmax(dim=-1), v)
        return out.nan_to_num(0.0) if self.zero_empty_rows else out


class ZeroWhereNoKey(NaiveMaskedSoftmax):
    name = "zero-where-no-key"
    zero_empty_rows = True


def test_check_fails_a_variant_that_gives_nan_where_every_key_is_padding(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for ctx in check_contexts(lambda: NaiveMaskedSoftmax()):
        assert run_check("key_padding", ctx).status == "pass"  # padded keys are ignored where others exist
        result = run_check("fully_padded", ctx)
        assert result.status == "fail"
        assert "every key padded" in result.detail and "must output zeros" in result.detail
        assert "got NaN or Inf (non-causal); NaN or Inf (causal)" in result.detail
    for ctx in check_contexts(lambda: ZeroWhereNoKey()):
        assert run_check("fully_padded", ctx).status == "pass"

    class OneVariant:  # what `attnbench check` asks of the registry
        def load(self, name: str) -> type[AttentionVariant]:
            return {"naive-masked": NaiveMaskedSoftmax, "zero-where-no-key": ZeroWhereNoKey}[name]

    monkeypatch.setattr(check_command, "registry", OneVariant())
    assert main(["check", "naive-masked"]) == 1
    out = capsys.readouterr().out
    assert "fully_padded (float64), fully_padded (float32)" in out and "must output zeros" in out
    assert main(["check", "zero-where-no-key"]) == 0


def test_every_preset_states_its_measured_run_time() -> None:
    """`attnbench presets` gives each preset's run time as measured on 2 cores (its `measured_run_time`)."""
    import re

    from attnbench.plan.config import load_config, preset_descriptions

    for name, (description, run_time) in preset_descriptions().items():
        pattern = r"^[\d.]+ (s|min|h) \(load [\d.]+\), \d{4}-\d\d-\d\d(, .+)?$"  # a note may follow the date
        config = load_config(name, cluster=True)  # (cluster: a GPU preset, gpu-check, is parsed without CUDA here)
        on_gpu = "cuda" in config.axes["device"] and run_time.startswith("not measured yet: needs a CUDA GPU")
        assert description and (re.match(pattern, run_time) or on_gpu), (name, run_time)
        assert config.plan().cells  # the descriptive key does not disturb the config
