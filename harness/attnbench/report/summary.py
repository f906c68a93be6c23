"""The summary printed at the end of a run: one table per N with time, speedup vs `full`, memory, error."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnbench.atomic import write_text_atomic
from attnbench.report.analysis import compile_sentence, implausible_timings, scaling_table
from attnbench.report.modes import DECODE_NOTE, has_decode, mib_text, mode_of, ms_text, read_rate_text
from attnbench.report.text import (
    GROUP_COLUMNS,
    MACHINE,
    baseline_of,
    format_number,
    interval_label,
    label_order,
    markdown_table,
    ratio_text,
    shorten,
    speedup_cell,
    with_machine,
)
from attnbench.report.evidence import Unfinished, evidence_markdown, opening_markdown, opening_terminal, unfinished
from attnbench.report.tuning import tuning_sentences
from attnbench.report.unusable import unusable_mask
from attnbench.report.verdict import verdict_markdown, verdict_terminal
from attnbench.report.view import RunView


def summary_tables(frame: pd.DataFrame) -> str:
    """Markdown: a heading per configuration group (and machine kind) and N, a row per variant label; the mode in its
    words, and a decode group's step time, cache and prefill in place of a call's time and peak memory."""
    parts = []
    baseline = baseline_of(frame)
    frame = with_machine(frame)
    several = frame[MACHINE].nunique() > 1
    order = {label: index for index, label in enumerate(label_order(frame))}
    for group, group_frame in frame.groupby(GROUP_COLUMNS + [MACHINE], sort=False, dropna=False):
        values = dict(zip(GROUP_COLUMNS, group))
        mode = mode_of(values["mode"])
        values["mode"] = mode.words
        heading = ", ".join(f"{k}={v}" for k, v in values.items()) + (f", on {group[-1]}" if several else "")
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
            if mode.decode:
                parts.append(f"### {heading}, N={n}\n\n{_decode_table(cells, baseline)}\n")
                continue
            base = cells[(cells.label == baseline) & (cells.status == "ok")]
            base_mem = base.peak_mem_bytes.iloc[0] if len(base) else float("nan")
            interval = interval_label(cells.speedup_coverage[cells.speedup.notna()])
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
                        speedup_cell(cell, interval),
                        format_number(cell.peak_mem_bytes / 2**20, ".1f"),
                        ratio_text(cell.peak_mem_bytes / base_mem if base_mem else float("nan")),
                        format_number(cell.err_vs_uniform, ".3g"),
                        "; ".join(note for note in notes if note),
                    ]
                )
            headers = [
                "variant",
                "status",
                "time ms (median ± IQR)",
                f"speedup vs {baseline} [{interval}]",
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
            memory = "cache slope" if mode.decode else "memory slope"
            table = markdown_table(["variant", "N range", "time slope", memory], rows)
            parts.append(f"### {heading}: log-log slopes (1 = linear, 2 = quadratic)\n\n{table}\n")
    return "\n".join(parts)


def _decode_table(cells: pd.DataFrame, baseline: str) -> str:
    """One decode group at one N: per variant its step time, speedup per token, the cache and prefill, the read
    bandwidth a step achieved (and its share of the machine's), the error."""
    base = cells[(cells.label == baseline) & (cells.status == "ok")]
    base_cache = base.cache_bytes.iloc[0] if len(base) and base.cache_bytes.iloc[0] else float("nan")
    interval = interval_label(cells.speedup_coverage[cells.speedup.notna()])
    rows = []
    for _, cell in cells.iterrows():
        if cell.status != "ok":
            rows.append([cell.label, cell.status, "", "", "", "", "", "", shorten(str(cell.reason), 90)])
            continue
        notes = [f"rel {format_number(cell.err_rel_fro, '.2e')}"] + ([f"noisy: {cell.noisy}"] if cell.noisy else [])
        rows.append(
            [
                cell.label,
                "ok",
                f"{ms_text(cell.time_median_s)} ± {ms_text(cell.time_iqr_s)}",
                speedup_cell(cell, interval),
                f"{mib_text(cell.cache_bytes)} ({ratio_text(cell.cache_bytes / base_cache)})",
                ms_text(cell.prefill_s),
                read_rate_text(cell.get("step_read_bytes_per_s"), cell.get("read_share")),
                format_number(cell.err_vs_uniform, ".3g"),
                "; ".join(notes),
            ]
        )
    headers = [
        "variant",
        "status",
        "step ms (median ± IQR)",
        f"speedup per token vs {baseline} [{interval}]",
        f"cache MiB (× {baseline})",
        "prefill ms",
        "read GB/s (of peak)",
        "err vs uniform",
        "notes",
    ]
    return markdown_table(headers, rows)


SUMMARY_PREAMBLE = """# attnbench summary: {run_id}

{opening}

Time: median ± IQR of per-call samples. The variants of each group (same inputs and shape) are timed in
interleaved rounds, and the speedup is the median over rounds of the baseline's time / the variant's time
in the same round, with {interval}. {reach} Peak memory: one call, beyond the inputs ({mem_note}).
Error vs uniform: ||O − O*|| / ||U − O*||, O* exact softmax attention in float64 and U the uniform average
of V over the visible keys; 0 is exact, 1 is no better than ignoring Q and K.
{noise}
"""


def noise_line(frame: pd.DataFrame) -> str:
    """One sentence on how many timed cells are noisy and why (or that none is), and the timings that cannot be
    right (`implausible_timings`)."""
    ok = timed_cells(frame)
    noisy = ok[ok.noisy.fillna("") != ""]
    if ok.empty:
        return "Noise: no cell was timed."
    implausible = [found.phrase for found in implausible_timings(frame)]
    odd = (
        f" Implausible: {'; '.join(implausible)}: the machine changed between those groups; do not read their "
        "speedups, measure those N again in one run."
        if implausible
        else ""
    )
    if noisy.empty:
        return f"Noise: none of {len(ok)} timed cells is flagged noisy (IQR ≤ 10% of the median, machine quiet).{odd}"
    spread = noisy.noisy.str.contains("IQR").sum()
    bound = int(unusable_mask(noisy).sum())
    unusable = (f" {bound} of them are unusable: their group's times were the scheduler's (a thread waiting for a "
                "core another process held), and no speedup or verdict is drawn from them.") if bound else ""
    return (
        f"Noise: {len(noisy)} of {len(ok)} timed cells are flagged noisy ({spread} by their spread, "
        f"{len(busy_cells(ok))} because other processes used the CPU while they ran); read their times with care, "
        f"their in-turn speedups less so.{unusable}{odd}"
    )


def timed_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """The cells that ran ok and were timed."""
    return frame[(frame.status == "ok") & frame.time_median_s.notna()]


def busy_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """The timed cells measured while other processes used the CPU (the noise flag `measure` sets on them)."""
    timed = timed_cells(frame)
    return timed[timed.noisy.fillna("").astype(str).str.contains("other processes")]


def reach_sentence(frame: pd.DataFrame) -> str:
    """What a speedup interval does not cover, said once: another run. It covers this run's own rounds; on a
    machine that was busy while the run measured (other processes beside its cells, the load it recorded), a
    rerun may land outside it."""
    said = ("An interval covers the rounds of this one run only: it says how closely this run pinned its median, "
            "not where a rerun will land.")  # fmt: skip
    busy, timed = busy_cells(frame), timed_cells(frame)
    if busy.empty:
        return said
    loads = pd.concat([frame.load_before, frame.load_after]).dropna() if "load_before" in frame else []
    span = sorted({f"{loads.min():.1f}", f"{loads.max():.1f}"}, key=float) if len(loads) else []
    load = f", 1-minute load {'–'.join(span)}" if span else ""
    return (f"{said} The machine was busy during this run ({len(busy)} of {len(timed)} timed cells ran while other "
            f"processes used the CPU{load}): a figure may move between runs by more than its interval.")  # fmt: skip


def terminal_answer(view: RunView, lacking: Unfinished | None, width: int) -> str:
    """What `run` and `report` print on stdout, in order: what the verdict rests on (and what is missing), the
    verdict, `--tune`'s answer, and once what an interval does not cover (`reach_sentence`)."""
    import textwrap

    parts = [opening_terminal(view.frame, lacking, view.evidence, width) + "\n", verdict_terminal(view.blocks, width)]
    tuned = tuning_sentences(view.tuning, baseline_of(view.frame), view.budget.max_error, view.budget.min_recall)
    parts += [textwrap.fill(said.replace("`", ""), width, subsequent_indent="  ") for said in tuned]
    parts.append(textwrap.fill(reach_sentence(view.frame), width))
    return "\n".join(parts)


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


def write_summary(run_dir: Path, view: RunView | None = None) -> str:
    """Build summary.md for a run folder (from `view` where the caller has read it) and return its text."""
    view = view or RunView.read(run_dir)
    frame = view.frame
    methods = ", ".join(sorted(set(frame.mem_method) - {""})) or "none measured"
    opening = opening_markdown(frame, unfinished(run_dir, view.meta, frame))  # the evidence, and what it lacks
    preamble = SUMMARY_PREAMBLE.format(
        run_id=run_dir.name, opening=opening, mem_note=methods, noise=noise_line(frame),
        interval=interval_words(frame), reach=reach_sentence(frame),
    )
    verdict = verdict_markdown(view.blocks)
    if said := evidence_markdown(view.evidence):  # what the verdict rests on, before it
        verdict = said + "\n\n" + verdict
    if tuned := tuning_sentences(view.tuning, baseline_of(view.frame), view.budget.max_error, view.budget.min_recall):  # --tune's answer, after it
        verdict += "\n" + "\n\n".join(tuned) + "\n"
    compiled = compile_sentence(frame)
    verdict += f"\n{compiled}\n" if compiled else ""
    if has_decode(frame):
        preamble += DECODE_NOTE + "\n"
    text = preamble + "\n## Verdict\n\n" + verdict + "\n## By N\n\n" + summary_tables(frame)
    write_text_atomic(run_dir / "summary.md", text)
    return text
