"""Side by side: our `performer` against performer-pytorch's FastAttention, same m, one process.

    make compare-performer     # installs performer-pytorch into .venv (comparison only) and runs this
    python tests/benchmarks/compare_performer.py --seq-len 16384 --features 256

Non-causal and causal, forward, float32, B=1, H=8, D=64, on the CPU, default gaussian input; error
against exact softmax attention (err vs uniform: 0 exact, 1 = uniform averaging). The two are timed in
turns (`attnbench.measure.timing.time_in_turns`), so a slow stretch of the machine falls on both alike.
performer-pytorch's causal form without its CUDA kernel is a cumulative sum of N outer products (its memory
grows as N*m*D).
"""

from __future__ import annotations

import argparse
import sys

import torch
from attnbench.inputs.catalogue import make_inputs
from attnbench.measure.machine import warm_allocator
from attnbench.measure.metrics import error_metrics
from attnbench.measure.reference import exact_reference
from attnbench.measure.timing import time_in_turns
from attnbench.registry import registry
from attnbench.stats import Spread


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--causal-seq-len", type=int, default=4096, help="N for the causal comparison")
    parser.add_argument("--min-run-time", type=float, default=2.0)
    args = parser.parse_args()
    try:
        from performer_pytorch import FastAttention
    except ImportError:
        print("performer-pytorch is not installed: run `make compare-performer` (a comparison-only dependency)")
        return 2
    with warm_allocator():  # timed warm, as in a run
        cpu = torch.device("cpu")
        print(f"H={args.heads}, D={args.head_dim}, m={args.features}, threads={torch.get_num_threads()}")
        print("| N | causal | implementation | time ms (median ± IQR) | ours faster by | err vs uniform |")
        print("|---|---|---|---|---|---|")
        for n, causal in ((args.seq_len, False), (args.causal_seq_len, True)):
            inputs = make_inputs(
                "gaussian",
                {},
                batch=1,
                heads=args.heads,
                seq_len=n,
                head_dim=args.head_dim,
                dtype=torch.float32,
                device=cpu,
                seed=0,
            )
            q, k, v = inputs.q, inputs.k, inputs.v
            theirs = FastAttention(dim_heads=args.head_dim, nb_features=args.features, causal=causal).eval()
            ours = registry.create("performer", features=args.features)
            with torch.no_grad():
                reference = exact_reference(q, k, v, causal=causal, key_padding_mask=None)
                calls = {
                    "performer-pytorch FastAttention": lambda: theirs(q, k, v),
                    "attnbench performer": lambda: ours(q, k, v, causal=causal),
                }
                samples = time_in_turns(calls, cpu, min_run_time=args.min_run_time)
                timings = {label: Spread.of(seconds) for label, seconds in samples.items()}
                rows = [(label, timings[label], error_metrics(fn(), reference)) for label, fn in calls.items()]
            for label, timing, error in rows:
                ratio = rows[0][1].median / rows[1][1].median
                print(
                    f"| {n} | {causal} | {label} | {timing.median * 1e3:.1f} ± {timing.iqr * 1e3:.1f} | "
                    f"{ratio:.2f}× | {error.vs_uniform:.3f} |"
                )
        return 0


if __name__ == "__main__":
    sys.exit(main())
