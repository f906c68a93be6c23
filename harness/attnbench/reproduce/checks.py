"""The checks a claim names: each reads a run's rows (results.csv as a DataFrame) and the claim's parameters, and
says whether the claim holds here, with our figures beside the paper's.

Verdicts: HOLDS, TREND ("holds in trend, not in size": the direction holds, a figure compared in size does not),
FAILS ("does not hold", with what differs), and CANNOT (the cells it needs did not run here, with why).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

HOLDS = "holds"
TREND = "holds in trend, not in size"
FAILS = "does not hold"
CANNOT = "cannot run here"
SLACK = 0.10  # a step of a trend may go the wrong way by this fraction (timing and sampling noise) and still count
SIZE_FACTOR = 2.0  # a figure compared in size holds within this factor of the published one


@dataclass(frozen=True)
class Outcome:
    """A claim's verdict, our figures in one line (for the table), and what was compared (for the report)."""

    verdict: str
    ours: str
    detail: str = ""


def ok_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The cells that ran ok."""
    return frame[frame.status == "ok"]


def not_run(frame: pd.DataFrame, labels: list[str]) -> Outcome | None:
    """CANNOT, naming the cells' reasons, when a label the check needs has no ok cell; None when all have."""
    ok = ok_rows(frame)
    missing = [label for label in labels if not (ok.label == label).any()]
    if not missing:
        return None
    reasons = sorted({str(r) for r in frame[frame.label.isin(missing)].reason.dropna()})
    why = "; ".join(reasons) if reasons else "not in the run"
    return Outcome(CANNOT, "–", f"no ok cell for {', '.join(missing)}: {why}")


def rises(values: list[float]) -> bool:
    """Up from first to last, no step down by more than SLACK."""
    steps_ok = all(b >= a * (1 - SLACK) for a, b in zip(values, values[1:]))
    return len(values) >= 2 and values[-1] > values[0] and steps_ok


def falls(values: list[float], slack: float = SLACK) -> bool:
    """Down from first to last, no step up by more than `slack`."""
    steps_ok = all(b <= a * (1 + slack) for a, b in zip(values, values[1:]))
    return len(values) >= 2 and values[-1] < values[0] and steps_ok


def within(ours: float, published: float, factor: float = SIZE_FACTOR) -> bool:
    return published / factor <= ours <= published * factor


