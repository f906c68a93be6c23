"""Where marks go on a plot, as pure functions of the data (no matplotlib): the span of an error axis, the points
drawn at its edge because they lie beyond it or are not judged on error, and small sideways offsets that keep
markers that would coincide (equal recall at one N) apart.

Positions are in axis fractions where it matters (0 at one end of an axis, 1 at the other; log axes in log units),
so one tolerance serves a plot whatever its scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.report.analysis import ERROR_RESOLUTION

UNIFORM = 1.0  # error vs uniform of averaging V: every error axis shows it
ERROR_CEILING = 10.0  # errors above this (ten times averaging V's) are all "worse than averaging V" to the verdict
EDGE_INSET = 0.04  # an off-axis marker sits this share of the axis height inside its top edge (clear of the spine)
NEAR = 0.025  # markers closer than this (axis fraction, both ways) would hide one another
DODGE_STEP = 0.025  # their sideways spacing, axis fraction: about a marker's width


@dataclass(frozen=True)
class ErrorSpan:
    """A log error axis: `floor` where errors at float rounding are drawn (a decade under the least error judged),
    `low`–`high` its limits, `edge` where off-axis points sit (just under `high`)."""

    floor: float
    low: float
    high: float

    @property
    def edge(self) -> float:
        return self.high * (self.low / self.high) ** EDGE_INSET


def error_span(judged: pd.Series | list[float], budget: float | None = None, floor: bool = True) -> ErrorSpan:
    """The error axis over the errors the verdict judges (`judged`: the variants it weighs on error): to twice the
    largest of them, the budget and averaging V (1), capped at ERROR_CEILING; from the exact `floor` (a decade under
    the least of them that is not float rounding) where one is drawn, else from half the least. Errors of variants
    it does not judge (a different operator's hundreds) play no part."""
    errors = pd.Series(judged, dtype=float).dropna()
    approximate = errors[errors >= ERROR_RESOLUTION]
    exact = 10 ** np.floor(np.log10(approximate.min()) - 1) if len(approximate) else 1e-2
    top = max([UNIFORM, budget or 0.0, *approximate])
    low = exact / 2 if floor else min([UNIFORM, budget or UNIFORM, *approximate]) / 2
    return ErrorSpan(floor=float(exact), low=float(low), high=min(2 * top, ERROR_CEILING))


def placed_errors(errors: pd.Series, judged: pd.Series, span: ErrorSpan) -> tuple[pd.Series, pd.Series]:
    """Where each error is drawn on `span`, and whether it is off the axis: a variant not judged on error, or one
    beyond the top, at the edge (off); float rounding on the floor; the rest where they are."""
    judged = judged.astype(bool)
    off = ~judged | (errors > span.high)
    shown = errors.clip(lower=span.floor).where(~off, span.edge)
    return shown.astype(float), off


def dodge(
    x: list[float] | np.ndarray, y: list[float] | np.ndarray, near: float = NEAR, step: float = DODGE_STEP
) -> np.ndarray:
    """Sideways offsets (in the units of `x` and `y`: axis fractions) that set apart markers within `near` of one
    another both ways: each such cluster is spread `step` apart around its place, in the order the points come,
    so that each stays visible. Points alone are not moved."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    cluster = list(range(len(x)))  # union-find over the pairs that touch

    def root(i: int) -> int:
        while cluster[i] != i:
            cluster[i] = cluster[cluster[i]]
            i = cluster[i]
        return i

    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            if abs(x[i] - x[j]) < near and abs(y[i] - y[j]) < near:
                cluster[root(j)] = root(i)
    offsets = np.zeros(len(x))
    members: dict[int, list[int]] = {}
    for i in range(len(x)):
        members.setdefault(root(i), []).append(i)
    for group in members.values():
        for rank, i in enumerate(group):
            offsets[i] = (rank - (len(group) - 1) / 2) * step
    return offsets


def log_fraction(values: pd.Series | np.ndarray, low: float, high: float) -> np.ndarray:
    """Positions on a log axis from `low` to `high` as axis fractions."""
    return np.log(np.asarray(values, dtype=float) / low) / np.log(high / low)
