"""What a run will do before it does it (`attnbench run --dry-run`): every comparison group with its cells, the
cells the guard would skip and why, and each group's estimated peak memory and time, then the total; with `--tune`,
the groups its search would measure after the sweep, and their time apart.

The estimates are `attnbench.measure.estimate`'s, through the same admission the run applies (`measure.admit`), so a
cell the preview lists as skipped is skipped by the run. Times are lower bounds (the roofline at this machine's
measured peaks, with the calls the settings ask for); cells skipped at run time by the measured budget rule
(a call slower than time_budget_s) cannot be foreseen. The tuning's groups are `attnbench.run.tune`'s own, found by
running its search with every probe answered, unmeasured, as within its rule (`tuning_groups`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from attnbench.measure.estimate import mib, seconds_text
from attnbench.measure.group import GroupResult, admit
from attnbench.plan.cells import Cell, Group, Plan
from attnbench.plan.config import Settings, SweepConfig
from attnbench.registry import Registry
from attnbench.runfolder.rows import row_for

NOT_COUNTED = "self-checks, compilation, drawing the inputs, the dropped-mass pass, the report"  # in no estimate here


@dataclass
class GroupPreview:
    setting: str  # N, mode, input and the other axes that vary, in words
    cells: int
    runs: int
    peak_bytes: float
    seconds: float  # lower bound
    skipped: list[tuple[str, str]]  # (variant label, why)


def setting_text(cell: Cell, *, with_input: bool = True) -> str:
    """A group's shared axes in words: 'N=8192 fwd causal realistic float32 cpu b1×h8×d64'."""
    return (
        f"N={cell.seq_len} {cell.mode} {'causal' if cell.causal else 'non-causal'} "
        + (f"{cell.input.label()} " if with_input else "")
        + f"{cell.dtype} {cell.device} b{cell.batch}×h{cell.heads}×d{cell.head_dim}"
    )


def group_preview(group: Group, settings: Settings, registry: Registry) -> GroupPreview:
    """One group's estimates: its reference once, then each running cell's calls (every call of a timed group; the
    one output call of a group whose error alone is measured)."""
    admissions = [(cell, admit(cell, settings, registry)) for cell in group.cells]
    running = [(cell, a) for cell, a in admissions if a.runs and a.estimate is not None]
    seconds = running[0][1].estimate.group.reference_s if running else 0.0
    for _cell, admission in running:
        estimate = admission.estimate
        seconds += (
            estimate.seconds(settings.min_rounds, settings.min_run_time, settings.time_budget_s)
            if group.timed
            else estimate.call_s
        )
    return GroupPreview(
        setting=setting_text(group.setting) + ("" if group.timed else " (error only)"),
        cells=len(group.cells),
        runs=len(running),
        peak_bytes=max((a.estimate.peak_bytes for _c, a in running), default=0.0),
        seconds=seconds,
        skipped=[(c.label(), a.fields.get("reason", "")) for c, a in admissions if not a.runs],
    )


def preview(config: SweepConfig, plan: Plan, registry: Registry) -> list[GroupPreview]:
    """Each group of `plan` (`config`'s) with its estimates, in the order the run measures them."""
    return [group_preview(group, config.settings, registry) for group in plan.groups]


def tuning_groups(config: SweepConfig, plan: Plan, registry: Registry) -> list[Group]:
    """The groups `--tune` measures after the sweep, in order: `attnbench.run.tune.tune` itself, each probe answered
    unmeasured as within its rule (no error, every needle recalled; a cell the guard refuses, refused as in the run).
    Every bisection then runs down to its knob's smallest value, its longest course, and the picks timed are the
    cheapest; a knob whose largest value is over the budget stops after one probe."""
    from attnbench.run.tune import tune

    groups: list[Group] = []

    def unmeasured(group: Group) -> GroupResult:
        groups.append(group)
        rows = []
        for cell in group.cells:
            status = admit(cell, config.settings, registry).fields.get("status", "ok")
            ok = status == "ok"
            rows.append(row_for(cell, status=status, err_vs_uniform=0.0 if ok else None,
                                needle_accuracy=1.0 if ok else None))  # fmt: skip
        return GroupResult(rows)

    tune(config, plan.cells, config.settings.max_error, unmeasured, say=lambda line: None)
    return groups


def tuning_preview(config: SweepConfig, plan: Plan, registry: Registry) -> list[GroupPreview]:
    """`--tune`'s groups (`tuning_groups`) summed per setting searched (N, mode, ...): its probes, error only on the
    inputs the verdict follows, and its picks timed with the baseline."""
    searches: dict[str, list[Group]] = {}
    for group in tuning_groups(config, plan, registry):
        searches.setdefault(group.setting.timing_key(), []).append(group)
    out = []
    for groups in searches.values():
        previews = [group_preview(group, config.settings, registry) for group in groups]
        out.append(GroupPreview(
            setting=f"{setting_text(groups[0].setting, with_input=False)} --tune: {len(groups)} groups",
            cells=sum(p.cells for p in previews), runs=sum(p.runs for p in previews),
            peak_bytes=max(p.peak_bytes for p in previews), seconds=sum(p.seconds for p in previews),
            skipped=[s for p in previews for s in p.skipped],
        ))  # fmt: skip
    return out


def preview_text(groups: list[GroupPreview], width: int, tuning: Sequence[GroupPreview] = ()) -> str:
    """The preview as a table (`--tune`'s lines after the sweep's) and the skipped cells' reasons, then the total:
    the sweep's time, and the tuning's apart."""
    from attnbench.report.text import aligned_table

    rows = [
        [g.setting, f"{g.runs}/{g.cells}", mib(g.peak_bytes) if g.runs else "–", "≥ " + seconds_text(g.seconds)]
        for g in [*groups, *tuning]
    ]
    parts = [
        aligned_table(["group", "cells run", "peak memory", "time"], rows, width=width, breakable=(0,)),
    ]
    skipped: dict[tuple[str, str], list[str]] = {}  # (label, why) -> the groups it happens in
    for g in [*groups, *tuning]:
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
    tuned = sum(g.seconds for g in tuning)
    tuning_words = (
        f", and --tune at least {seconds_text(tuned)} more ({sum(g.runs for g in tuning)} cells: its probes, error "
        f"only, as if each bisection ran its longest course, and its picks timed): at least "
        f"{seconds_text(total + tuned)} in all"
        if tuning else ""
    )  # fmt: skip
    parts.append(textwrap.fill(
        f"total: {runs} of {cells} cells would run in {len(groups)} group{'s' if len(groups) != 1 else ''}, at least "
        f"{seconds_text(total)} of measurement{tuning_words} (roofline at this machine's measured peaks; real calls "
        f"are slower; not counted: {NOT_COUNTED}), peak memory "
        f"{mib(max((g.peak_bytes for g in [*groups, *tuning]), default=0.0))}", width, subsequent_indent="  "
    ))  # fmt: skip
    return "\n".join(parts)
