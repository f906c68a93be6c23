"""The one timing loop: several calls timed in turns, the order shuffled each round, until each has its rounds and
its seconds. A group's variants (`attnbench.measure.group`), the model study's exact and swapped forwards and the
comparison scripts in tests/benchmarks all time through it; `attnbench.stats.Spread` summarizes the samples.

On a shared or thermally throttled machine the speed drifts over seconds; timing each call in its own block would
give the drift to whichever ran in the slow stretch. In turns, every call sees the same stretches, and sample i of
each call is from round i, so two calls compare round by round.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any, Callable

import torch

from attnbench.ops import synchronize

MIN_SAMPLE_S = 2e-3  # calls faster than this are timed in blocks, so the clock's resolution does not matter
MAX_BLOCK = 2**31


def timed_call(call: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """One call's result and its seconds, the device synchronized before and after (a first call: its set-up)."""
    synchronize(device)
    start = time.perf_counter()
    result = call()
    synchronize(device)
    return result, time.perf_counter() - start


def clock(call: Callable[[], Any], device: torch.device, number: int = 1) -> float:
    """Seconds for `number` calls in a row, the device synchronized before and after."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(number):
        call()
    synchronize(device)
    return time.perf_counter() - start


def time_in_turns(
    calls: dict[str, Callable[[], Any]],
    device: torch.device,
    *,
    min_rounds: int = 5,
    min_run_time: float = 2.0,
    order_seed: str = "",
    slow_after_s: float = math.inf,
    slow_rounds: int = 3,
    on_step: Callable[[str, str], None] = lambda step, name: None,
    on_failure: Callable[[str, BaseException], None] | None = None,
    before: dict[str, Callable[[int], None]] | None = None,
    max_block: int | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each of `calls`, round by round.

    Each call is warmed up, then timed once to size its block (calls faster than MIN_SAMPLE_S are timed
    in blocks and divided). Rounds go on, in an order shuffled per round from `order_seed` (reproducible), until
    every call has `min_rounds` samples and `min_run_time` seconds; a call slower than `slow_after_s` warm stops at
    `slow_rounds` samples. `on_step(step, name)` is told of each warm-up and timing; a call that raises is dropped
    and passed to `on_failure` (without it, the error propagates). `before[name](number)`, where given, runs untimed
    before each clock of `number` calls of `name` (a decode step sequence restarts from its prefilled state there);
    `max_block` caps the calls in one clock (the steps such a sequence has room for).
    """
    prepare = before or {}
    live = dict(calls)

    def clocked(name: str, number: int = 1) -> float:
        if name in prepare:
            prepare[name](number)
        return clock(live[name], device, number)

    blocks: dict[str, int] = {}
    slow: set[str] = set()
    for name in calls:
        try:
            on_step("warm-up", name)
            clocked(name)  # warm-up
            once = clocked(name)
            blocks[name] = min(max(1, int(MIN_SAMPLE_S / max(once, 1e-9))), max_block or MAX_BLOCK)
            if once > slow_after_s:
                slow.add(name)
        except (Exception, SystemExit) as error:
            if on_failure is None:
                raise
            live.pop(name)
            on_failure(name, error)
    samples: dict[str, list[float]] = {name: [] for name in live}

    def wanted(name: str) -> bool:
        if name in slow:
            return len(samples[name]) < slow_rounds
        enough_time = sum(samples[name]) * blocks[name] >= min_run_time
        return len(samples[name]) < min_rounds or not enough_time

    rng = random.Random(order_seed)
    while any(wanted(name) for name in live):
        order = [name for name in live if wanted(name)]
        rng.shuffle(order)
        for name in order:
            try:
                on_step("timing", name)
                samples[name].append(clocked(name, blocks[name]) / blocks[name])
            except (Exception, SystemExit) as error:
                if on_failure is None:
                    raise
                live.pop(name)
                samples.pop(name)
                on_failure(name, error)
    return samples
