"""A comparison group is measured in interleaved rounds; speedups are paired per round; noise is said;
the axes are declared once."""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch
from attnbench import AttentionVariant
from attnbench.measure import dispatch as measure
from attnbench.measure import timing
from attnbench.measure.noise import noise_reason
from attnbench.plan.cells import AXES, CELL_COLUMNS, GROUP_COLUMNS, Cell
from attnbench.plan.config import ConfigError, parse_config
from attnbench.runfolder.rows import COLUMNS
from attnbench.stats import paired_speedup, ratio_of_medians

CALLS: list[str] = []


class Recorded(AttentionVariant):
    family = "test"
    exact = False

    def forward(self, q, k, v, *, causal, key_padding_mask):
        CALLS.append(self.name)
        return v.clone()


class RecordedA(Recorded):
    name = "rec-a"


class RecordedB(Recorded):
    name = "rec-b"


def test_group_is_timed_in_shuffled_rounds_each_variant_once_per_round(toy_registry, monkeypatch) -> None:
    registry = toy_registry(RecordedA, RecordedB)
    monkeypatch.setattr(timing, "MIN_SAMPLE_S", 0.0)  # one call per sample, so calls are rounds
    config = parse_config(
        {"variants": ["rec-a", "rec-b"], "seq_lens": [16], "heads": 1, "head_dim": 8, "min_run_time": 1e-6,
         "min_rounds": 12, "error": False},
        registry=registry,
    )  # fmt: skip
    [group] = config.plan().groups
    CALLS.clear()
    result = measure.measure_group(group, config.settings, registry)
    calls = list(CALLS)
    # per variant: the error pass, the warm-up and a calibration call, then the rounds; memory calls at the end
    timed = calls[6 : 6 + 2 * 12]
    rounds = [tuple(timed[i : i + 2]) for i in range(0, len(timed), 2)]
    assert all(sorted(r) == ["rec-a", "rec-b"] for r in rounds)  # each variant exactly once per round
    assert len(set(rounds)) == 2  # the order is shuffled between rounds, not fixed
    assert {row.time_repeats for row in result.rows} == {12}
    samples = {key for key, _, _ in result.samples}
    assert samples == {c.key() for c in group.cells}
    CALLS.clear()
    measure.measure_group(group, config.settings, registry)
    assert CALLS[6 : 6 + 2 * 12] == timed  # the shuffle is seeded by the group: reproducible


def test_paired_speedup_cancels_a_slow_stretch_that_medians_would_not() -> None:
    """The machine slows 4x for half the rounds; B is 2x faster than A in every round."""
    drift = [1.0] * 10 + [4.0] * 10
    a = [0.010 * d for d in drift]
    b = [0.005 * d for d in drift]
    interval = paired_speedup(a, b)
    assert interval.estimate == pytest.approx(2.0)
    assert interval.low == pytest.approx(2.0) and interval.high == pytest.approx(2.0)
    # measured apart (A in the quiet half, B in the slow one) the same medians would claim B is 2x slower
    assert statistics.median(a[:10]) / statistics.median(b[10:]) == pytest.approx(0.5)


def test_paired_speedup_interval_covers_the_truth_on_noisy_samples() -> None:
    generator = torch.Generator().manual_seed(0)
    noise = lambda: (1 + 0.2 * torch.rand(40, generator=generator)).tolist()  # noqa: E731
    a = [0.01 * x for x in noise()]
    b = [0.004 * x for x in noise()]
    interval = paired_speedup(a, b)
    assert interval.low < 2.5 < interval.high and interval.high - interval.low < 0.5


def test_ratio_of_medians_separates_shifted_from_identical_distributions() -> None:
    generator = torch.Generator().manual_seed(1)
    draw = lambda scale: [scale * (1 + 0.1 * x) for x in torch.randn(30, generator=generator).abs().tolist()]  # noqa: E731
    same = ratio_of_medians(draw(1.0), draw(1.0))
    shifted = ratio_of_medians(draw(1.0), draw(1.3))
    assert same.clears(0.05) is None
    assert shifted.clears(0.05) == "above" and shifted.low > 1.15


def test_noise_reasons() -> None:
    assert noise_reason(1.0, 0.05, 0.1) == ""
    assert "IQR 20%" in noise_reason(1.0, 0.2, 0.0)
    assert "other processes used 1.0 cores" in noise_reason(1.0, 0.01, 1.0)


