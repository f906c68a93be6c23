"""Text and frame helpers every report part shares: number formats, aligned and Markdown tables, variant order,
the baseline and machine columns, and the one-line words for a machine."""

from __future__ import annotations

import math
import re
import textwrap
from typing import Any

import pandas as pd

from attnbench.plan.cells import GROUP_COLUMNS as CELL_GROUP_COLUMNS
from attnbench.stats import CONFIDENCE


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


SMALL_RATIO = 0.095  # below this a ratio reads as its inverse: 0.0011 is "1/900×", where two decimals said "0.00×"
WHOLE_RATIO = 99.5  # from this a ratio reads whole: "1036×"


def ratio_text(value: float | None, spec: str = ".2f", unit: str = "×") -> str:
    """The one format of a ratio to a baseline (a speedup, a memory or time ratio, a compare's A/B), in every table,
    sentence and terminal line: `spec` from 0.095 ("0.51×", "12.17×"; sentences take ".3g"), whole from 99.5
    ("1036×"), and below 0.095 its inverse, "1/900×" (N whole below 100, else to two digits), so a tiny ratio never
    reads "0.00×"; a dash when missing."""
    if value is None or value != value:
        return "–"
    if value >= WHOLE_RATIO:
        return f"{value:.0f}{unit}"
    if value >= SMALL_RATIO or value <= 0:
        return f"{format(value, spec)}{unit}"
    inverse = 1 / value
    return f"1/{round(inverse) if inverse < WHOLE_RATIO else int(float(f'{inverse:.2g}'))}{unit}"


def interval_text(
    value: float | None, low: float | None, high: float | None, spec: str = ".2f", unit: str = "×"
) -> str:
    """'2.31× [2.20–2.45]', '1/900× [1/950–1/850]': a ratio and its 95% interval, each as `ratio_text` writes it."""
    return f"{ratio_text(value, spec, unit)} [{ratio_text(low, spec, '')}–{ratio_text(high, spec, '')}]"


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


def share_text(share: float | None) -> str:
    """A share of a cache kept: '1/8' for a share 1/k, else '0.3'; 'fixed' for a method without a knob."""
    if share is None or share != share:
        return "fixed"
    inverse = 1 / share
    return f"1/{round(inverse)}" if abs(inverse - round(inverse)) < 1e-6 else f"{share:g}"


