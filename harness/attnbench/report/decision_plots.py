"""The verdict at one N as its speed-error plot shows it: a short title naming the choice (the verdict's sentence
stays in the report's text), one point per variant with both a speedup and an error, and which of them the verdict
judges on error, so the error axis spans those and the rest sit at its edge (attnbench.report.plot_layout).

Which variants are judged on error is read from the verdict's own decision (`judge` leaves a different operator
from softmax out with DIFFERENT_OPERATOR), not decided again here.
"""

from __future__ import annotations

import pandas as pd

from attnbench.report.verdict import DIFFERENT_OPERATOR, Answer, Choice, InputVerdict

POINT_COLUMNS = ["label", "speedup", "speedup_low", "speedup_high", "error", "memory_ratio", "judged"]


def judged_on_error(choice: Choice) -> bool:
    """Whether the verdict weighed `choice`'s error: every variant but one it left out as a different operator
    from softmax (exact variants too: their error is float rounding, drawn on the exact floor)."""
    return not choice.left_out.startswith(DIFFERENT_OPERATOR)


def not_judged_on_error(judged: list[InputVerdict]) -> frozenset[str]:
    """The labels some answer of these verdicts left out as not judged on error (`judged_on_error`)."""
    return frozenset(
        c.label for v in judged for a in v.answers for c in a.choices + a.left_out if not judged_on_error(c)
    )


def decision_title(answer: Answer) -> str:
    """'N=8192: band(sinks=4, window=256)' (the variant the verdict recommends; '(exact)' after an exact one);
    where it offers no approximation, the verdict's own words ('N=256: nothing beats full', which covers
    approximations within the budget but slower as well as ones over it); else 'N=8192: none recommended'."""
    chosen = next((c for c in answer.choices if c.label == answer.use), None) if answer.use else None
    if chosen is not None:
        return f"N={answer.n}: {chosen.label}" + (" (exact)" if chosen.family == "exact" else "")
    if not any(c.family != "exact" for c in answer.choices) and answer.sentence.startswith("Nothing"):
        return f"N={answer.n}: nothing" + answer.sentence.removeprefix("Nothing").split(" here")[0]
    return f"N={answer.n}: none recommended"


def decision_points(answer: Answer) -> pd.DataFrame:
    """A row per variant of the answer with a speedup and an error (a point needs both axes: `error = false` runs
    measure none), in the verdict's order: its choices, then what it left out; `judged` by `judged_on_error`."""
    rows = [
        {
            "label": c.label,
            "speedup": c.speedup,
            "speedup_low": c.speedup_low,
            "speedup_high": c.speedup_high,
            "error": c.error,
            "memory_ratio": c.memory_ratio,
            "judged": judged_on_error(c),
        }
        for c in answer.choices + answer.left_out
        if c.speedup == c.speedup and c.error == c.error
    ]
    return pd.DataFrame(rows, columns=POINT_COLUMNS)