def test_axes_are_declared_once_and_everything_derives_from_them() -> None:
    fields = [name for name, _, _ in AXES.values()]
    assert set(CELL_COLUMNS) >= set(fields) - {"variant", "input"} | {"input", "variant", "label", "hparams"}
    assert set(GROUP_COLUMNS) == set(CELL_COLUMNS) - {"variant", "label", "hparams", "compiled"}
    assert set(COLUMNS) >= set(CELL_COLUMNS)
    config = parse_config({"variants": ["full"], "seq_lens": [32], "kv_lens": [48], "value_dim": [24]})
    [cell] = config.plan().cells
    assert (cell.seq_len, cell.n_k, cell.v_dim) == (32, 48, 24)
    assert Cell.from_key(cell.key()) == cell
    assert parse_config(config.to_dict()).plan().cells == config.plan().cells


def test_compile_is_a_variant_side_axis_eager_and_compiled_share_a_group() -> None:
    """`compile = [false, true]` doubles each variant setting inside its group (timed in turns with its eager
    twin), labels the compiled one, and survives the cell key and the stored config."""
    config = parse_config({"variants": ["full", "band"], "seq_lens": [32, 64], "compile": [False, True]})
    plan = config.plan()
    assert len(plan.cells) == 8 and len(plan.groups) == 2
    labels = [cell.label() for cell in plan.groups[0].cells]
    assert labels == ["full", "full compiled", "band", "band compiled"]
    assert all(Cell.from_key(cell.key()) == cell for cell in plan.cells)
    assert parse_config(config.to_dict()).plan().cells == plan.cells
    assert plan.cells[1].columns()["compiled"] is True and plan.cells[1].columns()["variant"] == "full"
    with pytest.raises(ConfigError, match="compile: expected bool"):
        parse_config({"variants": ["full"], "compile": "yes"})


def test_a_new_axis_added_in_one_place_reaches_keys_rows_and_group_columns(tmp_path: Path, monkeypatch) -> None:
    """Copy plan/cells.py, add one field to Cell, and the copy's config keys, cell key and columns all carry it."""
    from attnbench.plan import cells

    source = Path(cells.__file__).read_text()
    marker = '    seq_len: int = axis("seq_lens", int, [256, 1024])'
    assert marker in source
    patched = source.replace(marker, '    window_scale: int = axis("window_scales", int, [1])\n' + marker)
    path = tmp_path / "plan_with_axis.py"
    path.write_text(patched)
    spec = importlib.util.spec_from_file_location("plan_with_axis", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "plan_with_axis", module)
    spec.loader.exec_module(module)
    assert "window_scales" in module.AXES
    assert "window_scale" in module.CELL_COLUMNS and "window_scale" in module.GROUP_COLUMNS
    values = {name: default for name, _, default in module.AXES.values()}
    values["variant"], values["window_scale"] = [module.VariantSpec("full")], [1, 2]
    cells = module.expand(values)
    assert len({c.key() for c in cells}) == 2 * len(values["seq_len"])
    assert len(module.groups_of(cells)) == 2 * len(values["seq_len"])  # the new axis separates groups


def test_end_to_end_rows_carry_speedup_noise_and_where_it_ran(tmp_path: Path) -> None:
    from attnbench.run.sweep import run_plan
    from attnbench.runfolder.folder import read_samples
    from attnbench.runfolder.results import read_results

    config = parse_config(
        {"variants": ["full", "full-math", "band"], "seq_lens": [64, 128], "heads": 2, "head_dim": 16,
         "min_run_time": 0.02, "min_rounds": 4}
    )  # fmt: skip
    run_dir = run_plan(config, tmp_path, progress=False)
    frame = read_results(run_dir)
    assert (frame.status == "ok").all()
    assert (frame.time_repeats >= 4).all() and frame.time_p10_s.le(frame.time_p90_s).all()
    full = frame[frame.variant == "full"]
    assert (full.speedup == 1.0).all() and (frame.baseline == "full").all()
    assert (frame.speedup_low <= frame.speedup).all() and (frame.speedup <= frame.speedup_high).all()
    assert frame.host.str.len().gt(0).all() and frame.threads.ge(1).all() and frame.load_before.notna().all()
    samples = read_samples(run_dir)
    assert set(samples) == set(frame.cell_key) and all(len(v) >= 4 for v in samples.values())


def test_an_option_refused_only_at_the_call_is_unsupported_not_an_error(tmp_path: Path) -> None:
    from attnbench.run.sweep import run_plan
    from attnbench.runfolder.results import read_results

    config = parse_config(
        {"variants": {"full": {}, "strided": {"factorize": True}}, "seq_lens": [32], "heads": 1, "head_dim": 8,
         "min_run_time": 0.01, "min_rounds": 2}
    )  # fmt: skip
    frame = read_results(run_plan(config, tmp_path, progress=False)).set_index("variant")
    assert frame.loc["strided", "status"] == "unsupported" and "at least 2 heads" in frame.loc["strided", "reason"]
    assert frame.loc["full", "status"] == "ok"