def gains_rise_with_n(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """Time and memory ratios (baseline / variant, medians per N) rise with N for every variant; memory ratios within
    SIZE_FACTOR of the published ones where given; optionally the first of `falls_with_k` gains more than the second
    at the largest N (time and memory)."""
    baseline, published = params["baseline"], params["published"]
    if (missing := not_run(frame, [baseline, *published])) is not None:
        return missing
    ok = ok_rows(frame)
    by_n = ok.groupby(["label", "seq_len"])[["time_median_s", "peak_mem_bytes"]].median()
    base = by_n.loc[baseline]
    gains: dict[str, pd.DataFrame] = {}
    for label in published:
        mine = by_n.loc[label]
        common = base.index.intersection(mine.index)
        gains[label] = pd.DataFrame({
            "time": base.loc[common, "time_median_s"] / mine.loc[common, "time_median_s"],
            "memory": base.loc[common, "peak_mem_bytes"] / mine.loc[common, "peak_mem_bytes"],
        })  # fmt: skip
    problems, off_size = [], []
    for label, gain in gains.items():
        for what in ("time", "memory"):
            if not rises(list(gain[what])):
                problems.append(f"{label}'s {what} gain does not rise with N ({_series(gain[what])})")
        for n, (_, memory) in published[label].items():
            if n in gain.index and not within(gain.loc[n, "memory"], memory):
                off_size.append(f"{label} memory at N={n}: {gain.loc[n, 'memory']:.3g}× here, {memory:g}× published")
    if falls_with := params.get("falls_with_k"):
        small, large = (gains[label] for label in falls_with)
        n = small.index.max()
        for what in ("time", "memory"):
            if not small.loc[n, what] > large.loc[n, what]:
                problems.append(f"at N={n} {falls_with[0]} gains no more {what} than {falls_with[1]} "
                                f"({small.loc[n, what]:.3g}× vs {large.loc[n, what]:.3g}×)")  # fmt: skip
    ours = "; ".join(f"{label}: time {_series(g['time'])}, memory {_series(g['memory'])}" for label, g in gains.items())
    verdict = FAILS if problems else TREND if off_size else HOLDS
    return Outcome(verdict, ours, "; ".join(problems + off_size) or "every gain rises with N; memory within 2×")


def _series(values: pd.Series) -> str:
    """`1.2× (512) → 3.4× (4096)`: a ratio at each N."""
    return " → ".join(f"{value:.3g}× ({n})" for n, value in values.items())


def hyperparameters(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows' hyperparameters as columns (from the JSON `hparams` column); absent ones are NaN."""
    parsed = frame.hparams.fillna("{}").map(lambda text: json.loads(text) if text else {})
    return pd.DataFrame(list(parsed), index=frame.index)


def _matching(frame: pd.DataFrame, variant: str, wanted: dict[str, Any], defaults: dict[str, Any]) -> pd.DataFrame:
    rows = ok_rows(frame)
    rows = rows[rows.variant == variant]
    params = hyperparameters(rows)
    keep = pd.Series(True, index=rows.index)
    for key, value in wanted.items():
        column = params[key] if key in params else pd.Series(defaults.get(key), index=rows.index)
        keep &= column.fillna(defaults.get(key)).map(lambda x, v=value: x == v)
    return rows[keep]


def _defaults(variant: str) -> dict[str, Any]:
    from attnbench.registry import registry

    return {key: spec.default for key, spec in registry.load(variant).hyperparameters.items()}


def error_falls_along(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """The mean error vs uniform (over seeds and inputs) falls at every step along the hyperparameter `axis` of
    `variant`; in trend when it is lower at the last value than the first only."""
    variant, axis = params["variant"], params["axis"]
    rows = ok_rows(frame)
    rows = rows[rows.variant == variant]
    if rows.empty:
        return not_run(frame, list(frame[frame.variant == variant].label.unique()) or [variant]) or Outcome(
            CANNOT, "–", f"no {variant} cell"
        )
    default = _defaults(variant)[axis]
    values = rows.hparams.fillna("{}").map(lambda text: (json.loads(text) if text else {}).get(axis, default))
    errors = rows.err_vs_uniform.groupby(values).mean().sort_index()
    line = " → ".join(f"{error:.3g} ({axis}={value})" for value, error in errors.items())
    if falls(list(errors), slack=0.0):  # errors are means over seeds: every step must fall
        return Outcome(HOLDS, line, f"mean error vs uniform over {rows.seed.nunique()} seed(s) falls along {axis}")
    if len(errors) >= 2 and errors.iloc[-1] < errors.iloc[0]:
        return Outcome(TREND, line, f"lower at the largest {axis} than the smallest, but not step by step")
    return Outcome(FAILS, line, f"the error does not fall along {axis}")


def more_accurate(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """`better` settings of `variant` against `worse` ones, paired on everything else (input, seed, N, the other
    hyperparameters): holds when the better one's error vs uniform is lower on average on every input and the mean
    paired difference lies beyond twice its standard error; in trend when it is lower on average only."""
    variant, better, worse = params["variant"], params["better"], params["worse"]
    defaults = _defaults(variant)
    good, bad = _matching(frame, variant, better, defaults), _matching(frame, variant, worse, defaults)
    if good.empty or bad.empty:
        return Outcome(CANNOT, "–", f"no ok cell of {variant} with {better if good.empty else worse}")

    def keyed(rows: pd.DataFrame) -> pd.DataFrame:
        rest = hyperparameters(rows).drop(columns=list(better), errors="ignore")
        rest_key = rest.apply(lambda row: json.dumps(row.dropna().to_dict(), sort_keys=True), axis=1)
        return rows.assign(rest=rest_key)[["input", "seed", "seq_len", "rest", "err_vs_uniform"]]

    pairs = keyed(good).merge(keyed(bad), on=["input", "seed", "seq_len", "rest"], suffixes=("_better", "_worse"))
    if pairs.empty:
        return Outcome(CANNOT, "–", "no cells to pair (same input, seed, N and other hyperparameters)")
    difference = pairs.err_vs_uniform_better - pairs.err_vs_uniform_worse
    by_input = pairs.groupby("input")[["err_vs_uniform_better", "err_vs_uniform_worse"]].mean()
    names = ", ".join(f"{k}={v}" for k, v in better.items()), ", ".join(f"{k}={v}" for k, v in worse.items())
    figures = "; ".join(f"{i}: {row.err_vs_uniform_better:.4g} vs {row.err_vs_uniform_worse:.4g}"
                        for i, row in by_input.iterrows())  # fmt: skip
    ours = f"error {names[0]} vs {names[1]} ({len(pairs)} pairs): {figures}"
    error = difference.std(ddof=1) / math.sqrt(len(difference)) if len(difference) > 1 else float("inf")
    everywhere = bool((by_input.err_vs_uniform_better < by_input.err_vs_uniform_worse).all())
    detail = f"mean paired difference {difference.mean():.3g} (standard error {error:.2g})"
    if everywhere and difference.mean() < -2 * error:
        return Outcome(HOLDS, ours, f"{names[0]} is more accurate on every input; {detail}")
    if difference.mean() < 0:
        return Outcome(TREND, ours, f"{names[0]} is more accurate on average, not beyond the noise; {detail}")
    return Outcome(FAILS, ours, f"{names[0]} is not more accurate here; {detail}")


def time_slopes(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """The log–log slope of median time against N, per label, inside its published range; in trend when the
    ranges do not hold but the labels keep their order of growth."""
    ranges = params["slopes"]
    if (missing := not_run(frame, list(ranges))) is not None:
        return missing
    ok = ok_rows(frame)
    slopes = {}
    for label in ranges:
        times = ok[ok.label == label].groupby("seq_len").time_median_s.median()
        xs, ys = [math.log(n) for n in times.index], [math.log(t) for t in times]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        spread = sum((x - mean_x) ** 2 for x in xs)
        slopes[label] = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else float("nan")
    ours = ", ".join(f"{label} slope {slope:.2f}" for label, slope in slopes.items())
    inside = [low <= slopes[label] <= high for label, (low, high) in ranges.items()]
    if all(inside):
        return Outcome(HOLDS, ours, "every slope inside its published range")
    by_published = sorted(ranges, key=lambda label: sum(ranges[label]))
    ordered = all(slopes[a] < slopes[b] for a, b in zip(by_published, by_published[1:]))
    detail = "; ".join(f"{label} {slopes[label]:.2f} (published {low}–{high})" for label, (low, high) in ranges.items())
    return Outcome(TREND if ordered else FAILS, ours, detail)


def sinks_restore(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """At every N: the window with sinks has a lower error than the window alone, and keeps at least half of the
    first-token mass the window dropped (dropped mass falls by >= half the input's sink mass)."""
    window, sinks = params["window"], params["sinks"]
    if (missing := not_run(frame, [window, sinks])) is not None:
        return missing
    ok = ok_rows(frame)
    table = ok[ok.label.isin([window, sinks])].groupby(["seq_len", "label"])[
        ["err_vs_uniform", "dropped_mass", "input_sink_mass"]
    ].mean()
    parts, lower, restored = [], [], []
    for n in sorted({n for n, _ in table.index}):
        alone, kept = table.loc[(n, window)], table.loc[(n, sinks)]
        recovered = alone.dropped_mass - kept.dropped_mass
        lower.append(kept.err_vs_uniform < alone.err_vs_uniform)
        restored.append(recovered >= 0.5 * alone.input_sink_mass)
        parts.append(
            f"N={n}: error {alone.err_vs_uniform:.3g} → {kept.err_vs_uniform:.3g}, dropped mass "
            f"{alone.dropped_mass:.3g} → {kept.dropped_mass:.3g} (sink mass {alone.input_sink_mass:.3g})"
        )
    ours = "; ".join(parts)
    if all(lower) and all(restored):
        return Outcome(HOLDS, ours, "sinks lower the error and keep the first token's mass at every N")
    if any(lower):
        return Outcome(TREND, ours, "sinks lower the error at some N only, or keep less than half the sink's mass")
    return Outcome(FAILS, ours, "sinks do not lower the error here")


CHECKS: dict[str, Callable[[pd.DataFrame, dict[str, Any]], Outcome]] = {
    "gains_rise_with_n": gains_rise_with_n,
    "error_falls_along": error_falls_along,
    "more_accurate": more_accurate,
    "time_slopes": time_slopes,
    "sinks_restore": sinks_restore,
}
