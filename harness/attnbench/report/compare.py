"""Compare two runs cell by cell and decide from their timing samples, not from two medians.

For each cell in both runs, by default (`measure="auto"`) the ratio of its in-turn speedups against the baseline,
A / B: each run's speedup was measured in turns on one machine, so a run that was slower or faster as a whole
(another process, a warmer CPU) cancels, as it does not in absolute times. Its 95% interval resamples each run's
per-round ratios (baseline time / cell time, the same round) on their own. Where either run lacks that speedup,
or with `measure="time"`, the ratio of median times B / A with each run's samples resampled.

Verdicts with an equivalence margin: "slower" / "faster" when the whole interval lies beyond the threshold,
"same" only when it lies within ±margin, "inconclusive" otherwise (the interval is too wide to tell), each with
its interval. Noise flags are reported beside the verdict, never vetoes; for absolute times, runs from different
machines or software, or without samples, are inconclusive (nothing to decide with). A cell that was ok in A and
is not in B (error, crashed, missing) is a regression of its own.

A decode cell (attnbench.report.modes) is judged the same way on its steps: its speedup per generated token, or its
step time; its memory ratio is of the cache it keeps at N, and its prefill (timed once: no interval) is shown, not
judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attnbench.report.modes import mode_of
from attnbench.report.text import format_number, interval_text, markdown_table, ratio_text
from attnbench.report.unusable import is_unusable
from attnbench.runfolder.folder import read_samples
from attnbench.runfolder.meta import RunMeta
from attnbench.runfolder.results import read_results
from attnbench.stats import Interval, ratio_of_medians, round_ratios, seed_of

DEFAULT_THRESHOLD = 0.05  # a change is called only when its interval clears 5% (or --fail-above)


@dataclass
class Comparison:
    table: pd.DataFrame  # one row per cell ok in both runs
    broken: pd.DataFrame  # cells ok in A that are not ok (or missing) in B
    only_in_a: int
    only_in_b: int
    machine_notes: list[str]
    measure: str  # what was asked: "auto", "speedup" or "time" (each row says which it used)
    threshold: float = DEFAULT_THRESHOLD
    margin: float = DEFAULT_THRESHOLD
    plan_notes: list[str] = field(default_factory=list)

    def regressions(self) -> pd.DataFrame:
        return self.table[self.table.verdict == "slower"] if len(self.table) else self.table

    def inconclusive(self) -> int:
        return int(self.table.verdict.str.startswith("inconclusive").sum()) if len(self.table) else 0


def machine_differences(meta_a: RunMeta, meta_b: RunMeta) -> list[str]:
    """What differs between the machines and software of two runs."""
    notes = []
    machine_a, machine_b = meta_a.machine, meta_b.machine
    for key in ("cpu", "devices", "torch_threads", "platform"):
        if machine_a.get(key) != machine_b.get(key):
            notes.append(f"{key}: {machine_a.get(key)} vs {machine_b.get(key)}")
    versions_a, versions_b = machine_a.get("versions", {}), machine_b.get("versions", {})
    for package in sorted(set(versions_a) | set(versions_b)):
        if versions_a.get(package) != versions_b.get(package):
            notes.append(f"{package}: {versions_a.get(package)} vs {versions_b.get(package)}")
    return notes


BROKEN = ("error", "crashed", "timeout", "oom", "unsupported")  # ok in A and this in B: a regression
# (`skipped` is not: a budget or memory skip follows from time or load, which the timing verdicts judge)


def _planned_cells(meta: RunMeta) -> set[str] | None:
    """The cell keys of a run's stored config (None when it cannot be read here, e.g. a plugin is missing)."""
    from attnbench.plan.config import ConfigError, parse_config

    try:
        return {cell.key() for cell in parse_config(meta.config, source="meta.json").plan().cells}
    except (ConfigError, KeyError, TypeError, ValueError):
        return None