class SlowFirst(AttentionVariant):
    name = "slow-first"
    family = "test"
    exact = False

    def __init__(self, seed=0, **hyperparams):
        super().__init__(seed=seed, **hyperparams)
        self.calls = 0

    def forward(self, q, k, v, *, causal, key_padding_mask):
        self.calls += 1
        if self.calls == 1:
            time.sleep(0.3)  # as a compiler would
        return v.clone()


def test_compile_s_is_the_first_call_at_the_shape_minus_a_warm_call(toy_registry) -> None:
    registry = toy_registry(SlowFirst)
    config = parse_config(
        {"variants": ["slow-first"], "seq_lens": [16], "heads": 1, "head_dim": 8, "min_run_time": 0.01,
         "min_rounds": 2},
        registry=registry,
    )  # fmt: skip
    [row] = measure.measure_group(config.plan().groups[0], config.settings, registry).rows
    assert 0.25 < row.compile_s < 1.0 and row.time_median_s < 0.01


def test_shared_qk_lsh_runs_forward_and_backward(tmp_path: Path) -> None:
    from attnbench.run.sweep import run_plan
    from attnbench.runfolder.results import read_results

    config = parse_config(
        {"variants": {"full": {}, "lsh": {"shared_qk": True}}, "seq_lens": [128], "heads": 2, "head_dim": 16,
         "mode": "fwd+bwd", "causal": [False, True], "min_run_time": 0.01, "min_rounds": 2}
    )  # fmt: skip
    frame = read_results(run_plan(config, tmp_path, progress=False))
    assert (frame.status == "ok").all(), frame[["label", "status", "reason"]]


def test_baseline_is_a_variant_setting_of_the_run() -> None:
    from attnbench.plan.config import ConfigError

    with pytest.raises(ConfigError, match="baseline: 'nope' is not one of this run's variant settings"):
        parse_config({"variants": ["full", "band"], "baseline": "nope"})
    config = parse_config({"variants": {"full": {}, "band": {"window": 8}}, "baseline": "band(window=8)"})
    assert config.settings.baseline == "band(window=8)"


@pytest.mark.parametrize("n", [5, 6, 9, 15, 40])
def test_the_speedup_interval_covers_the_true_median_as_often_as_it_says(n: int) -> None:
    """Issue 23, item 5: with 5 rounds the '95% bootstrap interval' was the min and max of five ratios and moved
    with the bootstrap seed. The order-statistic interval is the same for the same samples and covers the true
    median at least at its stated coverage (checked on 4000 skewed draws: log-normal per-round ratios)."""
    import random

    from attnbench.stats import median_interval

    rng = random.Random(n)
    covered = 0
    trials = 4000
    for _ in range(trials):
        ratios = [2.0 * math.exp(rng.gauss(0, 0.3)) for _ in range(n)]  # true median 2.0
        interval = median_interval(ratios)
        covered += interval.low <= 2.0 <= interval.high
    expected = median_interval([float(i) for i in range(n)]).coverage
    assert expected >= (0.95 if n >= 6 else 0.9375)
    assert covered / trials >= expected - 0.015  # within binomial noise of 4000 trials
    values = [rng.random() for _ in range(n)]
    assert median_interval(values) == median_interval(list(reversed(values)))  # no seed: one interval


def test_an_eager_cell_keeps_the_key_it_had_before_the_compile_axis() -> None:
    """Resume and compare match cells by key: a run folder written before `compile` existed must still match."""
    import json

    [cell] = parse_config({"variants": ["full"], "seq_lens": [32]}).plan().cells
    [compiled] = parse_config({"variants": ["full"], "seq_lens": [32], "compile": [True]}).plan().cells
    assert len(json.loads(cell.key())) == len(json.loads(compiled.key())) - 1  # eager: the old key, no new element
    assert Cell.from_key(cell.key()) == cell and Cell.from_key(compiled.key()) == compiled


def test_the_flex_backend_is_not_compiled_twice() -> None:
    """The flex backend is compiled code already (under torch.compile its new mask function each call recompiled it
    between timed calls): its compiled cell is refused before any work with what to do; its eager cell runs."""
    from attnbench.measure.group import admit
    from attnbench.registry import registry as builtins

    config = parse_config({"variants": [{"name": "band", "backend": "flex", "window": 16}], "seq_lens": [128],
                           "compile": [False, True]})  # fmt: skip
    admitted = {cell.compiled: admit(cell, config.settings, builtins) for cell in config.plan().cells}
    assert admitted[True].fields["status"] == "unsupported"
    assert "is compiled code already (FlexAttention)" in admitted[True].fields["reason"]
    assert "status" not in admitted[False].fields or admitted[False].fields["status"] != "unsupported"
