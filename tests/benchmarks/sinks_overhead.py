"""What attention sinks cost a band: band(window=256, sinks=4) against band(window=256), timed in turns.

Issue 25's target: sinks cost at most 10% more than the same band (fwd, float32, B=1, H=8, D=64, this CPU). Prints,
per N, each one's median time and the paired ratio (sinks / plain, round by round) with its order-statistic
interval. Run: `.venv/bin/python tests/benchmarks/sinks_overhead.py [--seq-lens 4096,16384] [--min-run-time 3]`.
"""

from __future__ import annotations

import argparse

import torch
from attnbench.measure.timing import time_in_turns
from attnbench.registry import registry
from attnbench.stats import Spread, paired_speedup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default="4096,16384")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--min-run-time", type=float, default=3.0)
    args = parser.parse_args()
    plain = registry.create("band", window=args.window)
    sunk = registry.create("band", window=args.window, sinks=args.sinks)
    print(f"| N | band ms | band + {args.sinks} sinks ms | sinks / plain, paired [95% interval] |")
    print("|---|---|---|---|")
    for n in (int(x) for x in args.seq_lens.split(",")):
        generator = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 8, n, 64, generator=generator) for _ in range(3))
        with torch.no_grad():
            calls = {"plain": lambda: plain(q, k, v), "sinks": lambda: sunk(q, k, v)}
            samples = time_in_turns(calls, torch.device("cpu"), min_rounds=9, min_run_time=args.min_run_time)
        ratio = paired_speedup(samples["sinks"], samples["plain"])  # the median over rounds of sinks' / plain's time
        a, b = Spread.of(samples["plain"]).median, Spread.of(samples["sinks"]).median
        print(f"| {n} | {a * 1e3:.1f} | {b * 1e3:.1f} | {ratio.estimate:.3f} [{ratio.low:.3f}–{ratio.high:.3f}] |")


if __name__ == "__main__":
    main()
