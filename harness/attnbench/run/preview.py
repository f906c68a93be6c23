"""What a run will do before it does it (`attnbench run --dry-run`): every comparison group with its cells, the
cells the guard would skip and why, and each group's estimated peak memory and time, then the total.

The estimates are `attnbench.measure.estimate`'s, through the same admission the run applies (`measure.admit`), so a
cell the preview lists as skipped is skipped by the run. Times are lower bounds (the roofline at this machine's
measured peaks, with the calls the settings ask for); cells skipped at run time by the measured budget rule
(a call slower than time_budget_s) cannot be foreseen.
"""

from __future__ import annotations

import textwrap

from dataclasses import dataclass

from attnbench.measure.estimate import mib, seconds_text
from attnbench.measure.group import admit
from attnbench.plan.cells import Plan
from attnbench.plan.config import SweepConfig
from attnbench.registry import Registry


@dataclass
class GroupPreview:
    setting: str  # N, mode, input and the other axes that vary, in words
    cells: int
    runs: int
    peak_bytes: float
    seconds: float  # lower bound
    skipped: list[tuple[str, str]]  # (variant label, why)


def preview(config: SweepConfig, plan: Plan, registry: Registry) -> list[GroupPreview]:
    """Each group of `plan` (`config`'s) with its estimates, in the order the run measures them."""
    s = config.settings
    out = []
    for group in plan.groups:
        admissions = [(cell, admit(cell, s, registry)) for cell in group.cells]
        running = [(cell, a) for cell, a in admissions if a.runs and a.estimate is not None]
        seconds = running[0][1].estimate.group.reference_s if running else 0.0
        for _cell, admission in running:
            estimate = admission.estimate
            seconds += (
                estimate.seconds(s.min_rounds, s.min_run_time, s.time_budget_s) if group.timed else estimate.call_s
            )
        cell = group.setting
        out.append(
            GroupPreview(
                setting=f"N={cell.seq_len} {cell.mode} {'causal' if cell.causal else 'non-causal'} "
                f"{cell.input.label()} {cell.dtype} {cell.device} b{cell.batch}×h{cell.heads}×d{cell.head_dim}"
                + ("" if group.timed else " (error only)"),
                cells=len(group.cells),
                runs=len(running),
                peak_bytes=max((a.estimate.peak_bytes for _c, a in running), default=0.0),
                seconds=seconds,
                skipped=[(c.label(), a.fields.get("reason", "")) for c, a in admissions if not a.runs],
            )
        )
    return out


def preview_text(groups: list[GroupPreview], width: int) -> str:
    """The preview as a table and the skipped cells' reasons, then the total."""
    from attnbench.report.text import aligned_table

    rows = [
        [g.setting, f"{g.runs}/{g.cells}", mib(g.peak_bytes) if g.runs else "–", "≥ " + seconds_text(g.seconds)]
        for g in groups
    ]
    parts = [
        aligned_table(["group", "cells run", "peak memory", "time"], rows, width=width, breakable=(0,)),
    ]
    skipped: dict[tuple[str, str], list[str]] = {}  # (label, why) -> the groups it happens in
    for g in groups:
        for label, why in g.skipped:
            skipped.setdefault((label, why), []).append(g.setting.split()[0])
    if skipped:
        count = sum(len(where) for where in skipped.values())
        parts.append(textwrap.fill(f"{count} cell(s) the guard would skip or that cannot run:", width))
        parts += [textwrap.fill(f"{label} at {', '.join(dict.fromkeys(where))}: {why}", width, initial_indent="  ",
                                subsequent_indent="    ") for (label, why), where in skipped.items()]  # fmt: skip
    total = sum(g.seconds for g in groups)
    cells = sum(g.cells for g in groups)
    runs = sum(g.runs for g in groups)
    if runs == 0:
        parts.append(f"total: none of {cells} cells would run (the reasons above)")
        return "\n".join(parts)
    parts.append(textwrap.fill(
        f"total: {runs} of {cells} cells would run in {len(groups)} group{'s' if len(groups) != 1 else ''}, at least "
        f"{seconds_text(total)} of "
        f"measurement (roofline at this machine's measured peaks; real calls are slower), peak memory "
        f"{mib(max((g.peak_bytes for g in groups), default=0.0))}", width, subsequent_indent="  "
    ))  # fmt: skip
    return "\n".join(parts)
