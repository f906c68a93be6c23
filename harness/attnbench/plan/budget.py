"""The accuracy budget the verdict holds every approximation to, and the speedup a user may ask for: declared once.

Error vs uniform (`err_vs_uniform`) is ‖O − O*‖ / ‖U − O*‖, with O* exact softmax attention and U the uniform average
of V over the visible keys: 0 is exact, 1 no better than averaging V. The verdict says "Use X" only for a variant
whose error on the input it judges is at most `max_error` (attnbench.report.verdict applies the rule). Both values
are config settings (`max_error`, `min_speedup`; flags `--max-error`, `--min-speedup`), so a run records them in its
resolved config and meta.json; `attnbench report RUN --max-error X` judges a finished run again with another.
`min_recall` (`--min-recall R`) also leaves out a variant whose needle recall (the `needles` input: the share of
planted key -> value pairs its output retrieves, the least over the run's needle inputs at that N) is below R.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

DEFAULT_MAX_ERROR = 0.5
"""At 0.5 a variant's output is at most half as far from exact attention as averaging V is: it keeps at least half of
what attention adds over uniform averaging. At 0.7–0.8 only about a quarter to a third is kept: the speedup is bought
with most of what attention is for, so the default refuses it; a stricter or looser budget is one flag away."""


UNIFORM_EQUIVALENT = 0.95  # error vs uniform from which an approximation buys nothing over averaging V

RETRIEVAL_RECALL = 0.9
"""The needle recall the verdict's second answer asks, where the run planted needles and no `--min-recall` was given:
a model must find what its context told it (a passkey, a name, a number), and an output error can be small while a
window that does not reach the needle loses it entirely (band(window=256) at N=8192: error 0.18, recall 6%). At 0.9
a variant misses at most one planted pair in ten at that N, the least over the run's needle inputs; exact attention
retrieves them all. The verdict then answers both uses it measured: continuation (error alone) and retrieval."""


@dataclass(frozen=True)
class AccuracyBudget:
    """What the verdict judges with: the most error vs uniform a recommended variant may have, the speedup a user
    asks for (None: not asked), and where the budget came from, in words the report repeats."""

    max_error: float = DEFAULT_MAX_ERROR
    min_speedup: float | None = None
    source: str = "the default"
    min_recall: float | None = None  # None: recall shown, not required

    @classmethod
    def of_config(cls, config: dict[str, Any]) -> AccuracyBudget:
        """The budget a run recorded in its resolved config (meta.json's `config`); a run recorded before the
        budget existed gets the default, and says so."""
        if config.get("max_error") is None:
            return cls(source="the default (the run recorded none)")
        max_error, min_speedup = config.get("max_error"), config.get("min_speedup")
        default = max_error == DEFAULT_MAX_ERROR
        source = "the default" if default else "the run's settings (`max_error`: its config or `--max-error`)"
        return cls(max_error, min_speedup, source, config.get("min_recall"))

    @property
    def for_retrieval(self) -> AccuracyBudget:
        """This budget asking `RETRIEVAL_RECALL` of needle recall (its own `min_recall` where one was asked)."""
        return self if self.min_recall is not None else replace(self, min_recall=RETRIEVAL_RECALL)

    def with_flags(
        self, max_error: float | None, min_speedup: float | None, min_recall: float | None = None
    ) -> AccuracyBudget:
        """This budget with `attnbench report`'s flags applied (None: not given); the source says what a new
        `--max-error` replaced."""
        asked = dict(
            min_speedup=self.min_speedup if min_speedup is None else min_speedup,
            min_recall=self.min_recall if min_recall is None else min_recall,
        )
        if max_error is None:
            return replace(self, **asked)
        source = f"`attnbench report --max-error {max_error:g}` (the run recorded {_text(self.max_error)})"
        return AccuracyBudget(max_error, source=source, **asked)

    def problems(self, at: Callable[[str], str] = lambda key: key) -> list[str]:
        """Why these values cannot judge a verdict ([] when they can); `at` names a key as the user set it."""
        return budget_problems(self.max_error, self.min_speedup, at, self.min_recall)


def budget_problems(
    max_error: Any, min_speedup: Any, at: Callable[[str], str] = lambda key: key, min_recall: Any = None
) -> list[str]:
    """The one check of the values, for a config (`parse_config`) and for `attnbench report`'s flags alike (None:
    not given)."""
    problems = []
    if max_error is not None and (not _number(max_error) or not 0 < max_error < UNIFORM_EQUIVALENT):
        problems.append(
            f"{at('max_error')}: must be a number > 0 and below {UNIFORM_EQUIVALENT} (the most error vs uniform a "
            f"recommended variant may have; default {DEFAULT_MAX_ERROR}; from {UNIFORM_EQUIVALENT} on a variant is no "
            f"better than averaging V and never recommended), got {max_error!r}"
        )
    if min_speedup is not None and (not _number(min_speedup) or not 1 < min_speedup < math.inf):
        problems.append(
            f"{at('min_speedup')}: must be a finite number > 1 (a speedup against the baseline: 2 asks for at least "
            f"twice as fast; at 1 or below the baseline itself answers), got {min_speedup!r}"
        )
    if min_recall is not None and (not _number(min_recall) or not 0 < min_recall <= 1):
        problems.append(
            f"{at('min_recall')}: must be a share in (0, 1] (0.9: a recommended variant retrieves at least 90% of the "
            f"planted needles), got {min_recall!r}"
        )
    return problems


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value: Any) -> str:
    """A budget value as the report says it: a number in its shortest form, anything else (a hand edit) as read."""
    return format(value, "g") if _number(value) else repr(value)
