"""Issue 58 (item 2): the RNN states' decode steps fused into one C call each (attnbench.kernels.recurrent_steps)
against their eager PyTorch form (`eager_steps()`), timed in turns at B=1, H=8, D=64, float32, one thread and two.

Per variant and prompt length N: the step's median µs fused and eager, its kernel call alone (one fused step's C call
recorded and replayed: ctypes and the arithmetic, no Python around it), the paired ratio fused / eager (round by
round) with its interval, and the step over its read roofline (the state's `read_bytes` over the machine's measured
read stream, `measure_peaks(streams=True)`) with the read rate it reached. Target: within 3x of that roofline. Before
them, the floor under any fused step: one ctypes call of a kernel with a step's arguments and no rows (argument
conversion and OpenMP's region), the wrapper around it (shapes, strides, the output's allocation), `usable`, and the
`eager_steps` context every timed step here is taken in (fused and eager alike).

Run: `nice -n 10 .venv/bin/python tests/benchmarks/recurrent_step_speed.py [--seq-lens 4096 8192] [--threads 1 2]
[--min-run-time 0.5]`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from attnbench.interface import DecodeState
from attnbench.kernels import eager_steps, recurrent_steps, unavailable_reason, usable
from attnbench.kernels.recurrent_steps import linear_step, step_kernel
from attnbench.measure.machine import measure_peaks
from attnbench.measure.timing import time_in_turns
from attnbench.registry import registry
from attnbench.stats import Spread, paired_speedup

VARIANTS = ("linear", "performer", "retnet", "gla", "deltanet", "gated-deltanet")
BATCH, HEADS, HEAD_DIM = 1, 8, 64
TOKENS = 64  # distinct step tokens, cycled: each step reads a new q, k, v as a generation does
TARGET = 3.0  # issue 58: within 3x of the read roofline
CPU = torch.device("cpu")


class Stepper:
    """One variant's generation from a prefilled state: each call steps the next token (cycled, sliced beforehand as
    the harness's `Generation` slices it), in its own form (fused, or eager under `eager_steps()`; the context entered
    for both, so both pay for it), the state carried from call to call."""

    def __init__(self, variant: Any, state: DecodeState, tokens: list[tuple[torch.Tensor, ...]], eager: bool):
        self.variant, self.state, self.tokens, self.eager, self.done = variant, state, tokens, eager, 0

    def __call__(self) -> torch.Tensor:
        token = self.tokens[self.done % TOKENS]
        with eager_steps(self.eager):
            out, self.state = self.variant.step(self.state, *token)
        self.done += 1
        return out


class Recorded:
    """One fused step's kernel call, its arguments recorded (`recurrent_steps.step_kernel` wrapped for that step) and
    replayed: the C call alone, ctypes and arithmetic, no Python around it. The state and the output it writes are
    held here, so the recorded pointers stay valid; each replay steps the same token again."""

    def __init__(self, variant: Any, state: DecodeState, token: tuple[torch.Tensor, ...]):
        real, seen = recurrent_steps.step_kernel, []

        def recording(name: str) -> Callable[..., None]:
            function = real(name)
            return lambda *args: seen.append((function, args)) or function(*args)

        recurrent_steps.step_kernel = recording
        try:
            self.out, self.state = variant.step(state, *token)
        finally:
            recurrent_steps.step_kernel = real
        (self.function, self.args), = seen
        self.token = token

    def __call__(self) -> None:
        self.function(*self.args)


def steppers(n: int) -> tuple[dict[str, Callable[[], Any]], dict[str, int]]:
    """Each variant's fused and eager steppers after a prompt of n positions, its kernel call alone, and its state's
    read bytes."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(BATCH, HEADS, n + TOKENS, HEAD_DIM, generator=generator) for _ in range(3))
    tokens = [tuple(x[:, :, n + t : n + t + 1] for x in (q, k, v)) for t in range(TOKENS)]
    calls: dict[str, Callable[[], Any]] = {}
    read: dict[str, int] = {}
    for name in VARIANTS:
        variant = registry.create(name)
        _, state = variant.prefill(q[:, :, :n], k[:, :, :n], v[:, :, :n])
        calls[f"{name} fused"] = Stepper(variant, state.clone(), tokens, eager=False)
        calls[f"{name} eager"] = Stepper(variant, state.clone(), tokens, eager=True)
        calls[f"{name} kernel alone"] = Recorded(variant, state.clone(), tokens[0])
        read[name] = state.read_bytes
    return calls, read


