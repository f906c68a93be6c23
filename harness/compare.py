"""Compare two runs cell by cell and decide from their timing samples, not from two medians.

For each cell in both runs: the ratio of median times B / A with a bootstrap 95% interval (each run's
samples resampled on their own), or with `speedups=True` the ratio of the in-turn speedups against the
baseline (robust across machines: each run's speedup was measured in turns on one machine). A cell is
"slower" or "faster" only when the whole interval clears the threshold; "inconclusive" when either side was
flagged noisy (a wide spread, or other processes competing for the CPU) or, for times, the two runs come
from different machines or software (the verdict names why); otherwise "same". A cell
that was ok in A and is not in B (error, crashed, missing) is a regression of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from attnbench.results import read_results
from attnbench.rundir import read_meta, read_samples
from attnbench.stats import Interval, ratio_of_medians
from attnbench.summary import format_number, markdown_table

DEFAULT_THRESHOLD = 0.05  # a change is called only when its interval clears 5% (or --fail-above)


@dataclass
class Comparison:
    table: pd.DataFrame  # one row per cell ok in both runs
    broken: pd.DataFrame  # cells ok in A that are not ok (or missing) in B
    only_in_a: int
    only_in_b: int
    machine_notes: list[str]
    measure: str  # "time" or "speedup"
    plan_notes: list[str] = field(default_factory=list)

    def regressions(self) -> pd.DataFrame:
        return self.table[self.table.verdict == "slower"] if len(self.table) else self.table

    def inconclusive(self) -> int:
        return int(self.table.verdict.str.startswith("inconclusive").sum()) if len(self.table) else 0


def machine_differences(meta_a: dict, meta_b: dict) -> list[str]:
    """What differs between the machines and software of two runs."""
    notes = []
    machine_a, machine_b = meta_a.get("machine", {}), meta_b.get("machine", {})
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


def _planned_cells(meta: dict) -> set[str] | None:
    """The cell keys of a run's stored config (None when it cannot be read here, e.g. a plugin is missing)."""
    from attnbench.config import ConfigError, parse_config

    try:
        return {cell.key() for cell in parse_config(meta["config"], source="meta.json").cells()}
    except (ConfigError, KeyError, TypeError, ValueError):
        return None


def decide(interval: Interval, threshold: float, why_inconclusive: str) -> str:
    """'slower' / 'faster' when the interval of B / A clears the threshold, 'inconclusive (...)' when it
    would but the measurement cannot carry it, else 'same'."""
    if interval.low != interval.low:  # NaN: nothing to decide with
        return f"inconclusive ({why_inconclusive})"
    side = interval.clears(threshold)
    if side is None:
        return "same"
    if why_inconclusive:
        return f"inconclusive ({why_inconclusive})"
    return "slower" if side == "above" else "faster"


def _noise_cause(x: pd.Series, y: pd.Series) -> str:
    causes = [
        f"{side} noisy: {row.noisy}" for side, row in (("A", x), ("B", y)) if isinstance(row.noisy, str) and row.noisy
    ]
    return "; ".join(causes)


def compare_runs(
    run_a: Path, run_b: Path, *, threshold: float = DEFAULT_THRESHOLD, speedups: bool = False
) -> Comparison:
    a, b = (read_results(run).drop_duplicates("cell_key", keep="last").set_index("cell_key") for run in (run_a, run_b))
    samples_a, samples_b = read_samples(run_a), read_samples(run_b)
    meta = [read_meta(r) for r in (run_a, run_b)]
    notes = machine_differences(*meta)
    machines_differ = "different machines or software" if notes else ""
    ok_a, ok_b = a[a.status == "ok"], b[b.status == "ok"]
    rows = []
    for key in ok_a.index.intersection(ok_b.index):
        x, y = ok_a.loc[key], ok_b.loc[key]
        if pd.isna(x.time_median_s) or pd.isna(y.time_median_s):
            continue  # an input whose error alone was measured (its setting was timed on another input)
        if speedups:
            if pd.isna(x.speedup) or pd.isna(y.speedup):
                continue
            baselines = "" if x.baseline == y.baseline else f"baselines differ: {x.baseline} vs {y.baseline}"
            # speedup B / speedup A, inverted so that > 1 means B got slower relative to its baseline
            interval = Interval(
                x.speedup / y.speedup,
                x.speedup_low / y.speedup_high if y.speedup_high else float("nan"),
                x.speedup_high / y.speedup_low if y.speedup_low else float("nan"),
            )
            # each speedup was measured in turns on one machine, so other machines are fine; a loaded one is not:
            # threads stolen by another process slow variants unequally (many small kernels more than one big)
            why = "; ".join(cause for cause in (baselines, _noise_cause(x, y)) if cause)
        else:
            sa, sb = samples_a.get(key), samples_b.get(key)
            if sa and sb:
                interval = ratio_of_medians(sa, sb)
            else:  # no samples (a run written before they were kept, or a lost file): no interval to decide on
                ratio = y.time_median_s / x.time_median_s
                interval = Interval(ratio, float("nan"), float("nan"))
            missing = [side for side, found in (("A", sa), ("B", sb)) if not found]
            no_samples = f"no timing samples in {' and '.join(missing)}" if missing else ""
            why = "; ".join(cause for cause in (no_samples, machines_differ, _noise_cause(x, y)) if cause)
        rows.append(
            {
                "cell_key": key,
                "label": x["label"],
                "seq_len": x["seq_len"],
                "setting": f"{x['device']}/{x['dtype']}/{x['mode']}{'/causal' if x.causal else ''}",
                "input": x["input"],
                "a": x.speedup if speedups else 1e3 * x.time_median_s,
                "b": y.speedup if speedups else 1e3 * y.time_median_s,
                "ratio": interval.estimate,
                "low": interval.low,
                "high": interval.high,
                "memory_ratio": y.peak_mem_bytes / x.peak_mem_bytes if x.peak_mem_bytes else float("nan"),
                "error_a": x.err_vs_uniform,
                "error_b": y.err_vs_uniform,
                "verdict": decide(interval, threshold, why),
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
        measure="speedup" if speedups else "time",
    )


def format_comparison(result: Comparison, run_a: Path, run_b: Path) -> str:
    what = "speedup vs baseline, A / B" if result.measure == "speedup" else "time, B / A"
    lines = [f"Comparing A = {run_a} with B = {run_b}: ratios of {what} (> 1: B is slower), 95% intervals."]
    if result.machine_notes:
        lines.append("The runs come from different machines or software; a time change there is inconclusive:")
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
    unit = "×" if result.measure == "speedup" else " ms"
    rows = [
        [
            r.label,
            str(r.seq_len),
            r.setting,
            r.input,
            format_number(r.a, ".2f") + unit,
            format_number(r.b, ".2f") + unit,
            f"{format_number(r.ratio, '.3f')} [{format_number(r.low, '.3f')}–{format_number(r.high, '.3f')}]",
            format_number(r.memory_ratio, ".3f"),
            f"{format_number(r.error_a, '.3g')} → {format_number(r.error_b, '.3g')}",
            r.verdict,
        ]
        for r in table.itertuples()
    ]
    headers = [
        "variant",
        "N",
        "setting",
        "input",
        "A",
        "B",
        "ratio [95% CI]",
        "memory B/A",
        "error vs uniform",
        "verdict",
    ]
    lines.append(markdown_table(headers, rows))
    counts = table.verdict.str.replace(r" \(.*", "", regex=True).value_counts().to_dict()
    lines.append("Verdicts: " + ", ".join(f"{count} {name}" for name, count in counts.items()))
    return "\n".join(lines)
