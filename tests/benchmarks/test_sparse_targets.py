"""The sparse variants' speed targets in the pytest-benchmark suite, timed in turns (`choices_targets.py`).

`make benchmark` runs it at N=16384 (about a minute): one benchmark round that times full, band, band with sinks,
Nyströmformer, BigBird and top-k against each other in turns and prints the paired ratios (the table of
`choices_targets.py`), kept in the saved run's extra_info. Targets (issues 25 and 39): sinks <= 1.10x the band,
BigBird >= 8x full, top-k >= 6x full, Nyströmformer >= 15x full. Under --benchmark-disable (`make test`) it runs at
N=512 for a fraction of a second, as a smoke test of the measurement.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from choices_targets import HEADER, in_turns, table_rows  # noqa: E402

from attnbench.stats import paired_speedup  # noqa: E402


def test_sparse_targets_in_turns(benchmark, capsys) -> None:
    n, run_time = (512, 0.05) if benchmark.disabled else (16384, 3.0)
    measured: dict[str, list[float]] = {}

    def measure() -> None:
        measured.update(in_turns(n, run_time))

    benchmark.pedantic(measure, rounds=1, iterations=1)
    ratios = {label: paired_speedup(measured["full"], seconds).estimate for label, seconds in measured.items()}
    assert set(ratios) >= {"band(window=256, sinks=4)", "bigbird", "topk"} and all(r > 0 for r in ratios.values())
    benchmark.extra_info.update({f"speedup vs full: {label}": round(r, 3) for label, r in ratios.items()})
    with capsys.disabled():
        print("\n" + "\n".join(HEADER + table_rows(n, measured)))
