"""Orchestrate a run: groups in order, budgets and skips, resume, and the executor that measures each group.

Executors: `InProcess` measures a group in this process; `Isolated` in a child process per group, which
reports each step it starts on a channel of its own (a file, never stdout, which a plugin may write to), so
a crash or a hang is pinned on the cell in flight: that cell is recorded `crashed` or `timeout`, and the
rest of its group is measured again without it; `attnbench.run.ray_executor.RayExecutor` sends each group to a
Ray task, several at a time. An executor takes the groups as they come (each after the budget skips that
the results so far imply) and yields each group's result as it finishes. The run folder has one writer,
this process.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from tqdm import tqdm

from attnbench.measure.machine import allocator_note, machine_info, measure_peaks, remember_peaks
from attnbench.measure.noise import MEASURED_AGAIN, UNUSABLE
from attnbench.measure.threads import RULE, fit_threads
from attnbench.plan.cells import Cell, Group, Plan
from attnbench.plan.config import Settings, SweepConfig
from attnbench.registry import Registry
from attnbench.registry import registry as default_registry
from attnbench.run.budgets import Budgets
from attnbench.run.executors import Executor, InProcess, Isolated, Processes, if_stuck, terminate_as_interrupt
from attnbench.run.resume import finished_cells
from attnbench.runfolder.folder import RunFolder, new_run_dir
from attnbench.runfolder.meta import best_peaks
from attnbench.runfolder.results import read_results
from attnbench.runfolder.rows import row_for


def _run_groups(
    todo: list[Group],
    executor: Executor,
    folder: RunFolder,
    budgets: Budgets,
    bar: tqdm,
    between: Callable[[], None] = lambda: None,
) -> None:
    """Each group: cells over budget skipped, the rest measured, rows and samples appended as each finishes, then
    `between()` (the machine's peaks measured again, on this machine)."""

    def startable() -> Iterator[Group]:  # drawn lazily: a budget skip follows every result in so far
        for group in todo:
            skipped = [row_for(c, status="skipped", reason=budgets.skip_reason(c), timed=group.timed)
                       for c in group.cells if budgets.skip_reason(c)]  # fmt: skip
            if skipped:
                folder.append(skipped, [])
                bar.update(len(skipped))
            runnable = group.without({row.cell_key for row in skipped})
            if runnable.cells:
                bar.set_description(
                    f"N={group.setting.seq_len} {group.setting.mode} {group.setting.input.label()}"[:48]
                )
                yield runnable

    for _group, result in executor.measure(startable()):
        folder.append(result.rows, result.samples)
        for row in result.rows:
            budgets.note(Cell.from_key(row.cell_key), row.status, row.time_median_s, row.peak_mem_bytes)
        bar.update(len(result.rows))
        between()


def _measure_peaks(config: SweepConfig, trials: int = 5, streams: bool = True) -> dict[str, Any]:
    """The yardsticks per device and dtype; the read and write streams (a GB buffer, ~1 s) only for a run with decode
    cells and where `streams` (at its start and end, not between groups)."""
    peaks = {}
    for device in config.axes["device"]:
        for dtype in config.axes["dtype"]:
            try:
                with_streams = streams and "decode" in config.axes["mode"]
                peaks[f"{device}/{dtype}"] = measure_peaks(device, getattr(torch, dtype), trials=trials,
                                                           streams=with_streams)  # fmt: skip
            except Exception as error:  # e.g. cuda asked for on a machine without it: cells say so too
                peaks[f"{device}/{dtype}"] = {"error": f"{type(error).__name__}: {error}"}
    return peaks


def _thread_choice(requested: int, watched: bool = True) -> dict[str, Any]:
    """meta.json's record of how the run picks torch threads: the user's count, or the rule, and (`watched`) what it
    gives as the run starts (each timed group fits them again just before it: `attnbench.measure.threads`)."""
    chosen = {"requested": requested, "rule": "the user's count" if requested else RULE}
    return {**chosen, "at_start": fit_threads(requested).as_meta()} if watched else chosen


def _threads_by_group(frame: Any) -> dict[str, Any]:
    """What the timed groups ran at: groups per thread count, those measured again at one thread because their
    times were the scheduler's, and those left unusable."""
    groups = frame[frame.time_median_s.notna()].drop_duplicates("group_key")
    by_threads = groups.threads.dropna().value_counts().sort_index()
    return {
        "groups_by_threads": {str(int(t)): int(n) for t, n in by_threads.items()},
        "measured_again": int(groups.reruns.fillna("").astype(str).str.startswith(MEASURED_AGAIN).sum()),
        "unusable": int(groups.noisy.fillna("").astype(str).str.startswith(UNUSABLE).sum()),
    }


def _executor(
    name: str, settings: Settings, registry: Registry, *, isolate: bool, address: str | None, say
) -> Executor:
    if name == "ray":
        from attnbench.run.ray_executor import RayExecutor

        return RayExecutor(settings, address=address, isolate=isolate, say=say)
    if address is not None:
        raise ValueError("--address names a Ray cluster: use it with --executor ray")
    if settings.processes > 1:  # fresh processes each time: isolated by construction
        return Processes(settings)
    return Isolated(settings) if isolate else InProcess(settings, registry)


def run_plan(
    config: SweepConfig,
    out_root: Path = Path("results"),
    *,
    registry: Registry = default_registry,
    progress: bool = True,
    run_dir: Path | None = None,
    resume: bool = False,
    isolate: bool = False,
    command: list[str] | None = None,
    executor: str = "local",
    address: str | None = None,
    plan: Plan | None = None,
) -> Path:
    """Measure every group of `config` into a new folder under `out_root` (or `run_dir`); returns the folder.

    With `resume`, `run_dir` is an earlier run: only its missing cells are measured, budgets replayed.
    `executor` "ray" sends each group to a Ray task (a local runtime, or the cluster at `address`).
    `plan`: the config's cells and groups where the caller has expanded them already.
    """
    plan = plan or config.plan()
    def say(text: str) -> None:  # a status line on the terminal while no progress bar runs
        if progress:
            print(f"attnbench: {text}", file=sys.stderr, flush=True)

    # the executor first: a Ray cluster that cannot be joined (unreachable, a missing auth token, another
    # attnbench on a node) leaves no run folder behind
    measuring = _executor(executor, config.settings, registry, isolate=isolate, address=address, say=say)
    run_dir = run_dir or new_run_dir(out_root, config.name)
    try:
        with RunFolder(run_dir) as folder:
            if config.settings.threads:
                torch.set_num_threads(config.settings.threads)
            meta = folder.read_meta() if resume else {}
            if resume and meta:
                meta.setdefault("resumed", []).append(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
                if "interrupted" in meta:  # this resume goes on from there: kept as history, no longer the state
                    meta.setdefault("interrupted_before", []).append(meta.pop("interrupted"))
            else:
                meta = {
                    "run_id": run_dir.name,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "command": command or [],
                    "config": config.to_dict(),
                    "overrides": config.overrides,
                    "cells": len(plan.cells),
                    "duplicate_cells_removed": plan.duplicates,
                    "machine": machine_info(config.axes["device"]),
                    "cpu_allocator": allocator_note(),
                    "isolated": isolate,
                    "executor": executor if address is None else f"{executor} at {address}",
                    "threads": _thread_choice(config.settings.threads),
                }
            folder.write_meta(meta)  # first, before any work: a run killed at once is still a run folder
            if not resume:
                folder.write_text("config.toml", config.to_toml())  # `attnbench run <run>/config.toml` runs it again
            def interruptible(measure: Callable[[], Any]) -> Any:  # Ctrl-C or SIGTERM outside the groups too
                try:
                    with terminate_as_interrupt():
                        return measure()
                except KeyboardInterrupt:
                    folder.write_meta({**meta, "interrupted": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
                    raise

            if "peaks" not in meta:
                say("measuring this machine's matmul peak and copy, read and write bandwidths (the yardsticks of efficiency)…")
                meta["peaks"] = interruptible(lambda: _measure_peaks(config))
                folder.write_meta(meta)
            remember_peaks(meta["peaks"])  # the guard's time estimates use them
            budgets = Budgets(config.settings)
            done = finished_cells(folder, plan, budgets) if resume else set()
            todo = [group.without(done) for group in plan.groups]
            todo = [group for group in todo if group.cells]
            if executor == "ray":  # the cluster actually joined, and attnbench on each of its nodes
                meta.update(measuring.meta)
                folder.write_meta(meta)
            bar = tqdm(total=sum(len(g.cells) for g in todo), disable=not progress, unit="cell", dynamic_ncols=True)
            def peaks_between() -> None:  # a quiet moment between groups may show a higher peak than the ends
                if executor == "local":  # on Ray the groups run on other machines than this one
                    quick_look = _measure_peaks(config, trials=2, streams=False)
                    meta["peaks_between"] = best_peaks(meta.get("peaks_between", {}), quick_look)

            try:
                def stuck() -> None:  # an interrupt inside a call that does not return: meta.json says so
                    bar.close()
                    folder.write_meta({**meta, "interrupted": time.strftime("%Y-%m-%dT%H:%M:%S%z")})

                with terminate_as_interrupt(), if_stuck(stuck):
                    _run_groups(todo, measuring, folder, budgets, bar, peaks_between)
            except KeyboardInterrupt:  # stop cleanly: finished groups are on disk, the lock is released on exit
                if threading.current_thread() is threading.main_thread():  # a second Ctrl-C must not cut the cleanup
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                bar.close()
                meta["interrupted"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                folder.write_meta(meta)
                raise
            finally:
                measuring.close()  # Ray: outstanding tasks cancelled, a runtime we started stopped
            bar.close()
            frame = read_results(run_dir)

            say("measuring the machine's peaks again, at the end of the run…")
            meta.update(
                finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                status_counts=frame.status.value_counts().to_dict(),
                noisy_cells=int((frame.noisy.fillna("") != "").sum()),
                peaks_at_end=interruptible(lambda: _measure_peaks(config)),
            )
            meta.setdefault("threads", _thread_choice(config.settings.threads, watched=False))  # a run from before
            meta["threads"].update(_threads_by_group(frame))
            folder.write_meta(meta)
    finally:
        measuring.close()  # Ray: outstanding tasks cancelled, a runtime we started stopped (again: idempotent)
    return run_dir
