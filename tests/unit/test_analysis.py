"""Scaling fits against constructed data with known answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from attnbench.report.analysis import loglog_slope, scaling_table


def test_slope_of_power_laws() -> None:
    n = [1024, 2048, 4096, 8192]
    assert loglog_slope(n, [3 * x**2 for x in n]) == pytest.approx(2.0)
    assert loglog_slope(n, [0.5 * x for x in n]) == pytest.approx(1.0)
    assert loglog_slope(n, [x * math.log(x) for x in n]) == pytest.approx(1.13, abs=0.02)
    assert math.isnan(loglog_slope([1024], [1.0]))
    assert loglog_slope(n, [1.0, float("nan"), 4.0, 8.0]) == pytest.approx(1.0)


def test_scaling_table_uses_only_ok_cells() -> None:
    frame = pd.DataFrame(
        {
            "label": ["a"] * 4 + ["b"] * 2,
            "status": ["ok", "ok", "ok", "oom", "ok", "error"],
            "seq_len": [100, 200, 400, 800, 100, 200],
            "time_median_s": [1.0, 2.0, 4.0, float("nan"), 1.0, float("nan")],
            "peak_mem_bytes": [10, 40, 160, float("nan"), 5, float("nan")],
        }
    )
    table = scaling_table(frame).set_index("label")
    assert table.loc["a", "time_slope"] == pytest.approx(1.0)
    assert table.loc["a", "memory_slope"] == pytest.approx(2.0)
    assert table.loc["a", "n_range"] == "100–400" and table.loc["b", "points"] == 1