MEASURES = ("auto", "speedup", "time")  # auto: the in-turn speedup where both runs have it, else the time


def decide(interval: Interval, threshold: float, margin: float, cannot_decide: str = "") -> str:
    """The verdict on a ratio (> 1: B is slower): 'slower' / 'faster' when its whole interval lies beyond the
    threshold, 'same' when it lies within ±margin, 'inconclusive (why)' otherwise, or when `cannot_decide` says
    the measurement cannot carry a decision (no samples, another machine's absolute times)."""
    if cannot_decide:
        return f"inconclusive ({cannot_decide})"
    if interval.low != interval.low or interval.high != interval.high:  # NaN: nothing to decide with
        return "inconclusive (no interval)"
    side = interval.clears(threshold)
    if side is not None:
        return "slower" if side == "above" else "faster"
    if 1 / (1 + margin) <= interval.low and interval.high <= 1 + margin:
        return "same"
    return f"inconclusive (the interval reaches beyond ±{100 * margin:g}% without clearing {100 * threshold:g}%)"


def _baseline_verdict(by_time: str) -> str:
    """Under `--measure auto` the baseline is shown by its time, B / A, but not judged: its speedup is 1 by
    construction, and its time cannot tell a slower machine from a slower baseline (only `--measure time`, on one
    quiet machine, judges it). Neither a regression nor inconclusive; said when it moved."""
    return f"baseline, not judged (its time: {by_time}; --measure time judges it)"


def _round_ratios(run: pd.DataFrame, samples: dict[str, list[float]], row: pd.Series) -> list[float]:
    """The cell's per-round speedups (its group's baseline time over its own, the same round); [] without them."""
    group = run[(run.group_key == row.group_key) & (run.label == row.baseline)]
    own, base = samples.get(str(row.name)), samples.get(str(group.index[0])) if len(group) else None
    if not own or not base:
        return []
    return round_ratios(base, own)


def _noise_cause(x: pd.Series, y: pd.Series) -> str:
    causes = [
        f"{side} noisy: {row.noisy}" for side, row in (("A", x), ("B", y)) if isinstance(row.noisy, str) and row.noisy
    ]
    return "; ".join(causes)


def _timing_apart(x: pd.Series, y: pd.Series) -> str:
    """Why two rows' timings cannot be compared whatever their figures ('' when they can): a side whose times were
    the scheduler's (`report.unusable`), or torch thread counts that differ (a run fits them to the idle cores)."""
    causes = [f"{side}'s times scheduler-bound" for side, row in (("A", x), ("B", y)) if is_unusable(row.get("noisy"))]
    threads = [row.get("threads") for row in (x, y)]
    if all(pd.notna(t) for t in threads) and threads[0] != threads[1]:
        causes.append(f"torch threads differ: {int(threads[0])} vs {int(threads[1])}")
    return "; ".join(causes)


