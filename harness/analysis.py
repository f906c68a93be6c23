"""Numbers derived from a run's rows: how time and memory scale with N."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def loglog_slope(n: pd.Series | list[float], y: pd.Series | list[float]) -> float:
    """Least-squares slope of log(y) against log(N): 1 is linear, 2 quadratic. NaN with fewer than 2 points."""
    points = [(a, b) for a, b in zip(n, y) if a > 0 and b is not None and not math.isnan(b) and b > 0]
    if len(points) < 2:
        return float("nan")
    x, z = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    return float(np.polyfit(x, z, 1)[0])


def scaling_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per variant label: the N range of ok cells and the log-log slopes of median time and peak memory."""
    rows = []
    for label, group in cells[cells.status == "ok"].groupby("label", sort=False):
        group = group.sort_values("seq_len")
        rows.append({
            "label": label,
            "n_range": f"{group.seq_len.min()}–{group.seq_len.max()}",
            "points": len(group),
            "time_slope": loglog_slope(group.seq_len, group.time_median_s),
            "memory_slope": loglog_slope(group.seq_len, group.peak_mem_bytes),
        })
    return pd.DataFrame(rows)
