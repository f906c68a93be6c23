"""Statistics on timing samples: quantiles, paired speedups and ratios of medians with bootstrap intervals.

Plain Python and the standard library only: samples are short lists (tens to hundreds per cell).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

RESAMPLES = 2000
CONFIDENCE = 0.95


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), q in [0, 1]."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Spread:
    """Median, p10, quartiles, p90 and interquartile range of one cell's samples."""

    median: float
    p10: float
    p25: float
    p75: float
    p90: float
    iqr: float
    count: int

    @classmethod
    def of(cls, samples: list[float]) -> "Spread":
        return cls(
            median=quantile(samples, 0.5),
            p10=quantile(samples, 0.1),
            p25=quantile(samples, 0.25),
            p75=quantile(samples, 0.75),
            p90=quantile(samples, 0.9),
            iqr=quantile(samples, 0.75) - quantile(samples, 0.25),
            count=len(samples),
        )


@dataclass(frozen=True)
class Interval:
    """An estimate with its bootstrap interval."""

    estimate: float
    low: float
    high: float

    def clears(self, threshold: float) -> str | None:
        """'above' when the whole interval lies above 1 + threshold, 'below' under 1 / (1 + threshold), else None."""
        if self.low > 1 + threshold:
            return "above"
        if self.high < 1 / (1 + threshold):
            return "below"
        return None


def _bootstrap(estimate, samples: list[list[float]], seed: int) -> Interval:
    """Percentile bootstrap of `estimate(*samples)`, each list resampled with replacement on its own."""
    rng = random.Random(seed)
    values = sorted(estimate(*[rng.choices(s, k=len(s)) for s in samples]) for _ in range(RESAMPLES))
    tail = (1 - CONFIDENCE) / 2
    return Interval(estimate(*samples), quantile(values, tail), quantile(values, 1 - tail))


def paired_speedup(baseline: list[float], variant: list[float], seed: int = 0) -> Interval:
    """Median over rounds of baseline / variant, each ratio taken within one round, with its interval.

    Pairs measured in the same round share the machine's state at that moment, so a slow stretch cancels
    in the ratio instead of landing on whichever was timed then.
    """
    ratios = [b / v for b, v in zip(baseline, variant)]
    return _bootstrap(statistics.median, [ratios], seed)


def ratio_of_medians(a: list[float], b: list[float], seed: int = 0) -> Interval:
    """median(b) / median(a) with an interval from resampling each run's samples (two unpaired runs)."""
    return _bootstrap(lambda x, y: statistics.median(y) / statistics.median(x), [a, b], seed)
