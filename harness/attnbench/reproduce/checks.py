"""The checks a claim names: each reads a run's rows (results.csv as a DataFrame) and the claim's parameters, and
says whether the claim holds here, with our figures beside the paper's (the verdicts: `attnbench.reproduce.outcome`).
The checks of claims judged on what the real model answers live in `attnbench.reproduce.generation_checks`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pandas as pd

from attnbench.reproduce.generation_checks import GENERATION_CHECKS
from attnbench.reproduce.outcome import CANNOT, FAILS, HOLDS, MIN_EFFECT, SIZE_FACTOR, SLACK, TREND, Outcome
from attnbench.stats import beyond_noise


def ok_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The cells that ran ok."""
    return frame[frame.status == "ok"]


def not_run(frame: pd.DataFrame, labels: list[str]) -> Outcome | None:
    """CANNOT, naming the cells' reasons, when a label the check needs has no cell, or a cell of it did not run ok
    (a figure compared across N needs every N); None when every cell of every label ran ok."""
    missing = [label for label in labels if not (frame.label == label).any()]
    failed = [label for label in labels if label not in missing and (frame[frame.label == label].status != "ok").any()]
    if not missing and not failed:
        return None
    bad = frame[frame.label.isin(failed) & (frame.status != "ok")]
    reasons = [f"{r.label} at N={r.seq_len}: {r.status} ({r.reason})" for r in bad.itertuples()]
    reasons += [f"{label}: not in the run" for label in missing]
    return Outcome(CANNOT, "–", "not every cell it needs ran ok: " + "; ".join(reasons))


def rises(values: list[float]) -> bool:
    """Up from first to last by at least MIN_EFFECT, no step down by more than SLACK."""
    steps_ok = all(b >= a * (1 - SLACK) for a, b in zip(values, values[1:]))
    return len(values) >= 2 and values[-1] >= values[0] * (1 + MIN_EFFECT) and steps_ok


def falls(values: list[float], slack: float = SLACK) -> bool:
    """Down from first to last by at least MIN_EFFECT, no step up by more than `slack`."""
    steps_ok = all(b <= a * (1 + slack) for a, b in zip(values, values[1:]))
    return len(values) >= 2 and values[-1] <= values[0] * (1 - MIN_EFFECT) and steps_ok


def within(ours: float, published: float, factor: float = SIZE_FACTOR) -> bool:
    return published / factor <= ours <= published * factor


def gains_rise_with_n(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """Time and memory ratios (baseline / variant, medians per N) rise with N for every variant; memory ratios within
    SIZE_FACTOR of the published ones where given; optionally the first of `falls_with_k` gains more than the second
    at the largest N (time and memory)."""
    baseline, published = params["baseline"], params["published"]
    measures = params.get("measures", ["time", "memory"])  # time per call (decode: per token), and memory
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
        })[measures]  # fmt: skip
    problems, off_size = [], []
    for label, gain in gains.items():
        for what in measures:
            if not rises(list(gain[what])):
                problems.append(f"{label}'s {what} gain does not rise with N ({_series(gain[what])})")
        for n, (_, memory) in published[label].items():
            if "memory" in measures and n in gain.index and not within(gain.loc[n, "memory"], memory):
                off_size.append(f"{label} memory at N={n}: {gain.loc[n, 'memory']:.3g}× here, {memory:g}× published")
    if falls_with := params.get("falls_with_k"):
        small, large = (gains[label] for label in falls_with)
        n = small.index.max()
        for what in measures:
            if not small.loc[n, what] > large.loc[n, what]:
                problems.append(f"at N={n} {falls_with[0]} gains no more {what} than {falls_with[1]} "
                                f"({small.loc[n, what]:.3g}× vs {large.loc[n, what]:.3g}×)")  # fmt: skip
    ours = "; ".join(f"{label}: " + ", ".join(f"{what} {_series(g[what])}" for what in measures)
                     for label, g in gains.items())  # fmt: skip
    verdict = FAILS if problems else TREND if off_size else HOLDS
    within_text = "; memory within 2×" if any(published.values()) and "memory" in measures else ""
    return Outcome(verdict, ours, "; ".join(problems + off_size) or f"every gain rises with N{within_text}")


def _series(values: pd.Series) -> str:
    """`1.2× (512) → 3.4× (4096)`: a ratio at each N."""
    return " → ".join(f"{value:.3g}× ({n})" for n, value in values.items())


def _defaults(variant: str) -> dict[str, Any]:
    from attnbench.registry import registry

    return {key: spec.default for key, spec in registry.load(variant).hyperparameters.items()}


