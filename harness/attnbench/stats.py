"""Statistics on timing samples: quantiles, paired speedups with order-statistic intervals, ratios of medians
with bootstrap intervals (seeded by what they resample).

Plain Python and the standard library only: samples are short lists (tens to hundreds per cell).
"""

from __future__ import annotations

import math
import random
import statistics
import zlib
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
    """An estimate with its interval, and the interval's coverage (0.95, or what few samples allow)."""

    estimate: float
    low: float
    high: float
    coverage: float = CONFIDENCE

    def clears(self, threshold: float) -> str | None:
        """'above' when the whole interval lies above 1 + threshold, 'below' under 1 / (1 + threshold), else None."""
        if self.low > 1 + threshold:
            return "above"
        if self.high < 1 / (1 + threshold):
            return "below"
        return None


def trusted(coverage: float) -> bool:
    """Whether an interval of this coverage can name a winner: a 95% one (NaN: a bootstrap's nominal 95%); the
    min–max of fewer than 6 rounds covers less and names none."""
    return not coverage < CONFIDENCE


def beyond_noise(low: float, high: float, coverage: float) -> str:
    """'faster' when a speedup's whole interval lies above 1, 'slower' when below, '' otherwise or when the interval
    is not trusted: the one rule the verdict and the papers' checks (`reproduce`) call a speed difference by."""
    if not trusted(coverage):
        return ""
    return "faster" if low > 1 else "slower" if high < 1 else ""


def _percentile_interval(estimate: float, draws: list[float]) -> Interval:
    """`estimate` with the central CONFIDENCE share of its bootstrap `draws` as its interval."""
    ordered, tail = sorted(draws), (1 - CONFIDENCE) / 2
    return Interval(estimate, quantile(ordered, tail), quantile(ordered, 1 - tail))


def _bootstrap(estimate, samples: list[list[float]], seed: int) -> Interval:
    """Percentile bootstrap of `estimate(*samples)`, each list resampled with replacement on its own."""
    rng = random.Random(seed)
    draws = [estimate(*[rng.choices(s, k=len(s)) for s in samples]) for _ in range(RESAMPLES)]
    return _percentile_interval(estimate(*samples), draws)


def two_level_interval(groups: list[list[float]], seed: int) -> Interval:
    """The median of every value, with the percentile interval of a two-level bootstrap: the groups (worker
    processes) drawn with replacement, then each drawn group's values, so the spread between groups enters it."""
    rng = random.Random(seed)
    draws = []
    for _ in range(RESAMPLES):
        drawn = [rng.choice(groups) for _ in groups]
        draws.append(statistics.median([v for values in drawn for v in rng.choices(values, k=len(values))]))
    return _percentile_interval(statistics.median([v for values in groups for v in values]), draws)


def median_interval(values: list[float]) -> Interval:
    """The median with a distribution-free interval from order statistics: [x_(k), x_(n+1-k)] for the largest k
    whose coverage, 1 − 2·P(Binomial(n, ½) < k), is at least 95% (any continuous distribution, independent
    values). It needs no resampling (the same values give the same interval, whatever the seed) and holds at
    small n, where a percentile bootstrap's nominal 95% does not. Below 6 values no k reaches 95%: the interval
    is min–max and `coverage` says what it is (93.8% at 5)."""
    ordered, n = sorted(values), len(values)

    def coverage(k: int) -> float:  # P(x_(k) <= median <= x_(n+1-k))
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= CONFIDENCE:
        k += 1
    return Interval(statistics.median(ordered), ordered[k - 1], ordered[n - k], coverage(k))


def paired_speedup(baseline: list[float], variant: list[float]) -> Interval:
    """Median over rounds of baseline / variant, each ratio taken within one round, with its order-statistic
    interval (`median_interval`).

    Pairs measured in the same round share the machine's state at that moment, so a slow stretch cancels
    in the ratio instead of landing on whichever was timed then.
    """
    return median_interval(round_ratios(baseline, variant))


