"""The summary printed at the end of a run: one table per N with time, speedup vs `full`, memory, error."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import pandas as pd
from attnbench.analysis import scaling_table
from attnbench.atomic import write_text_atomic
from attnbench.plan import GROUP_COLUMNS as CELL_GROUP_COLUMNS
from attnbench.results import read_results
from attnbench.rundir import read_samples

BASELINE = "full"  # the default baseline; a run's rows name the one they were measured against
GROUP_COLUMNS = [c for c in CELL_GROUP_COLUMNS if c != "seq_len"]  # a heading per setting, then a table per N


MACHINE = "machine"  # the kind of machine a cell was timed on (its device name): times are never mixed across kinds


def with_machine(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows with a `machine` column: the device name each cell was timed on. A row whose error alone was
    measured takes its timed sibling's (same setting, variant and N); a row that never ran (skipped, crashed)
    takes the one its setting ran on, so it is reported beside its setting's other cells."""
    if MACHINE in frame:
        return frame
    setting = [c for c in GROUP_COLUMNS if c != "input"]
    own = frame.device_name.fillna("").astype(str)
    timed = frame[frame.time_median_s.notna() & (own != "")]
    key = setting + ["label", "seq_len"]
    sibling = frame[key].merge(
        timed.drop_duplicates(key)[key + ["device_name"]].rename(columns={"device_name": "_sibling"}),
        on=key,
        how="left",
    )["_sibling"]
    ran = frame[own != ""]
    usual = frame[setting].merge(
        ran.drop_duplicates(setting)[setting + ["device_name"]].rename(columns={"device_name": "_usual"}),
        on=setting,
        how="left",
    )["_usual"]
    sibling.index = usual.index = frame.index
    machine = own.where(frame.time_median_s.notna() & (own != ""), sibling.fillna(own.where(own != "", usual)))
    return frame.assign(**{MACHINE: machine.fillna("").astype(str)})


def format_number(value: float | None, spec: str) -> str:
    """`value` formatted with `spec`, or a dash when it is missing (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec)


def shorten(text: str, width: int) -> str:
    """`text` cut to `width` characters with an ellipsis (for display; the CSV keeps it whole)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def aligned_table(
    headers: list[str], rows: list[list[str]], width: int | None = None, cuttable: tuple[int, ...] = ()
) -> str:
    """Plain columns padded to their widest cell, for a terminal. With `width`, a line that does not fit
    first wraps the headers onto several lines, then cuts columns with an ellipsis: the `cuttable` ones in
    their order (notes before names), then the widest; none below 8 characters."""
    body = [[str(c) for c in row] for row in rows]
    widths = [max([len(headers[i])] + [len(r[i]) for r in body]) for i in range(len(headers))]

    def excess() -> int:
        return sum(widths) + 2 * (len(widths) - 1) - (width or 0)

    if width is not None and excess() > 0:  # headers may wrap: a column as wide as its values and longest word
        widths = [max([len(w) for w in headers[i].split()] + [len(r[i]) for r in body]) for i in range(len(headers))]
    for column in cuttable:  # in the order given: the last one is cut only when the others are at their least
        if width is not None and excess() > 0:
            widths[column] = max(8, widths[column] - excess())
    while width is not None and excess() > 0:
        column = max(range(len(widths)), key=lambda i: widths[i])
        if widths[column] <= 8:
            break
        widths[column] = max(8, widths[column] - excess())
    wrapped = [textwrap.wrap(h, w, break_long_words=True) or [""] for h, w in zip(headers, widths)]
    header_lines = [[lines[k] if k < len(lines) else "" for lines in wrapped] for k in range(max(map(len, wrapped)))]
    lines = ["  ".join(shorten(c, w).ljust(w) for c, w in zip(row, widths)).rstrip() for row in header_lines + body]
    lines.insert(len(header_lines), "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def label_order(frame: pd.DataFrame) -> list[str]:
    """The one row order of every table: exact attention first, then by variant name and setting."""
    labels = frame[["family", "variant", "label"]].drop_duplicates("label")
    natural = labels.label.map(
        lambda text: tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text))
    )  # window=32 before window=128
    labels = labels.assign(_exact=labels.family != "exact", _natural=natural)
    return list(labels.sort_values(["_exact", "variant", "_natural"]).label)


