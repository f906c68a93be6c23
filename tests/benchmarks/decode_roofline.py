"""Decode targets, read from a decode run: each step's time over its bandwidth roofline (the bytes a step must read
over the run's measured memory read bandwidth, and
what it writes over the write bandwidth: `attnbench.report.analysis.step_roofline`; targets: `full` with its KV
cache within 1.5× of it at N >= 8192, `band` and the RNN states within 3×), and the RNN forms' step time flat in N (the log-log slope of the median
step time against N, target about 0).

The figures are the report's own (`RunView`: the run's peaks, raised to the fastest rate a cell reached).
Run: `.venv/bin/attnbench run decode --out results --variants 'full,band(window=256),band(window=256,sinks=4),linear,performer'`
then `.venv/bin/python tests/benchmarks/decode_roofline.py results/<run-id>`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from attnbench.report.view import RunView


def slope(ns: list[int], times: list[float]) -> float:
    """Least-squares slope of log time against log N."""
    xs, ys = [math.log(n) for n in ns], [math.log(t) for t in times]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    view = RunView.read(args.run_dir)
    rows = view.frame[(view.frame["mode"] == "decode") & (view.frame.status == "ok") & view.frame.time_median_s.notna()]
    for key, value in view.peaks.items():
        print(f"{key}: read {value.get('read_bytes_per_s', float('nan')) / 1e9:.1f} GB/s (memory), "
              f"write {value.get('write_bytes_per_s', float('nan')) / 1e9:.1f} GB/s, copy "
              f"{value.get('copy_bytes_per_s', float('nan')) / 1e9:.1f} GB/s")  # fmt: skip
    print("| variant | N | ms per token | MB read per step | GB/s | of roofline |\n|---|---:|---:|---:|---:|---:|")
    for row in rows.sort_values(["label", "seq_len"]).itertuples():
        rate = row.bytes_moved / row.time_median_s / 1e9
        print(f"| {row.label} | {row.seq_len} | {row.time_median_s * 1e3:.3f} | {row.bytes_moved / 1e6:.2f} | "
              f"{rate:.1f} | {row.of_roofline:.0%} |")  # fmt: skip
    print("\n| variant | log-log slope of step time in N (flat: ~0; a cache read whole: ~1) |\n|---|---:|")
    for label, group in rows.groupby("label"):
        if group.seq_len.nunique() > 1:
            group = group.sort_values("seq_len")
            print(f"| {label} | {slope(list(group.seq_len), list(group.time_median_s)):.2f} |")


if __name__ == "__main__":
    main()
