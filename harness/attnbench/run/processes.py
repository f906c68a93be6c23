"""`--processes k`: one group measured in k fresh worker processes, one after another, and their results merged.

The rounds of one process share more than the machine's moment: its memory layout, where its threads landed,
how its warm-up settled. An audit reported quiet reruns of one cell differing by 1.25× while each run's interval
was ±1.5%: an interval from one process's rounds cannot see that. Measured in k processes, a cell's speedup
interval is a two-level bootstrap: processes resampled with replacement, then each chosen process's rounds, so the
spread between processes enters it. Time statistics come from every process's samples; everything else (error,
memory, flags) from the first process that measured the cell ok.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attnbench.measure.group import GroupResult, is_baseline, timing_fields
from attnbench.plan.cells import Group
from attnbench.stats import Spread, round_ratios, seed_of, two_level_interval


def merge_processes(group: Group, results: list[GroupResult], baseline: str) -> GroupResult:
    """The k results of one group as one: each cell's row from the first process it ran ok in (or the first
    process's row if it never did), its timing over every process's samples, its speedup interval two-level.
    The merged samples are each process's in turn (round numbers are no longer shared across cells: a verdict
    compares such cells by their intervals, not round by round)."""
    # cell key -> its samples in each process, in process order ([] where that process timed none of it)
    samples: dict[str, list[list[float]]] = {c.key(): [[] for _ in results] for c in group.cells}
    for index, result in enumerate(results):
        for key, _round, seconds in result.samples:
            samples[key][index].append(seconds)
    base = next((c.key() for c in group.cells if is_baseline(c, baseline)), None)
    eager_twins = group.eager_twins()
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
            row = replace(row, **timing_fields(spread))
            merged_samples += [(key, index, seconds) for index, seconds in enumerate(pooled)]
            if base is not None and row.speedup is not None:
                # the same process's rounds only: a process where either was not timed has no ratios
                ratios = [round_ratios(b, own) for b, own in zip(samples[base], samples[key]) if b and own]
                if ratios:
                    interval = two_level_interval(ratios, seed_of(key))
                    row = replace(row, speedup=interval.estimate, speedup_low=interval.low,
                                  speedup_high=interval.high, speedup_coverage=None)  # fmt: skip
            twin = eager_twins.get(key)
            if twin is not None and row.compiled_speedup is not None:  # eager over compiled, the same way
                ratios = [round_ratios(e, own) for e, own in zip(samples[twin], samples[key]) if e and own]
                if ratios:
                    interval = two_level_interval(ratios, seed_of(key))
                    row = replace(row, compiled_speedup=interval.estimate, compiled_speedup_low=interval.low,
                                  compiled_speedup_high=interval.high)  # fmt: skip
        rows.append(replace(row, processes=len(per_process) or 1))
    return GroupResult(rows, merged_samples)
