"""`--processes K`: a group measured in K fresh worker processes, merged; the spread between processes in the
interval (issue 23, item 5)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from attnbench.cli import main
from attnbench.measure.group import GroupResult
from attnbench.plan.config import parse_config
from attnbench.run.processes import merge_processes
from attnbench.runfolder.folder import read_samples
from attnbench.runfolder.results import read_results
from attnbench.runfolder.rows import row_for
from attnbench.stats import median_interval, two_level_interval


def test_the_spread_between_processes_widens_the_interval_where_rounds_alone_do_not() -> None:
    """Three processes whose rounds are tight (±1%) but whose levels differ (1.0, 1.1, 1.25: what quiet reruns of
    one cell showed): one process's order-statistic interval is ±1%; the two-level interval spans the levels."""
    rng = random.Random(0)
    levels = (1.0, 1.1, 1.25)
    per_process = [[level * rng.uniform(0.99, 1.01) for _ in range(9)] for level in levels]
    alone = median_interval(per_process[0])
    assert alone.high - alone.low < 0.03
    interval = two_level_interval(per_process, seed=1)
    estimate, low, high = interval.estimate, interval.low, interval.high
    assert low <= 1.01 and high >= 1.24 and low <= estimate <= high
    assert two_level_interval(per_process, seed=1) == interval  # seeded: the same interval


def test_merge_pools_each_cells_samples_and_keeps_the_first_ok_row() -> None:
    config = parse_config({"variants": ["full", "band"], "seq_lens": [16], "heads": 1, "head_dim": 8})
    (group,) = config.plan().groups
    full, band = (cell.key() for cell in group.cells)

    def process(level: float, band_ok: bool = True) -> GroupResult:
        rows = [row_for(group.cells[0], time_median_s=1e-3, speedup=1.0, speedup_low=1.0, speedup_high=1.0),
                row_for(group.cells[1], time_median_s=5e-4 * level, speedup=2.0, speedup_low=1.9, speedup_high=2.1,
                        status="ok" if band_ok else "error")]  # fmt: skip
        samples = [(full, r, 1e-3) for r in range(5)] + [(band, r, 5e-4 * level) for r in range(5)]
        return GroupResult(rows, samples if band_ok else samples[:5])

    merged = merge_processes(group, [process(1.0, band_ok=False), process(1.0), process(1.2)], "full")
    by_key = {row.cell_key: row for row in merged.rows}
    assert by_key[band].status == "ok" and by_key[band].time_repeats == 10  # two processes measured it
    assert by_key[band].processes == 2 and by_key[full].processes == 3
    assert by_key[band].speedup_low <= 1 / 0.6 < 1 / 0.5 <= by_key[band].speedup_high  # both levels inside
    assert sum(1 for key, _, _ in merged.samples if key == band) == 10


@pytest.mark.slow
def test_a_run_with_processes_measures_every_cell_in_each_and_says_which_interval(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('variants = ["full", "band"]\nseq_lens = [16]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.02\n')
    assert main(["run", str(config), "--processes", "2", "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    (run,) = (tmp_path / "out").iterdir()
    frame = read_results(run)
    assert (frame.processes == 2).all() and (frame.status == "ok").all()
    samples = read_samples(run)
    assert all(len(samples[row.cell_key]) == row.time_repeats >= 18 for row in frame.itertuples())  # 9 rounds × 2
    assert "two-level bootstrap 95% interval over its 2 worker processes" in (run / "summary.md").read_text()
    assert main(["run", str(config), "--processes", "0", "--out", str(tmp_path / "bad")]) == 2


def test_a_cell_missing_from_one_process_is_paired_with_its_own_processes_baseline() -> None:
    """Each process's ratios come from that process's rounds: band timed in processes 2 and 3 only is divided by
    the baseline of processes 2 and 3, never shifted onto process 1's."""
    config = parse_config({"variants": ["full", "band"], "seq_lens": [16], "heads": 1, "head_dim": 8})
    (group,) = config.plan().groups
    full, band = (cell.key() for cell in group.cells)

    def process(full_s: float, band_s: float | None) -> GroupResult:
        rows = [row_for(group.cells[0], time_median_s=full_s, speedup=1.0),
                row_for(group.cells[1], time_median_s=band_s, speedup=2.0, status="ok" if band_s else "error")]
        samples = [(full, r, full_s) for r in range(5)] + ([(band, r, band_s) for r in range(5)] if band_s else [])
        return GroupResult(rows, samples)  # fmt: skip

    merged = merge_processes(group, [process(4e-3, None), process(1e-3, 5e-4), process(1e-3, 5e-4)], "full")
    row = next(row for row in merged.rows if row.cell_key == band)
    assert (row.speedup, row.speedup_low, row.speedup_high) == (2.0, 2.0, 2.0)  # 1e-3 / 5e-4 in both processes
