"""Run a generation grid into its folder: the units with a row missing (or not ok), each unit's rows written as it
ends; the grid as resolved (grid.toml, what a resume reads back) and meta.json first. In this process, one unit
after another (the model loaded once), or each unit a Ray task (`--executor ray`)."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

from attnbench.generation.grid import GenerationGrid, Unit, row_key
from attnbench.generation.unit import UnitJob, UnitOutcome, run_unit, setting_row
from attnbench.plan.config import toml_value
from attnbench.runfolder.generations import GenerationRow, GenerationsFolder, generated_keys

GRID_FILE = "grid.toml"  # the grid as resolved, in its folder: what --resume runs
THREADS = 2  # CPUs a unit takes (a Ray task asks for them; local workers share them)


def grid_toml(grid: GenerationGrid) -> str:
    """The grid as resolved (overrides applied), as TOML."""
    return "\n".join(f"{key} = {toml_value(value)}" for key, value in grid.raw.items()) + "\n"


def unit_keys(grid: GenerationGrid, unit: Unit) -> list[str]:
    """The keys of every row a unit writes (shares and method specs do not depend on the prompt's length)."""
    return [row_key(unit, sample, setting) for sample in unit.samples for setting in grid.settings(unit.seq_len)]


def units_to_run(grid: GenerationGrid, done: set[str]) -> list[Unit]:
    return [unit for unit in grid.units() if not set(unit_keys(grid, unit)) <= done]


def missing_units(folder: Path) -> int | None:
    """How many units of the folder's grid (its grid.toml) have a row missing or not ok: 0 for a finished grid, None
    when its grid cannot be read any more (a user's task file moved): the rows are reported as they are."""
    from attnbench.generation.grid import read_grid
    from attnbench.plan.config import ConfigError

    if not (folder / GRID_FILE).is_file():
        return 0
    try:
        return len(units_to_run(read_grid(str(folder / GRID_FILE)), generated_keys(folder)))
    except ConfigError:
        return None


def run_on_node(job: UnitJob) -> UnitOutcome:
    """A Ray task: one unit on the node Ray chose, naming it."""
    import ray

    outcome = run_unit(job)
    outcome.node = ray.get_runtime_context().get_node_id()[:8]
    for row in outcome.rows:
        row.node, row.host = outcome.node, ""
    return outcome


def outcomes(jobs: list[UnitJob], executor: str, workers: int, address: str | None,
             say: Callable[[str], None]) -> Iterator[UnitOutcome]:  # fmt: skip
    """The units' outcomes as they end: Ray tasks, `workers` processes here, or one after another in this process."""
    failed = lambda job, why: UnitOutcome(job, reason=why)  # noqa: E731
    if executor == "ray":
        from attnbench.run.ray_executor import tasks_on_ray

        return tasks_on_ray(jobs, run_on_node, cpus=lambda job: job.threads, failed=failed, address=address, say=say)
    if workers > 1 and len(jobs) > 1:
        from attnbench.run.worker_pool import in_worker_processes

        return in_worker_processes(jobs, run_unit, jobs=workers, key=lambda job: job.unit.name(), failed=failed)
    return (run_unit(job) for job in jobs)


def failed_rows(grid: GenerationGrid, outcome: UnitOutcome) -> list[GenerationRow]:
    """A unit that failed whole: an error row for each of its rows, with the reason."""
    unit, host = outcome.job.unit, socket.gethostname() if not outcome.node else ""
    return [setting_row(unit, sample, setting, status="error", reason=outcome.reason, host=host, node=outcome.node)
            for sample in unit.samples for setting in grid.settings(unit.seq_len)]  # fmt: skip


def run_grid(
    grid: GenerationGrid,
    folder: Path,
    model_dir: Path,
    *,
    executor: str = "local",
    workers: int = 1,
    address: str | None = None,
    command: list[str] | None = None,
    say: Callable[[str], None] = lambda text: print(f"attnbench: {text}", file=sys.stderr),
) -> dict:
    """Run what of `grid` has no ok row in `folder` (RunFolderBusy when another process writes it); KeyboardInterrupt
    and RayUnavailable pass through with the finished units' rows kept. Returns the meta.json written."""
    with GenerationsFolder(folder) as writer:
        done = generated_keys(folder)
        todo = units_to_run(grid, done)
        before, meta = writer.started_meta(command or ["attnbench", "generate", grid.name], model_dir=str(model_dir),
                                           grid=grid.name, executor=executor, workers=workers)  # fmt: skip
        writer.write_meta(meta)
        writer.write_text(GRID_FILE, grid_toml(grid))
        total = len(grid.units())
        say(f"{len(todo)} of {total} units to run ({total - len(todo)} done already), "
            f"{len(grid.settings(grid.seq_lens[0]))} method settings each -> {folder}/")  # fmt: skip
        start = time.monotonic()
        threads = THREADS if executor == "ray" else max(1, THREADS // workers)
        jobs = [UnitJob(grid, unit, str(model_dir), threads) for unit in todo]
        phases = dict(before.get("phases", {}))
        for finished, outcome in enumerate(outcomes(jobs, executor, workers, address, say), 1):
            for phase, seconds in outcome.phases.items():
                phases[phase] = round(phases.get(phase, 0.0) + seconds, 3)
            rows = outcome.rows if not outcome.reason else failed_rows(grid, outcome)
            for row in rows:
                if row.key not in done:
                    writer.append(row)
            elapsed = time.monotonic() - start
            left = elapsed / finished * (len(todo) - finished)
            say(f"[{finished}/{len(todo)} units, {elapsed:.0f} s, ~{left:.0f} s left] {outcome.job.unit.name()}: "
                + (f"FAILED: {outcome.reason}" if outcome.reason else summary(outcome.rows)))  # fmt: skip
        seconds = before.get("seconds", 0.0) + round(time.monotonic() - start, 1)
        meta = {**meta, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(seconds, 1), "phases": phases}
        writer.write_meta(meta)
    if phases:
        say(phase_breakdown(phases))
    return meta


def phase_breakdown(phases: dict[str, float]) -> str:
    """One line: the seconds spent in each phase over the units (summed over workers), and each one's share."""
    total = sum(phases.values()) or 1.0
    parts = ", ".join(f"{name} {seconds:.0f} s ({seconds / total:.0%})" for name, seconds in phases.items() if seconds)
    return f"time by phase (summed over units): {parts}"


def summary(rows: list[GenerationRow]) -> str:
    """A progress line's figures: the exact model's score, and how many rows failed."""
    exact = [r for r in rows if r.variant == "full" and r.status == "ok"]
    errors = sum(r.status != "ok" for r in rows)
    scores = [r.score for r in exact if r.score is not None]
    text = f"exact model {sum(scores) / len(scores):.0%}" if scores else "continuation"
    return text + (f", {errors} rows failed" if errors else "")
