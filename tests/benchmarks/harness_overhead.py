"""Does the harness add to a call's time? The same three calls timed through a run's measurement (`InProcess`, the
executor `attnbench run` uses: time_median_s of the cell) and alone on the main thread (a plain loop of
perf_counter around each call, after a warm-up, under the same allocator policy), in turns, several rounds; the goal: the harness's median
within 10% (or 10 µs) of the plain one's.

- a sub-millisecond decode step: band(window=256) at N=2048 (mode decode: one token against its ring);
- a 16K chunkwise delta-rule forward: deltanet, causal, N=16384;
- a ~1 ms call: full, causal, N=512.
B=1, H=8, D=64, float32, CPU. Run: `.venv/bin/python tests/benchmarks/harness_overhead.py [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from attnbench.inputs.catalogue import make_inputs
from attnbench.measure.machine import warm_allocator
from attnbench.plan.config import parse_config
from attnbench.registry import registry
from attnbench.run.executors import InProcess

CALLS = {  # name -> (variant, its hyperparameters, N, mode)
    "band(window=256) decode step, N=2048": ("band", {"window": 256}, 2048, "decode"),
    "deltanet forward, causal, N=16384": ("deltanet", {}, 16384, "fwd"),
    "full forward, causal, N=512": ("full", {}, 512, "fwd"),
}
SHAPE = {"batch": 1, "heads": 8, "head_dim": 64}


def through_the_harness(name: str, params: dict, n: int, mode: str, min_run_time: float) -> float:
    """The cell's median seconds as a run measures it (warm-up, rounds, in this process on the main thread)."""
    spec = {"name": name, **params}
    config = parse_config({"variants": [spec], "seq_lens": [n], "causal": True, "mode": mode, "error": False,
                           "min_run_time": min_run_time, "min_rounds": 9, "time_budget_s": 60.0, **SHAPE})  # fmt: skip
    [group] = config.plan().groups
    [row] = InProcess(config.settings, registry).run_group(group).rows
    assert row.status == "ok", row.reason
    return row.time_median_s


def alone(name: str, params: dict, n: int, mode: str, min_run_time: float) -> float:
    """The same call's median seconds in a plain loop on the main thread."""
    variant = registry.create(name, **params)
    steps = 16
    inputs = make_inputs("realistic", {}, seq_len=n + (steps if mode == "decode" else 0), dtype=torch.float32,
                         device=torch.device("cpu"), seed=0, causal=True, **SHAPE)  # fmt: skip
    q, k, v = inputs.q, inputs.k, inputs.v
    if mode == "decode":
        prefilled = variant.prefill_state(q[:, :, :n], k[:, :, :n], v[:, :, :n])
        state, done = prefilled.clone(), 0

        def call() -> None:
            nonlocal state, done
            if done == steps:
                state, done = prefilled.clone(), 0
            t = n + done
            with torch.no_grad():
                _, state = variant.step(state, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
            done += 1
    else:

        def call() -> None:
            with torch.no_grad():
                variant(q, k, v, causal=True)

    return median_of(call, min_run_time)


def median_of(call: Callable[[], None], min_run_time: float, min_rounds: int = 9) -> float:
    """The median of `call`'s times, under the allocator policy a run times with (`warm_allocator`: glibc keeps
    freed memory, as a warm loop's allocator does; this compares the harness, not two allocators)."""
    times: list[float] = []
    with warm_allocator():
        for _ in range(3):  # warm-up
            call()
        started = time.perf_counter()
        while len(times) < min_rounds or time.perf_counter() - started < min_run_time:
            begin = time.perf_counter()
            call()
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the two ways, in turns (default 5)")
    parser.add_argument("--min-run-time", type=float, default=0.3, help="seconds of timing per measurement")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| call | harness (median of rounds) | alone on the main thread | ratio | difference | within 10% or 10 µs |")
    print("|---|---:|---:|---:|---:|---|")
    for label, (name, params, n, mode) in CALLS.items():
        harness, plain = [], []
        for round_ in range(args.rounds):  # in turns, the order alternating
            ways = [(harness, through_the_harness), (plain, alone)]
            for found, way in ways if round_ % 2 == 0 else ways[::-1]:
                found.append(way(name, params, n, mode, args.min_run_time))
        h, p = statistics.median(harness), statistics.median(plain)
        ok = h <= 1.10 * p or h - p <= 10e-6
        print(f"| {label} | {h * 1e6:,.0f} µs | {p * 1e6:,.0f} µs | {h / p:.2f} | {(h - p) * 1e6:+,.0f} µs | "
              f"{'yes' if ok else 'NO'} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