def _cell_text(value: object) -> str:
    """A value safe inside a Markdown table cell: pipes escaped, line breaks as spaces."""
    return str(value).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(map(_cell_text, headers)) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(map(_cell_text, row)) + " |" for row in rows]
    return "\n".join(lines)


def speedup_text(row: pd.Series) -> str:
    """'2.31× [2.20–2.45]': the paired speedup against the group's baseline with its 95% interval."""
    if row.speedup is None or pd.isna(row.speedup):
        return "–"
    return f"{row.speedup:.2f}× [{format_number(row.speedup_low, '.2f')}–{format_number(row.speedup_high, '.2f')}]"


def baseline_of(frame: pd.DataFrame) -> str:
    named = frame.baseline.dropna()
    named = named[named != ""]
    return str(named.iloc[0]) if len(named) else BASELINE


def summary_tables(frame: pd.DataFrame) -> str:
    """Markdown: a heading per configuration group (and machine kind) and N, a row per variant label."""
    parts = []
    baseline = baseline_of(frame)
    frame = with_machine(frame)
    several = frame[MACHINE].nunique() > 1
    order = {label: index for index, label in enumerate(label_order(frame))}
    for group, group_frame in frame.groupby(GROUP_COLUMNS + [MACHINE], sort=False, dropna=False):
        heading = ", ".join(f"{k}={v}" for k, v in zip(GROUP_COLUMNS, group)) + (f", on {group[-1]}" if several else "")
        group_frame = group_frame.sort_values("label", key=lambda labels: labels.map(order))
        for n, cells in group_frame.groupby("seq_len"):
            if not cells.timed.fillna(True).astype(bool).any():
                rows = [
                    [
                        c.label,
                        c.status,
                        format_number(c.err_vs_uniform, ".3g"),
                        format_number(c.err_rel_fro, ".2e"),
                        shorten(str(c.reason), 90) if c.status != "ok" else c.self_check,
                    ]
                    for c in cells.itertuples()
                ]
                table = markdown_table(["variant", "status", "err vs uniform", "rel error", "notes"], rows)
                parts.append(f"### {heading}, N={n} (error only: timed on the setting's first input)\n\n{table}\n")
                continue
            base = cells[(cells.label == baseline) & (cells.status == "ok")]
            base_mem = base.peak_mem_bytes.iloc[0] if len(base) else float("nan")
            rows = []
            for _, cell in cells.iterrows():
                if cell.status != "ok":
                    rows.append([cell.label, cell.status, "", "", "", "", "", shorten(str(cell.reason), 90)])
                    continue
                notes = [f"rel {format_number(cell.err_rel_fro, '.2e')}", cell.self_check]
                notes += [f"noisy: {cell.noisy}"] if cell.noisy else []
                rows.append(
                    [
                        cell.label,
                        "ok",
                        f"{format_number(cell.time_median_s * 1e3, '.2f')} ± "
                        f"{format_number(cell.time_iqr_s * 1e3, '.2f')}",
                        speedup_text(cell),
                        format_number(cell.peak_mem_bytes / 2**20, ".1f"),
                        format_number(cell.peak_mem_bytes / base_mem if base_mem else float("nan"), ".2f") + "×",
                        format_number(cell.err_vs_uniform, ".3g"),
                        "; ".join(note for note in notes if note),
                    ]
                )
            headers = [
                "variant",
                "status",
                "time ms (median ± IQR)",
                f"speedup vs {baseline} [95% CI]",
                "peak MiB",
                f"mem vs {baseline}",
                "err vs uniform",
                "notes",
            ]
            parts.append(f"### {heading}, N={n}\n\n{markdown_table(headers, rows)}\n")
        scaling = scaling_table(group_frame)
        if len(scaling) and (scaling.points > 1).any():
            rows = [
                [
                    r.label,
                    r.n_range,
                    format_number(r.time_slope, ".2f") + (" (noisy cells: read with care)" if r.noisy else ""),
                    format_number(r.memory_slope, ".2f"),
                ]
                for r in scaling.itertuples()
                if r.points > 1
            ]
            table = markdown_table(["variant", "N range", "time slope", "memory slope"], rows)
            parts.append(f"### {heading}: log-log slopes (1 = linear, 2 = quadratic)\n\n{table}\n")
    return "\n".join(parts)


