"""Compare two runs cell by cell: time, memory and error ratios with a noise-aware verdict.

A time change counts only when it is larger than the spread of both measurements (the larger IQR) and
than a relative floor; smaller moves are noise, not regressions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from attnbench.results import read_results
from attnbench.summary import format_number, markdown_table

NOISE_FLOOR = 0.03  # relative changes below 3% are never called, whatever the IQR


@dataclass
class Comparison:
    table: pd.DataFrame  # one row per cell present and ok in both runs
    only_in_a: int
    only_in_b: int
    machine_notes: list[str]

    def regressions(self, above_percent: float) -> pd.DataFrame:
        return self.table[(self.table.verdict == "slower") & (100 * (self.table.time_ratio - 1) > above_percent)]


def verdict(time_a: float, iqr_a: float, time_b: float, iqr_b: float) -> str:
    """'faster' / 'slower' when B moved beyond both runs' noise, else 'same (within noise)'."""
    change = time_b - time_a
    if abs(change) <= max(iqr_a, iqr_b, NOISE_FLOOR * time_a):
        return "same (within noise)"
    return "slower" if change > 0 else "faster"


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


def compare_runs(run_a: Path, run_b: Path) -> Comparison:
    a, b = read_results(run_a), read_results(run_b)
    ok_a, ok_b = a[a.status == "ok"].set_index("cell_key"), b[b.status == "ok"].set_index("cell_key")
    shared = ok_a.index.intersection(ok_b.index)
    rows = []
    for key in shared:
        x, y = ok_a.loc[key], ok_b.loc[key]
        rows.append(
            {
                "label": x["label"],
                "seq_len": x["seq_len"],
                "device": x["device"],
                "dtype": x["dtype"],
                "mode": x["mode"],  # x.dtype: the Series'
                "causal": x.causal,
                "input": x["input"],
                "time_a_ms": 1e3 * x.time_median_s,
                "time_b_ms": 1e3 * y.time_median_s,
                "time_ratio": y.time_median_s / x.time_median_s,
                "memory_ratio": y.peak_mem_bytes / x.peak_mem_bytes if x.peak_mem_bytes else float("nan"),
                "error_a": x.err_vs_uniform,
                "error_b": y.err_vs_uniform,
                "verdict": verdict(x.time_median_s, x.time_iqr_s, y.time_median_s, y.time_iqr_s),
            }
        )
    meta = [
        json.loads((run / "meta.json").read_text()) if (run / "meta.json").exists() else {} for run in (run_a, run_b)
    ]
    return Comparison(
        pd.DataFrame(rows),
        len(ok_a.index.difference(ok_b.index)),
        len(ok_b.index.difference(ok_a.index)),
        machine_differences(*meta),
    )


def format_comparison(result: Comparison, run_a: Path, run_b: Path) -> str:
    lines = [f"Comparing A = {run_a} with B = {run_b}: ratios are B / A."]
    if result.machine_notes:
        lines.append("The runs come from different machines or software, so differences mix code and setting:")
        lines += [f"  - {note}" for note in result.machine_notes]
    if result.only_in_a or result.only_in_b:
        lines.append(f"Cells ok in only one run (not compared): {result.only_in_a} in A, {result.only_in_b} in B.")
    table = result.table
    if table.empty:
        lines.append("No cell ran ok in both runs.")
        return "\n".join(lines)
    rows = [
        [
            r.label,
            str(r.seq_len),
            f"{r.device}/{r.dtype}/{r.mode}{'/causal' if r.causal else ''}",
            r.input,
            format_number(r.time_a_ms, ".2f"),
            format_number(r.time_b_ms, ".2f"),
            format_number(r.time_ratio, ".3f"),
            format_number(r.memory_ratio, ".3f"),
            f"{format_number(r.error_a, '.3g')} → {format_number(r.error_b, '.3g')}",
            r.verdict,
        ]
        for r in table.itertuples()
    ]
    lines.append(
        markdown_table(
            [
                "variant",
                "N",
                "setting",
                "input",
                "A ms",
                "B ms",
                "time B/A",
                "memory B/A",
                "error vs uniform",
                "verdict",
            ],
            rows,
        )
    )
    counts = table.verdict.value_counts().to_dict()
    lines.append("Verdicts: " + ", ".join(f"{count} {name}" for name, count in counts.items()))
    return "\n".join(lines)
