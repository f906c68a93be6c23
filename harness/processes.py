"""`--processes k`: one group measured in k fresh worker processes, one after another, and their results merged.

The rounds of one process share more than the machine's moment: its memory layout, where its threads landed,
how its warm-up settled. Quiet reruns of one cell differed by up to 1.25× while each run's interval was ±1.5%:
an interval from one process's rounds cannot see that. Measured in k processes, a cell's speedup interval is a
two-level bootstrap: processes resampled with replacement, then each chosen process's rounds, so the spread
between processes enters it. Time statistics come from every process's samples; everything else (error,
memory, flags) from the first process that measured the cell ok.
"""

from __future__ import annotations

import random
import statistics
import zlib
from dataclasses import replace
from typing import Any

from attnbench.measure import GroupResult, is_baseline
from attnbench.plan import Group
from attnbench.stats import CONFIDENCE, RESAMPLES, Spread, quantile


def two_level_interval(per_process: list[list[float]], seed: int) -> tuple[float, float, float]:
    """Median of every ratio, and the percentile interval of a bootstrap that draws k processes with replacement,
    then each one's ratios with replacement."""
    pooled = [r for ratios in per_process for r in ratios]
    rng = random.Random(seed)
    medians = []
    for _ in range(RESAMPLES):
        drawn = [rng.choice(per_process) for _ in per_process]
        medians.append(statistics.median([r for ratios in drawn for r in rng.choices(ratios, k=len(ratios))]))
    medians.sort()
    tail = (1 - CONFIDENCE) / 2
    return statistics.median(pooled), quantile(medians, tail), quantile(medians, 1 - tail)


def merge_processes(group: Group, results: list[GroupResult], baseline: str) -> GroupResult:
    """The k results of one group as one: each cell's row from the first process it ran ok in (or the first
    process's row if it never did), its timing over every process's samples, its speedup interval two-level.
    The merged samples are each process's in turn (round numbers are no longer shared across cells: a verdict
    compares such cells by their intervals, not round by round)."""
    samples: dict[str, list[list[float]]] = {c.key(): [] for c in group.cells}
    for result in results:
        mine: dict[str, list[float]] = {}
        for key, _round, seconds in result.samples:
            mine.setdefault(key, []).append(seconds)
        for key, values in mine.items():
            samples[key].append(values)
    base = next((c.key() for c in group.cells if is_baseline(c, baseline)), None)
    rows: list[Any] = []
    merged_samples: list[tuple[str, int, float]] = []
    for cell in group.cells:
        key = cell.key()
        candidates = [row for result in results for row in result.rows if row.cell_key == key]
        ok = [row for row in candidates if row.status == "ok"]
        row = ok[0] if ok else candidates[0]
        per_process = [values for values in samples[key] if values]
        if row.status == "ok" and per_process and row.time_median_s is not None:
            pooled = [s for values in per_process for s in values]
            spread = Spread.of(pooled)
            row = replace(row, time_median_s=spread.median, time_p10_s=spread.p10, time_p25_s=spread.p25,
                          time_p75_s=spread.p75, time_p90_s=spread.p90, time_iqr_s=spread.iqr,
                          time_repeats=spread.count)  # fmt: skip
            merged_samples += [(key, index, seconds) for index, seconds in enumerate(pooled)]
            if base is not None and row.speedup is not None:
                ratios = [
                    [b / v for b, v in zip(base_values, own)]
                    for base_values, own in zip(samples[base], samples[key])
                    if base_values and own
                ]
                ratios = [r for r in ratios if r]
                if ratios:
                    estimate, low, high = two_level_interval(ratios, zlib.crc32(key.encode()))
                    row = replace(row, speedup=estimate, speedup_low=low, speedup_high=high, speedup_coverage=None)
        rows.append(replace(row, processes=len(per_process) or 1))
    return GroupResult(rows, merged_samples)
