"""When a group's times measure the scheduler instead of its variants: the rule, on the figures a group has.

A thread that waits for the scheduler (its core held by another process) adds milliseconds to every parallel
kernel, whatever the kernel's work. Two signs of it, where the work would say otherwise:
- collapsed: variants whose work differs by WORK_SPREAD x or more (the least time it needs here: bytes over the
  measured bandwidth, FLOPs over the matmul peak) take one time to within COLLAPSE, a millisecond or more, while
  torch's threads did not fit the idle cores (seen on 2 cores under load: `full`, `band(window=256)` and `linear`
  decode steps at N=2048, whose reads differ 60x, all took 36.0 ± 0.1 ms);
- stalled: a variant's fastest sample is under 1 / STALLED of its median: most rounds waited, a few did not (seen
  with 2 threads under load: `full`'s step 10 ms by the median, 0.27 ms at its 10th percentile). One such variant
  is enough: every speedup against it (it may be the baseline) is then the scheduler's.
A collapse onto less than a millisecond is a common overhead (dispatch, a kernel launch), not a wait: not a sign.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.interface import mode_work
from attnbench.measure.noise import NOISY_COMPETITION

COLLAPSE = 1.25  # medians within this ratio of one another: one figure
WORK_SPREAD = 5.0  # ... while the least times their work needs differ by this factor or more
STALL_S = 1e-3  # a scheduler's wait is milliseconds
STALLED = 5.0  # fastest sample under 1/5 of the median
MIN_SAMPLES = 3  # a fastest sample means something from 3 rounds


@dataclass(frozen=True)
class Timed:
    """One variant's timing in a group: its median and fastest sample, how many samples, and the least time its
    work needs on this machine (`floor_seconds`; NaN where unknown)."""

    median: float
    fastest: float
    samples: int
    floor: float = float("nan")


def floor_seconds(mode: str, flops: float | None, bytes_moved: float | None, peak: dict) -> float:
    """The least time a call's counted work needs at the machine's measured peaks: a decode step's bytes over the
    read bandwidth; a full-sequence call's max(FLOPs / matmul peak, bytes / copy bandwidth), times its mode's work.
    NaN where a figure is missing (a coarse yardstick: the report's roofline splits reads from writes)."""
    copy = peak.get("copy_bytes_per_s")
    if mode == "decode":
        read = peak.get("read_bytes_per_s") or copy
        return bytes_moved / read if read and bytes_moved else float("nan")
    matmul = peak.get("matmul_flops_per_s")
    if not (matmul and copy and flops is not None and bytes_moved is not None):
        return float("nan")
    return mode_work(mode) * max(flops / matmul, bytes_moved / copy)


def threads_oversubscribed(threads: int, competing: float | None, cores: int) -> bool:
    """Whether torch's threads did not fit the idle cores: with the other processes' load, more than half a core
    (the noise flag's measure) beyond the machine's. One thread has no sibling to wait for."""
    return threads > 1 and competing is not None and threads + competing > cores + NOISY_COMPETITION


def collapsed(timed: dict[str, Timed]) -> list[str]:
    """The largest set of variants whose medians (a millisecond or more) lie within COLLAPSE of one another while
    their work's floors differ by WORK_SPREAD or more, in the group's order ([] when there is none)."""
    ranked = sorted((t.median, name) for name, t in timed.items() if t.median >= STALL_S and t.floor > 0)
    best: list[str] = []
    for start, (low, _) in enumerate(ranked):
        members = [name for median, name in ranked[start:] if median <= low * COLLAPSE]
        floors = [timed[name].floor for name in members]
        if len(members) >= 2 and max(floors) >= WORK_SPREAD * min(floors) and len(members) > len(best):
            best = members
    return [name for name in timed if name in best]


def stalled(timed: dict[str, Timed]) -> list[str]:
    """The variants (with MIN_SAMPLES at least) whose fastest sample is under 1 / STALLED of their median: most of
    their rounds waited. Attention's work does not vary so within a group's rounds; a wait does."""
    return [name for name, t in timed.items() if t.samples >= MIN_SAMPLES and t.fastest * STALLED < t.median]


def scheduler_bound(timed: dict[str, Timed], *, threads: int, competing: float | None, cores: int) -> str:
    """Why a group's times (label -> `Timed`) are the scheduler's and not its variants', '' when nothing says so
    (one clause, no semicolon: a row's `noisy` joins its reasons with them)."""
    if threads_oversubscribed(threads, competing, cores) and (alike := collapsed(timed)):
        floors = [timed[name].floor for name in alike]
        medians = [timed[name].median for name in alike]
        return (f"{', '.join(alike)} all took {1e3 * min(medians):.3g}–{1e3 * max(medians):.3g} ms while their "
                f"work differs {max(floors) / min(floors):.0f}x, at {threads} threads with other processes using "
                f"{competing:.1f} of {cores} cores")  # fmt: skip
    if waited := stalled(timed):
        return (f"{', '.join(waited)}: fastest sample under 1/{STALLED:g} of the median, most rounds waiting for "
                "the scheduler")  # fmt: skip
    return ""
