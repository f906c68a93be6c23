"""Issue 58's forward speed goals, measured in one run, in turns: each variant's speedup over `full` (fused SDPA).

One full-sequence call, float32, B=1, H=8, D=64, on the CPU, at N=16384 (by default), each against `full` under the
same masking: `strided` (its default pattern, causal) >= 8x, `performer` (defaults, causal) >= 20x, `bigbird`
(defaults) >= 8x, bidirectional (BigBird refuses causal: its decoder uses full attention). Each ratio is the median
over rounds of full's time / the variant's, paired within a round, with its order-statistic interval
(`attnbench.stats.paired_speedup`).

Run: `nice -n 10 .venv/bin/python tests/benchmarks/forward_speed_goals.py [--seq-len 16384] [--min-run-time 20]
[--threads 2]` (about a minute and a half at N=16384 on 2 cores: a causal full call takes ~1.5 s). The load average
is printed before and after: on a shared machine another process on a core stalls every multi-threaded kernel call
of ours at its barrier, which costs the variants (tens to hundreds of calls) far more than full (one); one thread
(`--threads 1`) is not stalled that way.
"""

from __future__ import annotations

import argparse
import os

import torch
from attnbench.measure.machine import warm_allocator
from attnbench.measure.timing import time_in_turns
from attnbench.registry import registry
from attnbench.stats import Spread, paired_speedup

GOALS = {  # variant -> (causal, at least this many times faster than full)
    "strided": (True, 8.0),
    "performer": (True, 20.0),
    "bigbird": (False, 8.0),
}


def in_turns(n: int, min_run_time: float) -> dict[str, list[float]]:
    """Per-call seconds, round by round, of full (causal and not) and each goal's variant at N=n, in turns."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64, generator=generator) for _ in range(3))
    full = registry.create("full")
    calls = {f"full(causal={causal})": (lambda c=causal: full(q, k, v, causal=c)) for causal in (True, False)}
    for name, (causal, _) in GOALS.items():
        variant = registry.create(name)
        calls[name] = lambda variant=variant, causal=causal: variant(q, k, v, causal=causal)
    with torch.no_grad(), warm_allocator():
        return time_in_turns(calls, torch.device("cpu"), min_rounds=7, min_run_time=min_run_time)


def table(n: int, samples: dict[str, list[float]]) -> list[str]:
    """Markdown rows: per variant its median, full's, the paired speedup with its interval, and its goal."""
    rows = ["| N | variant | causal | ms (median) | full ms | speedup vs full [95%] | goal |", "|---" * 7 + "|"]
    for name, (causal, bound) in GOALS.items():
        baseline = samples[f"full(causal={causal})"]
        ratio = paired_speedup(baseline, samples[name])
        verdict = "met" if ratio.estimate >= bound else "not met"
        rows.append(
            f"| {n} | {name} | {causal} | {Spread.of(samples[name]).median * 1e3:.1f} | "
            f"{Spread.of(baseline).median * 1e3:.0f} | {ratio.estimate:.2f} [{ratio.low:.2f}–{ratio.high:.2f}] | "
            f">= {bound:g}x: {verdict} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--min-run-time", type=float, default=20.0, help="seconds of samples per call, at least")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads={torch.get_num_threads()}, load average before: {os.getloadavg()[0]:.2f}")
    rows = table(args.seq_len, in_turns(args.seq_len, args.min_run_time))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
