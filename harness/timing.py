"""Wall-clock timing helpers: device sync, median and IQR, and side-by-side calls timed in turns (the comparison
scripts in tests/benchmarks; the harness times its groups in attnbench.measure)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Timing:
    median_s: float
    iqr_s: float
    repeats: int  # measured blocks (each the mean of `number_per_run` calls)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a clock read after a call counts it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timing_of(times: list[float]) -> Timing:
    """Median and interquartile range (linear interpolation) of per-call times in seconds."""
    quartiles = torch.tensor(times, dtype=torch.float64).quantile(torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return Timing(median_s=float(quartiles[1]), iqr_s=float(quartiles[2] - quartiles[0]), repeats=len(times))


def interleaved_samples(
    fns: dict[str, Callable[[], Any]],
    device: torch.device,
    *,
    min_run_time: float = 2.0,
    min_repeats: int = 5,
) -> dict[str, list[float]]:
    """Per-call seconds of several calls, timed in turns (a, b, c, a, b, c, ...): sample i of each is from round i.

    On a shared or thermally throttled machine the speed drifts over seconds; timing each call in its own
    block would give the drift to whichever ran in the slow stretch. In turns, every call sees the same
    stretches. Each call is warmed up first; turns continue until every call has run `min_run_time` seconds
    in all and at least `min_repeats` times.
    """

    def call_and_sync(fn: Callable[[], Any]) -> float:
        start = time.perf_counter()
        fn()
        synchronize(device)
        return time.perf_counter() - start

    for fn in fns.values():
        call_and_sync(fn)  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in fns}
    while min(len(s) for s in samples.values()) < min_repeats or min(sum(s) for s in samples.values()) < min_run_time:
        for name, fn in fns.items():
            samples[name].append(call_and_sync(fn))
    return samples


def time_interleaved(
    fns: dict[str, Callable[[], Any]],
    device: torch.device,
    *,
    min_run_time: float = 2.0,
    min_repeats: int = 5,
) -> dict[str, Timing]:
    """Median and IQR of each of several calls, timed in turns (see `interleaved_samples`)."""
    samples = interleaved_samples(fns, device, min_run_time=min_run_time, min_repeats=min_repeats)
    return {name: timing_of(times) for name, times in samples.items()}