def shorten(text: str, width: int) -> str:
    """`text` cut to `width` characters with an ellipsis (for display; the CSV keeps it whole)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def aligned_table(
    headers: list[str], rows: list[list[str]], width: int | None = None, breakable: tuple[int, ...] = ()
) -> str:
    """Plain columns padded to their widest cell, for a terminal. With `width`, a table that does not fit wraps
    cells onto several lines within their column, never cutting a figure: headers wrap first, then the widest column
    narrows, each down to its longest word (the `breakable` ones, free text such as notes and names, may break a
    word longer than BREAK_ABOVE characters). When even that is too wide, the rightmost columns are left out and
    named below."""
    body = [[str(c) for c in row] for row in rows]
    natural = [max([len(headers[i])] + [len(r[i]) for r in body]) for i in range(len(headers))]
    if width is None or _line_width(natural) <= width:
        return _render(headers, body, natural, breakable)
    longest = [max(len(word) for text in [headers[i]] + [r[i] for r in body] for word in text.split() or [""])
               for i in range(len(headers))]  # fmt: skip
    least = [min(natural[i], max(8, min(BREAK_ABOVE, longest[i]))) if i in breakable else longest[i]
             for i in range(len(headers))]  # fmt: skip
    cells = [max([len(w) for w in headers[i].split()] + [len(r[i]) for r in body]) for i in range(len(headers))]
    widths = list(natural)
    for floor in (cells, least):  # headers wrap first (their rows cost nothing), then the cells themselves
        while _line_width(widths) > width:  # narrow the widest column that can still narrow, a character at a time
            narrower = [i for i in range(len(widths)) if widths[i] > max(floor[i], least[i])]
            if not narrower:
                break
            widths[max(narrower, key=lambda i: widths[i])] -= 1
    if _line_width(widths) <= width or len(widths) == 1:
        return _render(headers, body, widths, breakable)
    kept = len(widths) - 1
    while kept > 1 and _line_width(least[:kept]) > width:
        kept -= 1
    left = ", ".join(" ".join(h.split()) for h in headers[kept:])
    table = aligned_table(headers[:kept], [r[:kept] for r in body], width, tuple(i for i in breakable if i < kept))
    return table + "\n" + textwrap.fill(f"(left out to fit {width} columns: {left}; a wider terminal shows them)", width)


BREAK_ABOVE = 20  # a breakable column breaks only words longer than this (a long name), never a shorter one


def _line_width(widths: list[int]) -> int:
    return sum(widths) + 2 * (len(widths) - 1)


def _render(headers: list[str], body: list[list[str]], widths: list[int], breakable: tuple[int, ...]) -> str:
    """Rows of wrapped cells: each row as many lines as its tallest cell, rows apart when any takes more than one."""

    def lines_of(row: list[str]) -> list[str]:
        cells = [
            textwrap.wrap(text, w, break_long_words=i in breakable,
                          break_on_hyphens=False) or [""]
            for i, (text, w) in enumerate(zip(row, widths))
        ]  # fmt: skip
        return [
            "  ".join((cell[k] if k < len(cell) else "").ljust(w) for cell, w in zip(cells, widths)).rstrip()
            for k in range(max(map(len, cells)))
        ]

    header = lines_of(headers)
    rows = [lines_of(row) for row in body]
    apart = any(len(lines) > 1 for lines in rows)
    out = header + ["  ".join("-" * w for w in widths)]
    for index, lines in enumerate(rows):
        out += ([""] if apart and index else []) + lines
    return "\n".join(out)


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
    """'2.31× [2.20–2.45]' (or '1/900× [1/950–1/850]'): the paired speedup against the group's baseline with its
    interval (what the interval is: `interval_kind`)."""
    if row.speedup is None or pd.isna(row.speedup):
        return "–"
    return interval_text(row.speedup, row.speedup_low, row.speedup_high)


CI = "95% CI"  # an interval of 6 rounds or more (order statistics), or a bootstrap's over worker processes
MIXED = f"{CI}, or as marked"  # a column of 95% intervals and some of fewer rounds, which say their own kind


def interval_kind(coverage: float | None) -> str:
    """What a speedup interval is, as its label says it: '95% CI', or for fewer than 6 rounds 'min–max of 3
    rounds, coverage 75%' (below 6 the order-statistic interval is the rounds' min–max, whose coverage 1 − 2·½ⁿ
    gives n). A missing coverage is a bootstrap's nominal 95% (`attnbench.stats.trusted`)."""
    if coverage is None or not coverage < CONFIDENCE:
        return CI
    rounds = round(math.log2(2 / (1 - coverage)))
    return f"min–max of {rounds} round{'s' if rounds > 1 else ''}, coverage {100 * coverage:.3g}%"


def interval_label(coverages: pd.Series) -> str:
    """The one label of a column of speedup intervals (the cells with a speedup): their kind when they share one,
    else '95% CI, or as marked' (each interval of fewer rounds then says its own kind: `speedup_cell`)."""
    kinds = {interval_kind(float(c)) for c in pd.to_numeric(coverages, errors="coerce").dropna()}
    return kinds.pop() if len(kinds) == 1 else CI if not kinds else MIXED


def speedup_cell(row: pd.Series, label: str) -> str:
    """`speedup_text` in a column labelled `label` (`interval_label`): with its own kind beside it where the label
    does not say it ('0.43× [0.09–1.13] (min–max of 3 rounds, coverage 75%)')."""
    text = speedup_text(row)
    kind = interval_kind(row.get("speedup_coverage"))
    return text if text == "–" or kind == (CI if label == MIXED else label) else f"{text} ({kind})"


def plain_text(markdown: str) -> str:
    """A Markdown sentence as a terminal shows it: code marks and bold removed."""
    return markdown.replace("`", "").replace("**", "")


def baseline_of(frame: pd.DataFrame) -> str:
    named = frame.baseline.dropna()
    named = named[named != ""]
    return str(named.iloc[0]) if len(named) else BASELINE
