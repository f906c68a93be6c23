"""Issue 36's decode targets, read from a decode run: each step's time over its bandwidth roofline (the bytes a step
must read and write over the run's measured copy bandwidth; target: `full` with its KV cache and `band` within 2× of
it, i.e. of roofline >= 50%, at N >= 8192), and the RNN forms' step time flat in N (the log-log slope of the median
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
    rows = view.frame[(view.frame["mode"] == "decode") & (view.frame.status == "ok")]
    peak = {key: value.get("copy_bytes_per_s") for key, value in view.peaks.items()}
    print(f"copy bandwidth (raised to the fastest a cell read): " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in peak.items()))
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
