"""How many torch threads a group is timed with: the user's count, or as many as the idle cores hold.

A call split over k threads ends when the last of them does. Where another process holds a core, one of the
threads waits for the scheduler (milliseconds) at every parallel kernel, and a small call then costs about that
wait whatever its work: decode steps at N=2048 on 2 cores under load took ~24 ms for `full`, `band(window=256)` and
`linear` alike, 200x band's 118 µs on a quiet core. So where the user sets no `threads`, each timed group takes the
cores other processes left idle, watched for IDLE_WINDOW_S just before it (the noise flag's measure, /proc/stat).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from attnbench.measure.machine import usable_cores
from attnbench.measure.noise import LoadWatch

IDLE_WINDOW_S = 0.1  # how long the other processes' load is watched before a group (/proc/stat counts 10 ms ticks: 5% of 2 cores)
RECENT_S = 1.0  # a load watched over a window that ended this recently (the previous group) stands for a new watch
TORCH_DEFAULT_THREADS = torch.get_num_threads()  # torch's own count (its physical cores, or OMP_NUM_THREADS)
RULE = (f"the machine's cores minus the cores' worth other processes used in the {IDLE_WINDOW_S:g} s before each timed "
        "group, rounded, from 1 to torch's default")  # fmt: skip


@dataclass(frozen=True)
class ThreadChoice:
    """The threads a group is timed with, and why: set by the user, or fitted to the idle cores."""

    threads: int
    why: str
    chosen: bool  # True: fitted here; False: the user's `threads` (never changed by the harness)
    competing: float | None = None  # cores' worth other processes used while it was chosen (None: not watched)

    def as_meta(self) -> dict[str, Any]:
        return asdict(self)


def choose_threads(requested: int, competing: float | None, cores: int, ceiling: int) -> ThreadChoice:
    """The rule, on its figures: `requested` (> 0) always wins; else `cores` minus `competing` cores' worth of other
    processes, rounded (half a core busy leaves a thread its core), within 1 .. `ceiling` (torch's default)."""
    if requested > 0:
        return ThreadChoice(requested, f"set by the user (threads = {requested})", chosen=False, competing=competing)
    if competing is None:
        return ThreadChoice(ceiling, f"torch's default ({ceiling}): the machine's load cannot be read here",
                            chosen=True)  # fmt: skip
    threads = max(1, min(ceiling, math.floor(cores - competing + 0.5)))
    idle = max(0.0, cores - competing)
    why = (f"other processes used {competing:.1f} of {cores} cores: {threads} thread{'s' * (threads > 1)} fit the "
           f"{idle:.1f} idle (torch's default: {ceiling})")  # fmt: skip
    return ThreadChoice(threads, why, chosen=True, competing=competing)


_last_seen: list[tuple[float, float]] = []  # (perf_counter at its end, competing cores): the latest watch here


def note_competing(competing: float | None) -> None:
    """The other processes' load just watched over a window that ends now (a group's whole measurement)."""
    if competing is not None:
        _last_seen[:] = [(time.perf_counter(), competing)]


def fit_threads(requested: int, watch: LoadWatch | None = None, window_s: float = IDLE_WINDOW_S,
                cores: int | None = None) -> ThreadChoice:  # fmt: skip
    """The threads for a group about to be timed: `requested` where the user set it (no waiting), else the idle
    cores: the other processes' load watched for `window_s` (on `watch`, started by the caller, where given), or
    the one watched over a window that ended less than RECENT_S ago (consecutive groups of one process)."""
    if requested > 0:
        return choose_threads(requested, None, 0, TORCH_DEFAULT_THREADS)
    recent = [competing for end, competing in _last_seen if time.perf_counter() - end < RECENT_S]
    if recent:
        competing: float | None = recent[0]
    else:
        watch = watch or LoadWatch.start()
        time.sleep(max(0.0, window_s - (time.perf_counter() - watch.wall_start)))
        competing = watch.competing_cores()
        note_competing(competing)
    return choose_threads(0, competing, cores or os.cpu_count() or 1, usable_ceiling())


def usable_ceiling() -> int:
    """The most threads a choice gives: torch's default, within the cores this process may run on."""
    return max(1, min(TORCH_DEFAULT_THREADS, usable_cores()))