SUMMARY_PREAMBLE = """# attnbench summary: {run_id}

Time: median ± IQR of per-call samples. The variants of each group (same inputs and shape) are timed in
interleaved rounds, and the speedup is the median over rounds of the baseline's time / the variant's time
in the same round, with {interval}. Peak memory: one call, beyond the inputs ({mem_note}).
Error vs uniform: ||O − O*|| / ||U − O*||, O* exact softmax attention in float64 and U the uniform average
of V over the visible keys; 0 is exact, 1 is no better than ignoring Q and K.
{noise}
"""


def noise_line(frame: pd.DataFrame) -> str:
    """One sentence on how many timed cells are noisy and why (or that none is)."""
    ok = frame[(frame.status == "ok") & frame.time_median_s.notna()]
    noisy = ok[ok.noisy.fillna("") != ""]
    if ok.empty:
        return "Noise: no cell was timed."
    if noisy.empty:
        return f"Noise: none of {len(ok)} timed cells is flagged noisy (IQR ≤ 10% of the median, machine quiet)."
    busy = noisy.noisy.str.contains("other processes").sum()
    spread = noisy.noisy.str.contains("IQR").sum()
    return (
        f"Noise: {len(noisy)} of {len(ok)} timed cells are flagged noisy ({spread} by their spread, {busy} because "
        "other processes used the CPU while they ran); read their times with care, their in-turn speedups less so."
    )


def interval_words(frame: pd.DataFrame) -> str:
    """Which interval the run's speedups carry, and its coverage, in words (the report and summary say it)."""
    processes = pd.to_numeric(frame.get("processes"), errors="coerce").dropna() if len(frame) else pd.Series()
    if len(processes) and processes.max() > 1:
        return (
            f"a two-level bootstrap 95% interval over its {int(processes.max())} worker processes and their rounds "
            "(processes resampled, then rounds; seeded per cell): the spread between processes is in it"
        )
    coverage = pd.to_numeric(frame.get("speedup_coverage"), errors="coerce").dropna() if len(frame) else pd.Series()
    kind = "a distribution-free interval of that median from the order statistics of the per-round ratios"
    if coverage.empty:  # a run written before coverage was recorded: its intervals were percentile bootstraps
        return "a bootstrap 95% interval"
    low = float(coverage.min())
    if low >= 0.95:
        return f"{kind} (coverage ≥ {100 * low:.1f}%)"
    return f"{kind} (coverage ≥ 95% from 6 rounds; cells with fewer rounds have min–max, coverage ≥ {100 * low:.1f}%)"


def write_summary(run_dir: Path) -> str:
    """Build summary.md for a run folder and return its text."""
    frame = read_results(run_dir)
    methods = ", ".join(sorted(set(frame.mem_method) - {""})) or "none measured"
    from attnbench.verdict import verdict_markdown

    preamble = SUMMARY_PREAMBLE.format(
        run_id=run_dir.name, mem_note=methods, noise=noise_line(frame), interval=interval_words(frame)
    )
    verdict = verdict_markdown(frame, read_samples(run_dir))
    text = preamble + "\n## Verdict\n\n" + verdict + "\n## By N\n\n" + summary_tables(frame)
    write_text_atomic(run_dir / "summary.md", text)
    return text
