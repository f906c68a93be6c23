"""A variant that none of a run's devices supports (its `supports.devices`) makes no `unsupported` rows: a config's
own list runs without it and says so in one note before the plan; a setting named on the command line is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from attnbench.cli import main
from attnbench.interface import AttentionVariant, Capabilities
from attnbench.plan.config import ConfigError, load_config, parse_config


class CudaOnly(AttentionVariant):
    name = "cuda-only"
    family = "test"
    exact = False
    supports = Capabilities(devices=("cuda",))

    def forward(self, q, k, v, *, causal, key_padding_mask):
        return v.clone()


SMALL = {"seq_lens": [32], "heads": 2, "head_dim": 16}


def test_a_variant_the_devices_cannot_run_is_left_out_with_one_note(toy_registry) -> None:
    registry = toy_registry(CudaOnly)
    config = parse_config({"variants": ["full", "cuda-only", "band"], **SMALL}, registry=registry)
    assert [spec.name for spec in config.variants] == ["full", "band"]
    assert config.notes == ["cuda-only runs on cuda only: left out of this run on cpu (`attnbench list` shows each "
                            "variant's devices)"]  # fmt: skip
    assert {cell.variant.name for cell in config.plan().cells} == {"full", "band"}
    on_gpu = parse_config({"variants": ["full", "cuda-only"], "device": "cuda", **SMALL}, registry=registry,
                          cluster=True)  # fmt: skip (cluster: CUDA not required on this machine)
    assert [spec.name for spec in on_gpu.variants] == ["full", "cuda-only"] and on_gpu.notes == []
    both = parse_config({"variants": ["full", "cuda-only"], "device": ["cpu", "cuda"], **SMALL}, registry=registry,
                        cluster=True)  # fmt: skip
    assert [spec.name for spec in both.variants] == ["full", "cuda-only"]  # it runs on one of the devices


def test_a_config_of_such_variants_alone_is_refused(toy_registry) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config({"variants": ["cuda-only"], **SMALL}, registry=toy_registry(CudaOnly))
    assert "variants: none of them runs on cpu: cuda-only runs on cuda only" in str(error.value)


def test_one_named_on_the_command_line_is_refused_naming_the_device(toy_registry, tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text('seq_lens = [32]\nvariants = ["full"]\n')
    with pytest.raises(ConfigError) as error:
        load_config(str(path), {"variants": "full,cuda-only"}, registry=toy_registry(CudaOnly))
    assert error.value.problems == [
        "--variants: cuda-only runs only on cuda, and this run is on cpu: add --device cuda (on a machine that has "
        "one), or leave it out"
    ]


def test_quick_on_the_cpu_leaves_xformers_out_in_one_line(capsys, tmp_path: Path) -> None:
    config = load_config("quick")
    said = [note for note in config.notes if "full-xformers" in note]
    assert len(said) == 1 and "cuda only" in said[0] and "this run on cpu" in said[0]
    assert "full-xformers" not in {cell.variant.name for cell in config.plan().cells}
    assert main(["run", "quick", "--variants", "full-xformers", "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "--variants: full-xformers runs only on cuda, and this run is on cpu" in err
    assert not (tmp_path / "runs").exists()  # refused before any folder


def test_a_causal_only_run_leaves_out_the_configs_settings_without_a_causal_form() -> None:
    """`run quick --causal true` (the README's recipe): the preset's non-causal-only settings are left out with one
    note, not a row `unsupported` per input and N; a run with non-causal cells keeps them; settings named with
    --variants stay (their cells say why)."""
    variants = ["full", "nystromformer", {"name": "lsh", "shared_qk": [True, False]}, "band"]
    causal = parse_config({"variants": variants, "causal": True, **SMALL})
    assert [spec.label() for spec in causal.variants] == ["full", "lsh(shared_qk=True)", "band"]
    [note] = [n for n in causal.notes if "no causal form" in n]
    assert "nystromformer" in note and "lsh(shared_qk=False)" in note
    both = parse_config({"variants": variants, "causal": [False, True], **SMALL})
    assert len(both.variants) == 5 and not any("no causal form" in n for n in both.notes)



def test_the_readmes_causal_recipe_plans_no_cell_that_cannot_run(capsys) -> None:
    assert main(["run", "quick", "--causal", "true", "--seq-lens", "512", "--dry-run"]) == 0
    said = capsys.readouterr()
    text = said.out + said.err
    total = re.search(r"total: (\d+) of (\d+) cells would run", text)
    assert total and total.group(1) == total.group(2) and "cannot run" not in text, text
