"""A claim's verdicts and the outcome a check returns, with the tolerances the checks share.

Verdicts: HOLDS, TREND ("holds in trend, not in size": the direction holds, a figure compared in size does not),
FAILS ("does not hold", with what differs), and CANNOT (the cells it needs did not run here, with why).
"""

from __future__ import annotations

from dataclasses import dataclass

HOLDS = "holds"
TREND = "holds in trend, not in size"
FAILS = "does not hold"
CANNOT = "cannot run here"
SLACK = 0.10  # a step of a trend may go the wrong way by this fraction (timing and sampling noise) and still count
SIZE_FACTOR = 2.0  # a figure compared in size holds within this factor of the published one
MIN_EFFECT = 0.10  # a trend or a comparison counts only when it moves its figure by at least this fraction


@dataclass(frozen=True)
class Outcome:
    """A claim's verdict, our figures in one line (for the table), and what was compared (for the report)."""

    verdict: str
    ours: str
    detail: str = ""
