"""Timing helpers: side-by-side calls are timed in turns and reported with their spread."""

from __future__ import annotations

import pytest
import torch
from attnbench import timing


def test_interleaved_timing_takes_turns_and_reports_each_calls_own_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    order: list[str] = []

    def costing(name: str, seconds: float):
        def call() -> None:
            order.append(name)
            clock[0] += seconds

        return call

    result = timing.time_interleaved(
        {"slow": costing("slow", 0.3), "fast": costing("fast", 0.1)}, torch.device("cpu"), min_run_time=1.0
    )
    assert order[:2] == ["slow", "fast"]  # warm-ups
    assert order[2:] == ["slow", "fast"] * (len(order[2:]) // 2)  # then strictly in turns
    assert result["slow"].median_s == pytest.approx(0.3) and result["fast"].median_s == pytest.approx(0.1)
    assert result["fast"].iqr_s == pytest.approx(0.0)
    assert result["fast"].repeats == result["slow"].repeats >= 10  # until the fast one too has run 1 s
