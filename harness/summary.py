"""The summary printed at the end of a run: one table per N with time, speedup vs `full`, memory, error."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from attnbench.analysis import scaling_table
from attnbench.results import read_results

BASELINE = "full"
GROUP_COLUMNS = ["device", "dtype", "causal", "mode", "input", "batch", "heads", "head_dim"]


def format_number(value: float | None, spec: str) -> str:
    """`value` formatted with `spec`, or a dash when it is missing (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec)


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def summary_tables(frame: pd.DataFrame) -> str:
    """Markdown: a heading per configuration group and N, a row per variant label."""
    parts = []
    for group, group_frame in frame.groupby(GROUP_COLUMNS, sort=False):
        heading = ", ".join(f"{k}={v}" for k, v in zip(GROUP_COLUMNS, group))
        for n, cells in group_frame.groupby("seq_len"):
            base = cells[(cells.variant == BASELINE) & (cells.status == "ok")]
            base_time = base.time_median_s.iloc[0] if len(base) else float("nan")
            base_mem = base.peak_mem_bytes.iloc[0] if len(base) else float("nan")
            rows = []
            for _, cell in cells.iterrows():
                if cell.status != "ok":
                    rows.append([cell.label, cell.status, "", "", "", "", "", str(cell.reason)[:90]])
                    continue
                rows.append(
                    [
                        cell.label,
                        "ok",
                        f"{format_number(cell.time_median_s * 1e3, '.2f')} ± "
                        f"{format_number(cell.time_iqr_s * 1e3, '.2f')}",
                        format_number(base_time / cell.time_median_s, ".2f") + "×",
                        format_number(cell.peak_mem_bytes / 2**20, ".1f"),
                        format_number(cell.peak_mem_bytes / base_mem if base_mem else float("nan"), ".2f") + "×",
                        format_number(cell.err_vs_uniform, ".3g"),
                        f"rel {format_number(cell.err_rel_fro, '.2e')}; {cell.self_check}".rstrip("; "),
                    ]
                )
            headers = [
                "variant",
                "status",
                "time ms (median ± IQR)",
                f"speedup vs {BASELINE}",
                "peak MiB",
                f"mem vs {BASELINE}",
                "err vs uniform",
                "notes",
            ]
            parts.append(f"### {heading}, N={n}\n\n{markdown_table(headers, rows)}\n")
        scaling = scaling_table(group_frame)
        if len(scaling) and (scaling.points > 1).any():
            rows = [
                [r.label, r.n_range, format_number(r.time_slope, ".2f"), format_number(r.memory_slope, ".2f")]
                for r in scaling.itertuples()
                if r.points > 1
            ]
            table = markdown_table(["variant", "N range", "time slope", "memory slope"], rows)
            parts.append(f"### {heading}: log-log slopes (1 = linear, 2 = quadratic)\n\n{table}\n")
    return "\n".join(parts)


SUMMARY_PREAMBLE = """# attnbench summary: {run_id}

Time: median ± IQR of repeated calls. Peak memory: beyond the inputs ({mem_note}).
Error vs uniform: ||O − O*|| / ||U − O*||, O* exact softmax attention in float64 and U the uniform average
of V over the visible keys; 0 is exact, 1 is no better than ignoring Q and K.

"""


def write_summary(run_dir: Path) -> str:
    """Build summary.md for a run folder and return its text."""
    frame = read_results(run_dir)
    methods = ", ".join(sorted(set(frame.mem_method) - {""})) or "none measured"
    text = SUMMARY_PREAMBLE.format(run_id=run_dir.name, mem_note=methods) + summary_tables(frame)
    (run_dir / "summary.md").write_text(text)
    return text