def round_ratios(baseline: list[float], variant: list[float]) -> list[float]:
    """baseline / variant round by round (sample i of each is from round i): the per-round speedups."""
    return [b / v for b, v in zip(baseline, variant)]


def seed_of(key: str) -> int:
    """A bootstrap seed fixed by what is resampled (a cell's key): the same samples give the same interval."""
    return zlib.crc32(key.encode())


def ratio_of_medians(a: list[float], b: list[float], seed: int = 0) -> Interval:
    """median(b) / median(a) with an interval from resampling each run's samples (two unpaired runs)."""
    return _bootstrap(lambda x, y: statistics.median(y) / statistics.median(x), [a, b], seed)


# Student's t at 97.5% (two-sided 95%) by degrees of freedom; beyond the table the normal's 1.96 is within 2%
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}  # fmt: skip


def t_quantile(df: int) -> float:
    """Student's t at 97.5% for `df` degrees of freedom (the table's nearest entry at or below it; 1.96 beyond 30)."""
    if df > 30:
        return 1.96
    return T_975[max(k for k in T_975 if k <= df)]


def mean_interval(values: list[float], low: float = -math.inf, high: float = math.inf) -> Interval:
    """The mean of a few independent values (one per seed) with its 95% Student-t interval, clipped to [low, high]
    (an accuracy stays within [0, 1]); one value has no interval (NaN ends)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, math.nan, math.nan)
    half = t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, max(low, mean - half), min(high, mean + half))


Z_975 = 1.959963984540054  # the standard normal's 97.5% quantile: a two-sided 95% interval


def wilson_interval(mean: float, n: int) -> Interval:
    """A share of successes `mean` over `n` samples with its Wilson 95% score interval (Wilson 1927): unlike the
    normal (Wald) or Student-t interval it stays inside [0, 1] and does not collapse at 0/n or n/n, where a method
    that never or always answers still has an uncertain rate. Scores in between (a multi-answer row's share of
    answers found) enter as their mean with n = samples: scores in [0, 1] with mean p vary at most p(1 − p), the 0/1
    case, so the interval errs wide, never narrow."""
    if n < 1:
        return Interval(mean, math.nan, math.nan)
    z2 = Z_975**2
    centre = (mean + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_975 / (1 + z2 / n) * math.sqrt(max(mean * (1 - mean), 0.0) / n + z2 / (4 * n * n))
    low, high = (0.0 if mean <= 0 else max(0.0, centre - half)), (1.0 if mean >= 1 else min(1.0, centre + half))
    return Interval(mean, low, high)


def intervals_separate(a: Interval, b: Interval) -> bool:
    """Whether two intervals do not overlap: the one rule by which a verdict orders two accuracies. Two 95% intervals
    that do not touch is a stricter test than a 5% one on the difference (about 0.6% for equal widths): it errs
    toward 'no clear difference', and a reader checks it by eye in the table."""
    return a.low > b.high or b.low > a.high


def clearly_above(intervals: dict[str, Interval]) -> dict[str, list[str]]:
    """Per name, the names whose interval lies wholly above its own (`intervals_separate`), in sorted order. The
    relation is a strict order (transitive), so the names with none above them, the leaders, overlap one another
    pairwise, and every other name lies clearly below at least one leader."""
    return {name: sorted(other for other, theirs in intervals.items() if theirs.low > mine.high)
            for name, mine in intervals.items()}  # fmt: skip


def separable_difference(n: int) -> float:
    """The smallest difference between two accuracies from n samples each, centred on 50% (where intervals are
    widest), whose Wilson intervals separate: what a grid of n samples a cell can tell apart at most; inf where not
    even 0% and 100% separate (3 samples or fewer)."""
    if not intervals_separate(wilson_interval(0.0, n), wilson_interval(1.0, n)):
        return math.inf
    low, high = 0.0, 1.0
    for _ in range(50):  # bisection on the gap d: 0.5 - d/2 against 0.5 + d/2
        gap = (low + high) / 2
        apart = intervals_separate(wilson_interval(0.5 - gap / 2, n), wilson_interval(0.5 + gap / 2, n))
        low, high = (low, gap) if apart else (gap, high)
    return high
