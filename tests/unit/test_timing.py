"""The one timing loop: side-by-side calls are timed in turns, each with its own seconds."""

from __future__ import annotations

import pytest
import torch
from attnbench.measure import timing
from attnbench.stats import Spread


def fake_clock(monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], list[str], callable]:
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    order: list[str] = []

    def costing(name: str, seconds: float):
        def call() -> None:
            order.append(name)
            clock[0] += seconds

        return call

    return clock, order, costing


def test_calls_take_turns_and_each_reports_its_own_time(monkeypatch: pytest.MonkeyPatch) -> None:
    _, order, costing = fake_clock(monkeypatch)
    samples = timing.time_in_turns(
        {"slow": costing("slow", 0.3), "fast": costing("fast", 0.1)}, torch.device("cpu"), min_run_time=1.0
    )
    assert order[:4] == ["slow", "slow", "fast", "fast"]  # each warmed up, then timed once to size its block
    rounds = order[4:]
    assert all(sorted(rounds[i : i + 2]) == ["fast", "slow"] for i in range(0, 10, 2))  # in turns, each round
    assert rounds[10:] == ["fast"] * 5  # then the fast one alone, until it too has run 1 s
    slow, fast = Spread.of(samples["slow"]), Spread.of(samples["fast"])
    assert slow.median == pytest.approx(0.3) and fast.median == pytest.approx(0.1) and fast.iqr == pytest.approx(0)
    assert len(samples["slow"]) == 5 and len(samples["fast"]) == 10  # min_rounds, and 1 s each


def test_a_fast_call_is_timed_in_blocks_and_a_slow_one_stops_early(monkeypatch: pytest.MonkeyPatch) -> None:
    _, order, costing = fake_clock(monkeypatch)
    samples = timing.time_in_turns(
        {"tiny": costing("tiny", 1e-4), "huge": costing("huge", 5.0)},
        torch.device("cpu"),
        min_rounds=6,
        min_run_time=0.01,
        slow_after_s=1.0,
        slow_rounds=2,
    )
    assert len(samples["huge"]) == 2 and len(samples["tiny"]) == 6
    assert samples["tiny"] == pytest.approx([1e-4] * 6)  # a block of 20 calls, divided
    assert order.count("tiny") == 2 + 6 * 20


def test_a_call_that_fails_is_dropped_and_reported_while_the_rest_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, costing = fake_clock(monkeypatch)
    calls = {"ok": costing("ok", 0.1)}
    count = [0]

    def breaks_in_round_two() -> None:
        count[0] += 1
        if count[0] > 3:
            raise RuntimeError("boom")

    calls["broken"] = breaks_in_round_two
    failed = []
    samples = timing.time_in_turns(
        calls, torch.device("cpu"), min_run_time=0.5, on_failure=lambda name, error: failed.append((name, str(error)))
    )
    assert failed == [("broken", "boom")] and set(samples) == {"ok"} and len(samples["ok"]) >= 5
    with pytest.raises(RuntimeError, match="boom"):
        count[0] = 0
        timing.time_in_turns({"broken": breaks_in_round_two}, torch.device("cpu"), min_run_time=0.5)


def test_one_rule_calls_a_speed_difference_beyond_noise() -> None:
    """The verdict and `reproduce` both call `beyond_noise`: the whole interval on one side of 1, and a trusted one
    (95%, or a bootstrap's NaN coverage); min–max of too few rounds names no winner."""
    from attnbench.stats import beyond_noise

    assert beyond_noise(1.02, 1.3, 0.95) == "faster" and beyond_noise(0.7, 0.98, 0.96) == "slower"
    assert beyond_noise(0.9, 1.1, 0.95) == "" and beyond_noise(1.5, 2.0, 0.75) == ""
    assert beyond_noise(1.1, 1.2, float("nan")) == "faster" and beyond_noise(float("nan"), float("nan"), 0.95) == ""