def floor_calls() -> dict[str, Callable[[], Any]]:
    """What any fused step costs before its arithmetic: linear's kernel called with no rows (B = 0), raw and through
    its wrapper, and the `usable` check."""
    q, k, v = (torch.zeros(0, HEADS, 1, HEAD_DIM) for _ in range(3))
    state = torch.zeros(0, HEADS, HEAD_DIM, HEAD_DIM + 1)
    token = torch.zeros(BATCH, HEADS, 1, HEAD_DIM)
    raw = step_kernel("linear_step")
    pointers = [x.data_ptr() for x in (q, k, v, state, q)]
    strides = (*q.stride()[:2], *k.stride()[:2], *v.stride()[:2], *state.stride()[:3])
    return {
        "ctypes call, no rows": lambda: raw(*pointers, 0, HEADS, HEAD_DIM, HEAD_DIM, *strides, torch.get_num_threads()),
        "wrapper, no rows": lambda: linear_step(q, k, v, state),
        "usable(q, k, v, state)": lambda: usable(token, token, token, state),
        "eager_steps(False) context": entered,
    }


def entered() -> None:
    """The context each timed step (fused and eager alike) is taken in."""
    with eager_steps(False):
        pass


def report(threads: int, n: int, samples: dict[str, list[float]], read: dict[str, int], bandwidth: float) -> None:
    print(f"\n### {threads} thread(s), N={n}, B={BATCH}, H={HEADS}, D={HEAD_DIM}, float32")
    print("| variant | fused µs | its kernel call alone µs | eager µs | fused / eager [95%] | state read KiB | "
          "read roofline µs | fused / roofline | fused GB/s |")  # fmt: skip
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for name in VARIANTS:
        fused, eager = samples[f"{name} fused"], samples[f"{name} eager"]
        ratio = paired_speedup(fused, eager)  # the median over rounds of fused / eager
        median = Spread.of(fused).median
        roofline = read[name] / bandwidth
        alone = Spread.of(samples[f"{name} kernel alone"]).median
        print(f"| {name} | {median * 1e6:.1f} | {alone * 1e6:.1f} | {Spread.of(eager).median * 1e6:.1f} | "
              f"{ratio.estimate:.3f} [{ratio.low:.3f}–{ratio.high:.3f}] | {read[name] / 2**10:.0f} | "
              f"{roofline * 1e6:.2f} | {median / roofline:.1f}{'' if median / roofline <= TARGET else ' (> 3)'} | "
              f"{read[name] / median / 1e9:.1f} |")  # fmt: skip


@torch.no_grad()
def measure(threads: int, seq_lens: list[int], min_run_time: float, bandwidth: float) -> None:
    """The floor, then each N's steps, timed in turns with `threads` threads."""
    torch.set_num_threads(threads)
    floors = time_in_turns(floor_calls(), CPU, min_rounds=15, min_run_time=min_run_time, order_seed="floor")
    print(f"\n### the floor under a fused step, {threads} thread(s): median µs")
    print(" | ".join(f"{name}: {Spread.of(values).median * 1e6:.2f}" for name, values in floors.items()))
    for n in seq_lens:
        calls, read = steppers(n)
        samples = time_in_turns(calls, CPU, min_rounds=15, min_run_time=min_run_time, order_seed=f"{n}")
        report(threads, n, samples, read, bandwidth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--min-run-time", type=float, default=0.5, help="seconds of samples per call and setting")
    args = parser.parse_args()
    if unavailable_reason() is not None:
        raise SystemExit(f"the kernels are unavailable: {unavailable_reason()}")
    peaks = measure_peaks("cpu", torch.float32, streams=True)
    bandwidth = peaks["read_bytes_per_s"]
    print(f"read stream {bandwidth / 1e9:.1f} GB/s ({peaks['read_mib']} MiB), copy "
          f"{peaks['copy_bytes_per_s'] / 1e9:.1f} GB/s; read roofline = state.read_bytes / read stream (the state's "
          "in-place write not counted)")  # fmt: skip
    for threads in args.threads:
        measure(threads, args.seq_lens, args.min_run_time, bandwidth)


if __name__ == "__main__":
    main()
