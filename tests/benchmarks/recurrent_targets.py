"""Issue 37's speed targets for the gated and delta-rule linear attentions (retnet, gla, deltanet, gated-deltanet).

1. `--speed`: the chunkwise forward at N=16384 (causal, float32, B=1, H=8, D=64) against our `linear` (elu + 1) at
   the same shape, timed in turns: each one's median and the paired ratio (this / linear, round by round) with its
   order-statistic interval. Target: <= 1.5.
2. `--run RUN_DIR`: from a run (the `recurrent` preset, and/or `decode`): per variant and mode, the log-log slope of
   time and of memory against N (target: about 1 for the forward from 1K to 16K; about 0, flat, for a decode step
   and its state), and the time over roofline at the largest N (the report's own figure; 1 is the limit).

Run: `.venv/bin/python tests/benchmarks/recurrent_targets.py --speed [--seq-len 16384] [--min-run-time 3]`;
`.venv/bin/attnbench run recurrent --out results` then `... --run results/<run-id>`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd
import torch
from attnbench.measure.timing import time_in_turns
from attnbench.registry import registry
from attnbench.report.view import RunView
from attnbench.stats import Spread, paired_speedup

RECURRENCES = ("retnet", "gla", "deltanet", "gated-deltanet")
TARGET = 1.5


def speed(n: int, min_run_time: float) -> None:
    variants = {name: registry.create(name) for name in ("linear", *RECURRENCES)}
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64, generator=generator) for _ in range(3))
    with torch.no_grad():
        calls = {name: (lambda variant=variant: variant(q, k, v, causal=True)) for name, variant in variants.items()}
        samples = time_in_turns(calls, torch.device("cpu"), min_rounds=9, min_run_time=min_run_time)
    print(f"N={n}, causal, float32, B=1, H=8, D=64; linear {Spread.of(samples['linear']).median * 1e3:.1f} ms")
    print("| variant | ms | this / linear, paired [95% interval] | within 1.5× |")
    print("|---|---|---|---|")
    for name in RECURRENCES:
        ratio = paired_speedup(samples[name], samples["linear"])  # the median over rounds of this / linear
        median = Spread.of(samples[name]).median
        print(f"| {name} | {median * 1e3:.1f} | {ratio.estimate:.2f} [{ratio.low:.2f}–{ratio.high:.2f}] | "
              f"{'yes' if ratio.estimate <= TARGET else 'no'} |")  # fmt: skip


def slope(values: pd.Series) -> float:
    """The least-squares slope of log(value) against log(N)."""
    values = values[values > 0]
    if len(values) < 2:
        return float("nan")
    xs, ys = [math.log(n) for n in values.index], [math.log(v) for v in values]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread


def run_table(run_dir: Path) -> None:
    frame = RunView.read(run_dir).frame
    ok = frame[frame.status == "ok"]
    print("| variant | mode | N | time slope | memory slope (peak; decode: the state) | time / roofline at largest N |")
    print("|---|---|---|---|---|---|")
    for (label, mode), rows in ok.groupby(["label", "mode"], sort=False):
        by_n = rows.groupby("seq_len")
        memory = "cache_bytes" if mode == "decode" else "peak_mem_bytes"
        largest = rows.loc[rows.seq_len.idxmax()]
        over = 1 / largest.of_roofline if pd.notna(largest.of_roofline) and largest.of_roofline else float("nan")
        print(f"| {label} | {mode} | {rows.seq_len.min()}–{rows.seq_len.max()} | "
              f"{slope(by_n.time_median_s.median()):.2f} | {slope(by_n[memory].median()):.2f} | {over:.2f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", action="store_true", help="time the four against linear in turns")
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--min-run-time", type=float, default=3.0)
    parser.add_argument("--run", type=Path, help="a run folder: slopes and time over roofline by variant and mode")
    args = parser.parse_args()
    if not args.speed and args.run is None:
        parser.error("give --speed, --run RUN_DIR, or both")
    if args.speed:
        speed(args.seq_len, args.min_run_time)
    if args.run is not None:
        run_table(args.run)


if __name__ == "__main__":
    main()
