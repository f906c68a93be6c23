"""Wall-clock time of one call with torch.utils.benchmark: warm-up, device sync, repeats, median and IQR."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils import benchmark


@dataclass(frozen=True)
class Timing:
    median_s: float
    iqr_s: float
    repeats: int  # measured blocks (each the mean of `number_per_run` calls)


def time_call(
    fn: Callable[[], Any],
    device: torch.device,
    *,
    min_run_time: float = 0.2,
    min_repeats: int = 3,
    threads: int | None = None,
) -> Timing:
    """Median and IQR of `fn()`, synchronizing the device after each call so its time is counted.

    Fast calls are grouped in blocks (blocked_autorange); slow ones are still repeated `min_repeats`
    times so that every figure comes with a spread.
    """

    def call_and_sync() -> None:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    call_and_sync()  # warm-up: lazy init, allocator growth, kernel selection
    timer = benchmark.Timer(
        stmt="call_and_sync()",
        globals={"call_and_sync": call_and_sync},
        num_threads=threads or torch.get_num_threads(),
    )
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    times = list(measurement.times)
    while len(times) < min_repeats:
        times.extend(timer.timeit(number=1).times)
    merged = benchmark.Measurement(number_per_run=1, raw_times=times, task_spec=measurement.task_spec)
    return Timing(median_s=merged.median, iqr_s=merged.iqr, repeats=len(times))
