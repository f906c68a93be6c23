"""The `compile` axis end to end: eager and compiled cells of a setting timed in one group, in turns; compile time
kept apart; a compiler failure `unsupported` with its reason, an error eager raises too still an `error`; the
report and summary say what compiling did."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attnbench.cli import main
from attnbench.interface import AttentionVariant, Capabilities
from attnbench.measure import compiled as compiled_module
from attnbench.measure import dispatch as measure
from attnbench.plan.config import parse_config
from attnbench.run.sweep import run_plan
from attnbench.runfolder.results import read_results
from helpers import only_run, tiny, write_tiny

pytestmark = pytest.mark.slow  # each compiled cell compiles (seconds)


def test_eager_and_compiled_are_timed_together_and_agree(tmp_path: Path) -> None:
    config = write_tiny(tmp_path / "c.toml", variants=["full", "linear"], seq_lens=[32], heads=2, head_dim=8)
    assert main(["run", str(config), "--compile", "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    run = only_run(tmp_path / "out")
    frame = read_results(run).set_index("label")
    assert set(frame.index) == {"full", "full compiled", "linear", "linear compiled"}
    assert frame.group_key.nunique() == 1  # one group: timed in turns
    for name in ("full", "linear"):
        eager, compiled = frame.loc[name], frame.loc[f"{name} compiled"]
        assert compiled.status == "ok" and bool(compiled.compiled) and not bool(eager.compiled)
        assert compiled.compiled_speedup_low <= compiled.compiled_speedup <= compiled.compiled_speedup_high
        assert compiled.compiled_graphs == 1 and compiled.compile_s > 0  # one whole graph each
        assert abs(compiled.err_rel_fro - eager.err_rel_fro) < 1e-5  # its error measured on its own output
        # compiled kernels allocate through the same CPU allocator: its peak sees them (no live-tensor figure)
        assert compiled.mem_method == eager.mem_method == "cpu-allocator-peak" and compiled.peak_mem_bytes > 0
        assert pd_isna(compiled.tensor_mem_bytes) and eager.tensor_mem_bytes > 0
        assert pd_isna(eager.compiled_speedup)
    report, summary = (run / "report.md").read_text(), (run / "summary.md").read_text()
    assert "Compiled against eager" in report and "| linear compiled |" in report
    assert "Compiled (eager time / compiled time, per round, in turns):" in summary
    assert "of roofline" in report


def pd_isna(value) -> bool:
    return value != value


def test_a_compiler_failure_is_unsupported_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_backend(graph, example_inputs):
        raise RuntimeError("no kernel for this op (a test backend)")

    monkeypatch.setattr(
        compiled_module, "compiled_call", lambda variant: torch.compile(variant.__call__, backend=failing_backend)
    )
    config = parse_config(tiny(variants=["full", "linear"], compile=[False, True]))
    frame = read_results(run_plan(config, tmp_path, progress=False)).set_index("label")
    assert (frame.loc[["full", "linear"], "status"] == "ok").all()  # eager unaffected
    for label in ("full compiled", "linear compiled"):
        assert frame.loc[label, "status"] == "unsupported"
        assert frame.loc[label, "reason"].startswith("torch.compile could not compile it: BackendCompilerFailed")
        assert "no kernel for this op" in frame.loc[label, "reason"]


class RaisesAlways(AttentionVariant):
    """Fails in eager too: compiling it is no excuse."""

    name = "raises-always"
    family = "test"
    exact = False
    supports = Capabilities()

    def forward(self, q, k, v, *, causal, key_padding_mask):
        raise ValueError("broken in eager too")


def test_an_error_eager_raises_too_stays_an_error(toy_registry) -> None:
    registry = toy_registry(RaisesAlways)
    config = parse_config(tiny(variants=["full", "raises-always"], compile=[True]), registry=registry)
    rows = {row.label: row for row in measure.measure_group(config.plan().groups[0], config.settings, registry).rows}
    assert rows["full compiled"].status == "ok"
    assert rows["raises-always compiled"].status == "error"
    assert "broken in eager too" in rows["raises-always compiled"].reason


def test_compile_flags_and_a_compiled_only_run_measured_against_full_compiled(tmp_path: Path, capsys) -> None:
    config = write_tiny(tmp_path / "c.toml", variants=["full", "linear"])
    assert main(["run", "--compile", str(config), "--dry-run"]) == 0  # a bare flag: the config is not its value
    assert "4/4" in capsys.readouterr().out  # eager and compiled of each
    assert main(["run", str(config), "--compile-only", "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    frame = read_results(only_run(tmp_path / "out")).set_index("label")
    assert list(frame.index) == ["full compiled", "linear compiled"]  # compiled alone
    assert (frame.baseline == "full compiled").all() and frame.loc["full compiled", "speedup"] == 1.0
    out, err = capsys.readouterr()
    assert "2 variant settings compiled × N" in err and "Compiled (eager time" not in out  # no eager twins


class Recompiles(AttentionVariant):
    """Its guards fail on every call (an attribute read in forward changes each time): compiled, it would compile
    inside its own timing."""

    name = "recompiles"
    family = "test"
    exact = False
    supports = Capabilities()

    def __init__(self, seed: int = 0, **hyperparams) -> None:
        super().__init__(seed=seed, **hyperparams)
        self.calls = 0

    def forward(self, q, k, v, *, causal, key_padding_mask):
        self.calls += 1
        return v * (self.calls % 7 + 1) / (self.calls % 7 + 1)


def test_a_call_that_compiles_again_while_timed_is_unsupported(toy_registry) -> None:
    registry = toy_registry(Recompiles)
    config = parse_config(tiny(variants=["full", "recompiles"], compile=[False, True]), registry=registry)
    rows = {row.label: row for row in measure.measure_group(config.plan().groups[0], config.settings, registry).rows}
    assert rows["recompiles"].status == "ok" and rows["full compiled"].status == "ok"
    assert rows["recompiles compiled"].status == "unsupported"
    assert rows["recompiles compiled"].reason.startswith("torch.compile compiled it again between timed calls")

