"""The Wilson 95% score interval against published values, the separation rule the generation verdict orders
accuracies by, and the smallest difference a number of samples can resolve."""

from __future__ import annotations

import math
import random

import pytest
from attnbench.stats import Interval, clearly_above, intervals_separate, separable_difference, wilson_interval


@pytest.mark.parametrize("successes, n, low, high", [
    (5, 10, 0.2366, 0.7634),  # Newcombe (1998)'s and every textbook's check values
    (0, 10, 0.0, 0.2775),
    (10, 10, 0.7225, 1.0),
    (1, 1, 0.2065, 1.0),
    (0, 1, 0.0, 0.7935),
    (81, 263, 0.2553, 0.3662),  # Newcombe (1998), table I
])  # fmt: skip
def test_wilson_against_known_values(successes: int, n: int, low: float, high: float) -> None:
    interval = wilson_interval(successes / n, n)
    assert interval.estimate == successes / n
    assert math.isclose(interval.low, low, abs_tol=5e-5) and math.isclose(interval.high, high, abs_tol=5e-5)


def test_the_ends_are_exact_at_none_and_all() -> None:
    assert wilson_interval(0.0, 7).low == 0.0 and wilson_interval(1.0, 7).high == 1.0


def test_a_fractional_mean_takes_the_interval_of_its_mean_over_the_samples() -> None:
    """Multi-answer rows (a share of answers found) enter as their mean with n = samples: 5 halves of 10 rows read
    as 5 of 10, an interval at least as wide as their own spread needs."""
    assert wilson_interval(sum([0.5] * 10) / 10, 10) == wilson_interval(5 / 10, 10)


def test_no_samples_have_no_interval() -> None:
    interval = wilson_interval(math.nan, 0)
    assert interval.low != interval.low and interval.high != interval.high


def test_separation_is_no_overlap() -> None:
    none, all_ = wilson_interval(0.0, 10), wilson_interval(1.0, 10)
    assert intervals_separate(none, all_) and intervals_separate(all_, none)
    assert not intervals_separate(wilson_interval(0.5, 10), wilson_interval(0.8, 10))
    assert not intervals_separate(Interval(0.5, 0.2, 0.5), Interval(0.6, 0.5, 0.7))  # touching ends overlap


def test_clearly_above_orders_only_separated_intervals() -> None:
    """On random intervals: a name is listed above another only when its interval lies wholly above; the leaders
    (none above them) overlap one another pairwise, and every other name lies below some leader."""
    rng = random.Random(0)
    for _ in range(200):
        intervals = {}
        for name in "abcdef":
            mean, n = rng.random(), rng.choice([4, 10, 30])
            intervals[name] = wilson_interval(round(mean * n) / n, n)
        above = clearly_above(intervals)
        for name, over in above.items():
            assert all(intervals[o].low > intervals[name].high for o in over)
            assert all(o in over for o in intervals if intervals[o].low > intervals[name].high)
        leaders = [name for name, over in above.items() if not over]
        assert all(not intervals_separate(intervals[a], intervals[b]) for a in leaders for b in leaders)
        assert all(set(over) & set(leaders) for over in above.values() if over)


@pytest.mark.parametrize("n", [4, 10, 20, 100])
def test_the_separable_difference_is_where_intervals_just_separate(n: int) -> None:
    gap = separable_difference(n)
    apart = wilson_interval(0.5 - gap / 2, n), wilson_interval(0.5 + gap / 2, n)
    closer = wilson_interval(0.5 - gap / 2 + 0.001, n), wilson_interval(0.5 + gap / 2 - 0.001, n)
    assert intervals_separate(*apart) and not intervals_separate(*closer)


def test_what_few_samples_resolve() -> None:
    assert math.isclose(separable_difference(10), 0.62, abs_tol=0.005)  # the report's "about 62 points"
    assert separable_difference(40) < separable_difference(10) / 1.8  # four times the samples: about half
    assert math.isinf(separable_difference(3))  # 0/3 and 3/3 still overlap
