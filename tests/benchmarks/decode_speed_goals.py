"""Issue 58's decode goals, measured in one run, in turns: each KV method's step, fused (`attnbench.kernels`) and
eager (`eager_steps`), beside `full`'s step, at contexts of N; float32, B=1, H=8, D=64, CPU.

Printed per method and N: µs per step (median), MB a step reads (`read_bytes`), achieved GB/s and its share of the
machine's measured read bandwidth (a stream past the last-level cache), and the goals' ratios:
- `/share`: the step's time over (the share of full's bytes it reads × full's step time, fused, paired per round);
  goal <= 1.5 at N >= 4K for every KV method;
- `/roofline`: the step's time over its read roofline (bytes / read bandwidth); goal <= 2 for Quest (`topk`) and
  H2O at 8K and 16K (the RNN steps, goal <= 3: tests/benchmarks/recurrent_step_speed.py);
- `fused/eager`: what the fused form does, paired per round.

Run: `.venv/bin/python tests/benchmarks/decode_speed_goals.py [--seq-lens 4096,8192,16384] [--threads N]
[--variants 'topk,h2o,...'] [--min-run-time 1]`; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from attnbench.interface import DecodeState
from attnbench.kernels import eager_steps, unavailable_reason
from attnbench.measure.machine import measure_peaks
from attnbench.measure.timing import time_in_turns
from attnbench.plan.cells import Spec
from attnbench.registry import registry
from attnbench.stats import paired_speedup

NEEDS_A_MODEL = ("kvzip",)  # its scores come from a pass of the model (attnbench generate)


def kv_methods() -> str:
    """Every decoding method that reads a cache of positions (the goal's 'every KV method'), StreamingLLM's ring too."""
    names = [name for name in registry.names() if registry.load(name).decodes() and name not in NEEDS_A_MODEL
             and registry.load(name).family in ("kv-cache", "block-sparse", "band", "strided")]  # fmt: skip
    return ",".join(["band(window=256,sinks=4)" if name == "band" else name for name in names] + ["band(window=256)"])

STEPS = 64  # steps a sequence takes before it restarts from a copy of its prefilled state (untimed)


def stepper(variant, state: DecodeState, q, k, v, n: int, eager: bool) -> Callable[[], None]:
    """One step per call from a copy of `state`, restarted (untimed by `before`) when out of room."""
    live = {"state": state.clone(), "done": 0}

    def call() -> None:
        t = n + live["done"]
        live["done"] += 1
        with torch.no_grad(), eager_steps(eager):
            live["state"] = variant.step(live["state"], q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])[1]

    def before(number: int) -> None:
        if live["done"] + number > STEPS:
            live["state"], live["done"] = state.clone(), 0

    return call, before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default="4096,8192,16384")
    parser.add_argument("--variants", default="", help="comma-separated settings (default: every KV method)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default; 1 on a busy machine)")
    parser.add_argument("--min-run-time", type=float, default=1.0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if unavailable_reason():
        print(f"kernels unavailable: {unavailable_reason()}: the fused rows are the eager form")
    peak = measure_peaks("cpu", torch.float32, streams=True)
    read = peak["read_bytes_per_s"]
    print(f"threads {torch.get_num_threads()}; read bandwidth {read / 1e9:.1f} GB/s (a stream past the last-level cache)\n")
    print("| method | N | µs fused | µs eager | MB read | GB/s | of read bw | /share | /roofline | fused/eager |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in [int(x) for x in args.seq_lens.split(",")]:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 8, n + STEPS, 64) for _ in range(3))
        settings = Spec.parse("full," + (args.variants or kv_methods()))
        calls, before, reads = {}, {}, {}
        for spec in settings:
            variant, label = registry.create(spec.name, **dict(spec.params)), spec.label()
            with torch.no_grad():
                state = variant.prefill_state(q[:, :, :n], k[:, :, :n], v[:, :, :n], room=STEPS)
            for eager in (False, True):
                key = (label, eager)
                calls[key], before[key] = stepper(variant, state, q, k, v, n, eager)
            reads[label] = state.read_bytes
        keyed = {f"{label}|{eager}": call for (label, eager), call in calls.items()}
        samples = time_in_turns(keyed, torch.device("cpu"), min_rounds=20, min_run_time=args.min_run_time,
                                before={f"{label}|{eager}": b for (label, eager), b in before.items()},
                                max_block=STEPS)  # fmt: skip
        full = samples["full|False"]
        for label in reads:
            fused, eager = samples[f"{label}|False"], samples[f"{label}|True"]
            median = statistics.median(fused)
            share = reads[label] / reads["full"]
            over_share = paired_speedup([f * share for f in full], fused)  # (share x full) / step: 1/x is /share
            speedup = paired_speedup(eager, fused)
            print(f"| {label} | {n} | {median * 1e6:.0f} | {statistics.median(eager) * 1e6:.0f} | "
                  f"{reads[label] / 1e6:.2f} | {reads[label] / median / 1e9:.1f} | {reads[label] / median / read:.0%} | "
                  f"{1 / over_share.estimate:.2f} | {median / (reads[label] / read):.1f} | "
                  f"{1 / speedup.estimate:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
