"""`run --dry-run --tune`: the plan counts what the tuning adds after the sweep, found by running the search itself
(each probe taken as within the budget: its longest bisection), and says that time apart from the sweep's."""

from __future__ import annotations

import re

import pytest
from attnbench.measure import machine
from attnbench.plan.config import parse_config
from attnbench.registry import registry
from attnbench.run.preview import preview, preview_text, tuning_groups, tuning_preview
from helpers import run_cli, tiny

PEAKS = {  # fixed yardsticks, so that the figures do not depend on this machine's load
    "cpu/float32": {"matmul_flops_per_s": 1e11, "copy_bytes_per_s": 1e10},
    "cpu/float64": {"matmul_flops_per_s": 5e10, "copy_bytes_per_s": 1e10},
}
UNITS = {"s": 1, "min": 60, "h": 3600, "days": 86400}  # seconds_text's units


def seconds_of(text: str) -> float:
    """'2.1 min' -> 126.0: a figure as `seconds_text` wrote it."""
    value, unit = text.split()
    return float(value.replace(",", "")) * UNITS[unit]


def band_at_1024(monkeypatch: pytest.MonkeyPatch, inputs: list[dict]):
    """full and band(window=64), causal at N=1024, on `inputs`, the machine's peaks fixed."""
    monkeypatch.setattr(machine, "_known_peaks", dict(PEAKS))
    variants = [{"name": "full"}, {"name": "band", "window": 64}]
    config = parse_config(tiny(variants=variants, seq_lens=[1024], causal=True, heads=2, head_dim=16, inputs=inputs,
                               tune=True))  # fmt: skip
    return config, config.plan()


@pytest.mark.parametrize("inputs", [[{"name": "realistic"}], [{"name": "realistic"}, {"name": "needles", "pairs": 4}]])
def test_the_dry_run_follows_the_tunings_own_bisection(monkeypatch: pytest.MonkeyPatch, inputs: list[dict]) -> None:
    """Whatever rules the search asks (error alone, or needle recall too where needles are planted), every probe
    answered as within them walks the knob down to its smallest value, then times the pick."""
    config, plan = band_at_1024(monkeypatch, inputs)
    groups = tuning_groups(config, plan, registry)
    probed = [cell.label() for group in groups if not group.timed for cell in group.cells]
    # band's window from 16 to 1024 / 2: the largest first, then halving down to the smallest
    assert list(dict.fromkeys(probed)) == [f"band(window={w})" for w in (512, 64, 32, 16)]
    assert groups[-1].timed and not any(g.timed for g in groups[:-1])
    assert [cell.label() for cell in groups[-1].cells] == ["full", "band(window=16)"]  # the pick timed with full


def test_the_tuning_s_time_is_counted_and_said_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    config, plan = band_at_1024(monkeypatch, [{"name": "realistic"}])
    sweep = preview(config, plan, registry)
    tuning = tuning_preview(config, plan, registry)
    assert len(tuning) == 1 and tuning[0].cells == 4 + 2 and tuning[0].seconds > 0
    said = " ".join(preview_text(sweep, 200, tuning).split())
    assert "N=1024 fwd causal float32 cpu b1×h2×d16 --tune: 5 groups" in said
    sweep_s, tuned_s, all_s = (seconds_of(m) for m in re.search(
        r"at least (\S+ \S+) of measurement, and --tune at least (\S+ \S+) more .* at least (\S+ \S+) in all", said
    ).groups())  # fmt: skip
    assert all_s == pytest.approx(sweep_s + tuned_s, rel=0.1) and all_s > sweep_s
    assert "not counted: " in said
    assert "--tune" not in preview_text(sweep, 200)  # without --tune, no word of it


@pytest.mark.slow  # two dry runs in subprocesses, each measuring the machine's peaks
def test_a_dry_run_with_tune_shows_a_larger_estimate_naming_the_tuning(tmp_path) -> None:
    args = ("run", "quick", "--causal", "true", "--seq-lens", "1024", "--variants", "full,band(window=64)",
            "--dry-run", "--out", str(tmp_path))  # fmt: skip
    plain, tuned = run_cli(*args), run_cli(*args, "--tune")
    assert plain.returncode == 0 and tuned.returncode == 0, plain.stderr + tuned.stderr
    plain_said, tuned_said = (" ".join(r.stdout.split()) for r in (plain, tuned))
    assert "--tune" not in plain_said
    totals = re.search(r"at least (\S+ \S+) of measurement, and --tune at least (\S+ \S+) more .* at least (\S+ \S+) "
                       r"in all", tuned_said)  # fmt: skip
    assert totals is not None, tuned_said
    sweep_s, tuned_s, all_s = (seconds_of(t) for t in totals.groups())
    assert tuned_s > 0 and all_s > sweep_s
    assert not any(tmp_path.iterdir())  # nothing was written
