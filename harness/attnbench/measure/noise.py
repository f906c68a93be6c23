"""How busy the machine was while a group was timed, and when a cell's figures are too noisy to stand alone.

Load averages lag and count our own threads, so the verdict uses a direct figure: the CPU time other
processes took during the group (all CPUs' busy time from /proc/stat minus this process's own), in cores.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

NOISY_IQR = 0.10  # IQR above 10% of the median: the spread alone makes a cell noisy
NOISY_COMPETITION = 0.5  # other processes used more than half a core on average while the group ran
# a row's `noisy` starting so: its group's times were the scheduler's (attnbench.measure.stalls), no speedup is drawn
# from it and the report's verdict leaves it out (attnbench.report.unusable reads the same words)
UNUSABLE = "unusable: scheduler-bound"
MEASURED_AGAIN = "scheduler-bound at"  # a row's `reruns` starting so: its group was measured once more


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def cpu_mhz() -> float | None:
    """Mean current frequency over CPUs, where the kernel tells it (None in many VMs)."""
    values = []
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("cpu MHz"):
            try:
                values.append(float(line.split(":", 1)[1]))
            except ValueError:
                pass
    return sum(values) / len(values) if values else None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _busy_seconds() -> float | None:
    """CPU-seconds all CPUs spent busy since boot (user + nice + system + irq + softirq + steal)."""
    first = _read("/proc/stat").split("\n", 1)[0].split()
    if not first or first[0] != "cpu":
        return None
    ticks = [int(x) for x in first[1:9]]
    busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6] + ticks[7]
    return busy / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class LoadWatch:
    """Started before a group and read after it: load averages and the other processes' CPU use."""

    load_before: float | None
    busy_start: float | None
    own_start: float
    wall_start: float

    @classmethod
    def start(cls) -> "LoadWatch":
        return cls(load_average(), _busy_seconds(), _own_seconds(), time.perf_counter())

    def competing_cores(self) -> float | None:
        """Cores' worth of CPU that other processes used since `start` (0 on a quiet machine)."""
        busy = _busy_seconds()
        wall = time.perf_counter() - self.wall_start
        if busy is None or self.busy_start is None or wall <= 0:
            return None
        return max(0.0, (busy - self.busy_start - (_own_seconds() - self.own_start)) / wall)


def noise_reason(median: float, iqr: float, competing: float | None, bound: str = "") -> str:
    """Why a cell's timing should not be read alone, or '' when nothing says so; `bound`: why its group's times are
    the scheduler's (`attnbench.measure.stalls.scheduler_bound`), which makes it unusable."""
    reasons = [f"{UNUSABLE}: {bound}"] if bound else []
    if median > 0 and iqr / median > NOISY_IQR:
        reasons.append(f"IQR {100 * iqr / median:.0f}% of the median")
    if competing is not None and competing > NOISY_COMPETITION:
        reasons.append(f"other processes used {competing:.1f} cores while it ran")
    return "; ".join(reasons)


def competing_now(seconds: float = 0.5) -> float | None:
    """Cores' worth of CPU other processes use right now, watched for `seconds` (None where /proc/stat is not
    readable): the noise flag's measure, for the warning a run gives as it starts."""
    watch = LoadWatch.start()
    time.sleep(seconds)
    return watch.competing_cores()