def compare_runs(
    run_a: Path,
    run_b: Path,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    margin: float | None = None,
    measure: str = "auto",
) -> Comparison:
    """Every cell of both runs with its ratio, interval and verdict (`decide`), and the cells B broke.
    `margin` (default: the threshold) bounds what counts as "same"."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    margin = threshold if margin is None else margin
    a, b = (read_results(run).drop_duplicates("cell_key", keep="last").set_index("cell_key") for run in (run_a, run_b))
    samples_a, samples_b = read_samples(run_a), read_samples(run_b)
    meta = [RunMeta.read(r) for r in (run_a, run_b)]
    notes = machine_differences(*meta)
    machines_differ = "different machines or software" if notes else ""
    ok_a, ok_b = a[a.status == "ok"], b[b.status == "ok"]
    rows = []
    for key in ok_a.index.intersection(ok_b.index):
        x, y = ok_a.loc[key], ok_b.loc[key]
        if pd.isna(x.time_median_s) or pd.isna(y.time_median_s):
            continue  # an input whose error alone was measured (its setting was timed on another input)
        both = pd.notna(x.speedup) and pd.notna(y.speedup)
        if measure == "speedup" and not both:
            continue
        # the baseline's speedup against itself is 1 by construction: a slower baseline shows only in its time
        is_baseline = x.label == x.baseline
        by_speedup = measure == "speedup" or (
            measure == "auto" and both and x.baseline == y.baseline and not is_baseline
        )
        noise = _noise_cause(x, y)
        mode = mode_of(x["mode"])
        memory = mode.memory  # the memory its mode weighs: a call's peak, or decode's cache
        if by_speedup:  # A / B: > 1 means B got slower relative to its baseline
            ratios_a, ratios_b = _round_ratios(a, samples_a, x), _round_ratios(b, samples_b, y)
            several = max(x.get("processes") or 1, y.get("processes") or 1) > 1  # rounds not shared across cells
            if ratios_a and ratios_b and not several:
                interval = ratio_of_medians(ratios_b, ratios_a, seed_of(key))
            else:  # no samples, or --processes runs: the two intervals' far ends (each two-level there)
                interval = Interval(
                    x.speedup / y.speedup,
                    x.speedup_low / y.speedup_high if y.speedup_high else float("nan"),
                    x.speedup_high / y.speedup_low if y.speedup_low else float("nan"),
                )
            baselines = "" if x.baseline == y.baseline else f"baselines differ: {x.baseline} vs {y.baseline}"
            cannot_decide = "; ".join(cause for cause in (baselines, _timing_apart(x, y)) if cause)
        else:
            sa, sb = samples_a.get(key), samples_b.get(key)
            if sa and sb:
                interval = ratio_of_medians(sa, sb, seed_of(key))
            else:  # no samples (a run written before they were kept, or a lost file): no interval to decide on
                interval = Interval(y.time_median_s / x.time_median_s, float("nan"), float("nan"))
            missing = [side for side, found in (("A", sa), ("B", sb)) if not found]
            no_samples = f"no timing samples in {' and '.join(missing)}" if missing else ""
            cannot_decide = "; ".join(cause for cause in (no_samples, machines_differ, _timing_apart(x, y)) if cause)
        rows.append(
            {
                "cell_key": key,
                "label": x["label"],
                "seq_len": x["seq_len"],
                "setting": f"{x['device']}/{x['dtype']}/{x['mode']}{'/causal' if x.causal else ''}",
                "input": x["input"],
                "measure": "speedup" if by_speedup else "time",
                "a": x.speedup if by_speedup else 1e3 * x.time_median_s,
                "b": y.speedup if by_speedup else 1e3 * y.time_median_s,
                "ratio": interval.estimate,
                "low": interval.low,
                "high": interval.high,
                "memory_ratio": y[memory] / x[memory] if x[memory] else float("nan"),
                "prefill_ratio": y.prefill_s / x.prefill_s if mode.decode and x.prefill_s else float("nan"),
                "decode": mode.decode,
                "error_a": x.err_vs_uniform,
                "error_b": y.err_vs_uniform,
                "verdict": _baseline_verdict(decide(interval, threshold, margin, cannot_decide))
                if is_baseline and measure == "auto"
                else decide(interval, threshold, margin, cannot_decide),
                "noise": noise,  # reported, not a veto: the interval already carries the spread
            }
        )
    planned_b = _planned_cells(meta[1])
    unread_plan = (
        []
        if planned_b is not None
        else ["B's config cannot be read here (a plugin missing?): cells missing from B are not judged"]
    )
    broken = [
        {"cell_key": key, "label": ok_a.loc[key, "label"], "seq_len": ok_a.loc[key, "seq_len"],
         "now": b.loc[key, "status"] if key in b.index else "missing",
         "reason": b.loc[key, "reason"] if key in b.index else "in B's plan but not recorded"}
        for key in ok_a.index
        if key not in ok_b.index
        and (b.loc[key, "status"] in BROKEN if key in b.index else planned_b is not None and key in planned_b)
    ]  # fmt: skip
    return Comparison(
        table=pd.DataFrame(rows),
        broken=pd.DataFrame(broken),
        only_in_a=len(a.index.difference(b.index)),
        only_in_b=len(b.index.difference(a.index)),
        machine_notes=notes,
        plan_notes=unread_plan,
        measure=measure,
        threshold=threshold,
        margin=margin,
    )


def format_comparison(result: Comparison, run_a: Path, run_b: Path) -> str:
    lines = [
        f"Comparing A = {run_a} with B = {run_b}: per cell the ratio (> 1: B is slower) of its in-turn speedup "
        "against the baseline, A / B, where both runs have one (measure 'speedup'), else of its median time, B / A "
        f"('time'), with a 95% interval. slower / faster: the whole interval beyond {100 * result.threshold:g}%; "
        f"same: within ±{100 * result.margin:g}%; inconclusive: too wide to tell."
    ]
    if result.machine_notes:
        lines.append("The runs come from different machines or software (speedups still compare; times do not):")
        lines += [f"  - {note}" for note in result.machine_notes]
    lines += result.plan_notes
    if result.only_in_a or result.only_in_b:
        lines.append(f"Cells in only one run: {result.only_in_a} in A, {result.only_in_b} in B.")
    if not result.broken.empty:
        lines.append(
            f"{len(result.broken)} cell(s) ok in A stopped working in B (a regression: error, crash, "
            "timeout, out of memory, unsupported, or missing from a run that planned them):"
        )
        lines += [f"  - {r.label} N={r.seq_len}: {r.now} ({r.reason})" for r in result.broken.itertuples()]
    table = result.table
    if table.empty:
        lines.append("No cell ran ok in both runs: nothing to compare (are these runs of the same config?).")
        return "\n".join(lines)
    decode = bool(table.decode.any())
    if decode:
        lines.append(
            "Decode cells (setting …/decode): A and B are per generated token (ms/token, or the speedup per token); "
            "'memory B/A' is the cache kept at N; 'prefill B/A' the prompt's one call, timed once (shown, not judged)."
        )

    def times(value: float, row) -> str:
        if row.measure == "speedup":
            return ratio_text(value)
        return format_number(value, ".3g" if row.decode else ".2f") + (" ms/token" if row.decode else " ms")

    rows = [
        [
            r.label,
            str(r.seq_len),
            r.setting,
            r.input,
            r.measure,
            times(r.a, r),
            times(r.b, r),
            interval_text(r.ratio, r.low, r.high, ".3f", unit=""),
            ratio_text(r.memory_ratio, ".3f", unit=""),
            *([ratio_text(r.prefill_ratio, ".3f", unit="")] if decode else []),
            f"{format_number(r.error_a, '.3g')} → {format_number(r.error_b, '.3g')}",
            r.verdict + (f"; noisy: {r.noise}" if r.noise else ""),
        ]
        for r in table.itertuples()
    ]
    headers = [
        "variant",
        "N",
        "setting",
        "input",
        "measure",
        "A",
        "B",
        "ratio [95% CI]",
        "memory B/A",
        *(["prefill B/A"] if decode else []),
        "error vs uniform",
        "verdict",
    ]
    lines.append(markdown_table(headers, rows))
    counts = table.verdict.str.replace(r" \(.*", "", regex=True).value_counts().to_dict()
    lines.append("Verdicts: " + ", ".join(f"{count} {name}" for name, count in counts.items()))
    moved = table[table.verdict.str.contains(r"its time: (?:slower|faster)", regex=True)]
    if len(moved):
        lines.append(
            f"The baseline's own time changed in {len(moved)} cell(s) (its time: slower or faster): a slower or "
            "faster machine, or a change of the baseline itself; every speedup above is relative to it. Judge the "
            "baseline with --measure time (one quiet machine)."
        )
    return "\n".join(lines)
