"""Text and frame helpers every report part shares: number formats, aligned and Markdown tables, variant order,
the baseline and machine columns, and the one-line words for a machine."""

from __future__ import annotations

import math
import re
import textwrap
from typing import Any

import pandas as pd

from attnbench.plan.cells import GROUP_COLUMNS as CELL_GROUP_COLUMNS


def machine_words(machine: dict[str, Any], threads: set[int], load: tuple[float, float] | None) -> str:
    """The machine in one plain sentence: CPU, cores, memory, threads, load during the run, GPUs."""
    cores, usable = machine.get("cpu_cores"), machine.get("usable_cores")
    parts = [str(machine.get("cpu") or "unknown CPU")]
    if cores:
        parts.append(f"{cores} cores" + (f" ({usable} usable)" if usable and usable != cores else ""))
    if machine.get("memory_bytes"):
        parts.append(f"{machine['memory_bytes'] / 2**30:.0f} GiB memory")
    threads = threads or {machine.get("torch_threads")}
    parts.append(f"torch {', '.join(str(t) for t in sorted(t for t in threads if t))} thread(s)")
    if load is not None:
        parts.append(f"load {load[0]:.1f}–{load[1]:.1f} during the run")
    gpu_list = machine.get("gpus") or []
    if gpu_list:
        parts += [
            f"GPU {g['name']} ({g['memory_bytes'] / 2**30:.0f} GiB, driver {g.get('driver') or 'unknown'}, "
            f"CUDA {g.get('cuda') or 'unknown'})"
            for g in gpu_list
        ]
    else:
        parts.append("no GPU" if not machine.get("cuda_available") else "CUDA present")
    return ", ".join(parts)


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


def format_percent(share: float | None) -> str:
    """A share as a percent: whole from 10% ("73%"), two digits below ("0.31%"); a dash when it is missing."""
    if share is None or share != share:
        return "–"
    return f"{100 * share:.0f}%" if share >= 0.095 else f"{100 * share:.2g}%"


def recall_text(share: float) -> str:
    """A recall as a percent that never rounds a miss up to 100% ('99.6%'), nor a share down to 0% ('0.4%')."""
    if share == share and 0.995 <= share < 1:
        return f"{100 * share:.1f}%"
    return format_percent(share)


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
