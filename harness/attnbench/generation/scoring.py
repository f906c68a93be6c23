"""RULER's answer metrics, per sample: whether the reference strings appear in the model's reply.

Transcribed from RULER's `scripts/eval/synthetic/constants.py` (string_match_all, string_match_part) and the
prediction clean-up of `scripts/eval/evaluate.py` (`postprocess_pred`). RULER averages a task's samples and reports
`round(100 * mean, 2)`; a sample's own score, here, is the unrounded fraction in [0, 1].
"""

from __future__ import annotations

import re

STRING_MATCH_ALL = "string_match_all"  # the share of the references found (niah, vt, cwe, fwe)
STRING_MATCH_PART = "string_match_part"  # 1 when any reference is found (qa: alternative phrasings)
METRICS = (STRING_MATCH_ALL, STRING_MATCH_PART)
CONTROL = re.compile(r"[\x00-\x1f]")  # RULER's `np_pattern`: non-printable characters, each made a newline


def postprocess(answer: str) -> str:
    """RULER's `postprocess_pred`: stripped, every control character a newline, stripped again."""
    return CONTROL.sub("\n", answer.strip()).strip()


def score(answer: str, references: tuple[str, ...] | list[str], metric: str = STRING_MATCH_ALL) -> float:
    """One reply's score under RULER's `metric`, case-insensitive substring match: string_match_all, the share of
    `references` found in it; string_match_part, 1.0 if any is found. NaN without references (nothing to find)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}: use {' or '.join(METRICS)}")
    if not references:
        return float("nan")
    reply = postprocess(answer).lower()
    found = [1.0 if reference.lower() in reply else 0.0 for reference in references]
    return max(found) if metric == STRING_MATCH_PART else sum(found) / len(found)