def variant_rows(frame: pd.DataFrame, variant: str) -> pd.DataFrame | Outcome:
    """The ok rows of `variant` with each row's whole setting (`setting`: its JSON hyperparameters over the
    variant's defaults, a dict per row), or CANNOT when one of its cells did not run ok."""
    labels = list(frame[frame.variant == variant].label.unique())
    if (missing := not_run(frame, labels or [variant])) is not None:
        return missing
    rows = ok_rows(frame)
    rows = rows[rows.variant == variant]
    defaults = _defaults(variant)
    return rows.assign(setting=rows.hparams.fillna("{}").map(lambda text: {**defaults, **json.loads(text or "{}")}))


def error_falls_along(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """The mean error (`metric`, default error vs uniform; over seeds and inputs) falls at every step along the
    hyperparameter `axis` of `variant`, by MIN_EFFECT overall; in trend when it falls by MIN_EFFECT from the first
    value to the last but not at every step."""
    variant, axis, metric = params["variant"], params["axis"], params.get("metric", "err_vs_uniform")
    rows = variant_rows(frame, variant)
    if isinstance(rows, Outcome):
        return rows
    errors = rows[metric].groupby(rows.setting.map(lambda setting: setting[axis])).mean().sort_index()
    if len(errors) < 2:
        return Outcome(CANNOT, "–", f"{variant} ran at fewer than two values of {axis}")
    line = " → ".join(f"{error:.3g} ({axis}={value})" for value, error in errors.items())
    what = f"mean {metric} over {rows.seed.nunique()} seed(s)"
    if falls(list(errors), slack=0.0):  # errors are means over seeds: every step must fall
        return Outcome(HOLDS, line, f"{what} falls at every step along {axis}")
    if falls(list(errors), slack=float("inf")):
        return Outcome(TREND, line, f"{what} falls from the smallest {axis} to the largest, not at every step")
    return Outcome(FAILS, line, f"{what} does not fall by {MIN_EFFECT:.0%} along {axis}")


def more_accurate(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """`better` settings of `variant` against `worse` ones, paired on everything else (input, seed, N, the other
    hyperparameters), by `metric` (default error vs uniform): holds when the better one's error is lower by MIN_EFFECT
    on average, lower on every input, and the mean paired difference lies beyond twice its standard error; in trend
    when lower by MIN_EFFECT on average only; otherwise it does not hold."""
    variant, better, worse = params["variant"], params["better"], params["worse"]
    metric = params.get("metric", "err_vs_uniform")
    rows = variant_rows(frame, variant)
    if isinstance(rows, Outcome):
        return rows

    def matching(wanted: dict[str, Any]) -> pd.DataFrame:
        return rows[rows.setting.map(lambda setting: all(setting[key] == value for key, value in wanted.items()))]

    good, bad = matching(better), matching(worse)
    if good.empty or bad.empty:
        return Outcome(CANNOT, "–", f"no ok cell of {variant} with {better if good.empty else worse}")

    def keyed(side: pd.DataFrame) -> pd.DataFrame:  # paired on every other hyperparameter, defaults included
        rest = side.setting.map(lambda setting: json.dumps({k: v for k, v in setting.items() if k not in better},
                                                            sort_keys=True))  # fmt: skip
        return side.assign(rest=rest, err=side[metric])[["input", "seed", "seq_len", "rest", "err"]]

    pairs = keyed(good).merge(keyed(bad), on=["input", "seed", "seq_len", "rest"], suffixes=("_better", "_worse"))
    if pairs.empty:
        return Outcome(CANNOT, "–", "no cells to pair (same input, seed, N and other hyperparameters)")
    difference = pairs.err_better - pairs.err_worse
    by_input = pairs.groupby("input")[["err_better", "err_worse"]].mean()
    names = ", ".join(f"{k}={v}" for k, v in better.items()), ", ".join(f"{k}={v}" for k, v in worse.items())
    figures = "; ".join(f"{i}: {row.err_better:.4g} vs {row.err_worse:.4g}" for i, row in by_input.iterrows())
    ours = f"{metric} {names[0]} vs {names[1]} ({len(pairs)} pairs): {figures}"
    error = difference.std(ddof=1) / math.sqrt(len(difference)) if len(difference) > 1 else float("inf")
    everywhere = bool((by_input.err_better < by_input.err_worse).all())
    relative = -difference.mean() / pairs.err_worse.mean()  # the better one's error, lower by this fraction
    detail = (f"mean paired difference {difference.mean():.3g} (standard error {error:.2g}; pairs at different "
              f"settings share inputs, so it is a lower bound), {relative:.1%} of the worse one's error")  # fmt: skip
    if relative < MIN_EFFECT:
        return Outcome(FAILS, ours, f"{names[0]} is not more accurate by {MIN_EFFECT:.0%} here; {detail}")
    if everywhere and difference.mean() < -2 * error:
        return Outcome(HOLDS, ours, f"{names[0]} is more accurate on every input; {detail}")
    return Outcome(TREND, ours, f"{names[0]} is more accurate on average, not on every input or not beyond the "
                   f"noise; {detail}")  # fmt: skip


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
        if len(times) < 2:
            return Outcome(CANNOT, "–", f"{label} was timed at fewer than two N: no slope")
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


def ratio_rises_along(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """The median time of `variant`'s `slow` settings over its `fast` ones (in one run: timed in turns), at each value
    of the hyperparameter `axis`: holds when the ratio is above 1 everywhere and rises along the axis (the published
    figure at its largest value is shown beside: its size is the paper's hardware and model, not ours)."""
    variant, axis, slow, fast = params["variant"], params["axis"], params["slow"], params["fast"]
    rows = variant_rows(frame, variant)
    if isinstance(rows, Outcome):
        return rows

    def times(wanted: dict[str, Any]) -> pd.Series:
        chosen = rows[rows.setting.map(lambda setting: all(setting[k] == v for k, v in wanted.items()))]
        return chosen.time_median_s.groupby(chosen.setting.map(lambda setting: setting[axis])).median()

    ratio = (times(slow) / times(fast)).dropna().sort_index()
    if len(ratio) < 2:
        return Outcome(CANNOT, "–", f"{variant} was timed at fewer than two values of {axis} in both settings")
    ours = " → ".join(f"{value:.3g}× ({axis}={at})" for at, value in ratio.items())
    published = params.get("published_top")
    beside = f"; published {published:g}× at the largest {axis} the paper shows" if published else ""
    if rises(list(ratio)) and (ratio > 1).all():
        return Outcome(HOLDS, ours, f"the ratio is above 1 and rises with {axis}{beside}")
    if (ratio > 1).all():
        return Outcome(TREND, ours, f"faster at every {axis}, but the ratio does not rise along it{beside}")
    return Outcome(FAILS, ours, f"not faster at every {axis}{beside}")


def beats_at_equal_budget(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """`method` against `against` (settings that keep the same number of tokens) by error vs uniform at every N and
    input: holds when the method's error is lower everywhere and within `max_error` (the paper's "matches the full
    cache", read as the verdict's accuracy budget); in trend when lower everywhere but over the budget."""
    method, against, max_error = params["method"], params["against"], params["max_error"]
    if (missing := not_run(frame, [method, against])) is not None:
        return missing
    ok = ok_rows(frame)
    table = ok[ok.label.isin([method, against])].groupby(["input", "seq_len", "label"]).err_vs_uniform.mean()
    parts, lower, inside = [], [], []
    for (name, n), errors in table.groupby(level=[0, 1]):
        mine, theirs = errors.loc[(name, n, method)], errors.loc[(name, n, against)]
        lower.append(mine < theirs)
        inside.append(mine <= max_error)
        parts.append(f"{name} N={n}: {mine:.3g} vs {theirs:.3g}")
    ours = f"error vs uniform, {method} vs {against}: " + "; ".join(parts)
    if all(lower) and all(inside):
        return Outcome(HOLDS, ours, f"lower everywhere and within the accuracy budget {max_error:g}")
    if all(lower):
        return Outcome(TREND, ours, f"lower everywhere, but over the accuracy budget {max_error:g} somewhere")
    return Outcome(FAILS, ours, f"{method} is not more accurate than {against} everywhere")


def not_transferable(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """A claim listed so that it is seen, not silently dropped, whose setting cannot be reproduced here: `why`."""
    return Outcome(CANNOT, "–", params["why"])


def overtakes_at_long_n(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """Each of `labels` against `baseline` by N (the paired speedup of each row, timed in turns, with its interval):
    the crossover N is the smallest N from which it is faster beyond noise (a 95% interval above 1) at every larger N.
    Holds when each is slower beyond noise at the smallest N and overtakes inside the published range (low, high];
    in trend when each is slower at the smallest N and overtakes inside the sweep, elsewhere; fails otherwise."""
    labels, (low, high) = params["labels"], params["published_range"]
    if (missing := not_run(frame, [params["baseline"], *labels])) is not None:
        return missing
    ok = ok_rows(frame)
    columns = ["speedup", "speedup_low", "speedup_high", "speedup_coverage"]
    crossovers, never, not_slower, figures = {}, [], [], []
    for label in labels:
        rows = ok[ok.label == label].groupby("seq_len")[columns].median().sort_index()
        said = [beyond_noise(r.speedup_low, r.speedup_high, r.speedup_coverage) for r in rows.itertuples()]
        faster = pd.Series([word == "faster" for word in said], index=rows.index, dtype=bool)
        later_all = faster[::-1].cummin()[::-1]  # faster at this N and every larger one
        crossovers[label] = int(later_all[later_all].index.min()) if later_all.any() else None
        figures.append(f"{label} {_series(rows.speedup)}")
        never += [label] if crossovers[label] is None else []
        not_slower += [] if said and said[0] == "slower" else [label]
    shown = ", ".join(f"{label} from N={n}" if n else f"{label} never" for label, n in crossovers.items())
    detail = f"speedup over {params['baseline']}: " + "; ".join(figures)
    if never or not_slower:
        why = [f"{', '.join(never)} never faster beyond noise in the sweep"] if never else []
        why += [f"{', '.join(not_slower)} not slower beyond noise at the smallest N"] if not_slower else []
        return Outcome(FAILS, shown, "; ".join(why) + f". {detail}")
    inside = all(low < n <= high for n in crossovers.values())
    return Outcome(HOLDS if inside else TREND, shown, f"published crossover in ({low}, {high}]. {detail}")


def attention_recalls_others_fall_behind(frame: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """An MQAR grid's trainings (trainings.csv): `baseline`'s mean accuracy over seeds at least `solved` at every
    (N, pairs), and each of `labels` falling behind as pairs grow at fixed d_model: at the largest N, its accuracy at
    the most pairs at least MIN_EFFECT (absolute) below its own at the fewest and below the baseline's there. Holds
    when both do; in trend when every label falls behind but the baseline misses `solved` somewhere."""
    baseline, labels, solved = params["baseline"], params["labels"], params["solved"]
    ok = frame[frame.status == "ok"]
    missing = [label for label in [baseline, *labels] if not (ok.label == label).any()]
    if missing or (frame.status != "ok").any():
        failed = frame[frame.status != "ok"]
        why = [f"{label}: no training ran ok" for label in missing]
        why += [f"{r.label} N={r.seq_len} P={r.pairs} seed {r.seed}: {r.reason}" for r in failed.itertuples()]
        return Outcome(CANNOT, "–", "not every training it needs ran ok: " + "; ".join(why))
    means = ok.groupby(["label", "seq_len", "pairs"]).accuracy.mean()
    base = means.loc[baseline]
    n = int(ok.seq_len.max())
    at_n = means.xs(n, level="seq_len")
    few, most = int(at_n.index.get_level_values("pairs").min()), int(at_n.index.get_level_values("pairs").max())
    behind, figures = [], [f"{baseline} ≥ {base.min():.0%} everywhere"]
    for label in labels:
        mine = at_n.loc[label]
        falls = mine.loc[few] - mine.loc[most] >= MIN_EFFECT and mine.loc[most] < at_n.loc[(baseline, most)]
        behind.append(falls)
        figures.append(f"{label} {mine.loc[few]:.0%} → {mine.loc[most]:.0%}")
    ours = f"at N={n}, {few} → {most} pairs: " + ", ".join(figures)
    if all(behind) and (base >= solved).all():
        return Outcome(HOLDS, ours, f"{baseline} at or above {solved:.0%} at every N and number of pairs")
    if all(behind):
        where = ", ".join(f"N={k[0]} P={k[1]}: {v:.0%}" for k, v in base[base < solved].items())
        return Outcome(TREND, ours, f"{baseline} below {solved:.0%} at {where}")
    stay = [label for label, fell in zip(labels, behind) if not fell]
    return Outcome(FAILS, ours, f"{', '.join(stay)} do not fall behind as pairs grow")


CHECKS: dict[str, Callable[[pd.DataFrame, dict[str, Any]], Outcome]] = {
    "gains_rise_with_n": gains_rise_with_n,
    "error_falls_along": error_falls_along,
    "more_accurate": more_accurate,
    "time_slopes": time_slopes,
    "sinks_restore": sinks_restore,
    "not_transferable": not_transferable,
    "ratio_rises_along": ratio_rises_along,
    "beats_at_equal_budget": beats_at_equal_budget,
    "overtakes_at_long_n": overtakes_at_long_n,
    "attention_recalls_others_fall_behind": attention_recalls_others_fall_behind,
    **GENERATION_CHECKS,  # claims judged on what the real model answers (generations.csv)
}
