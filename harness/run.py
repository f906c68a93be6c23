"""Orchestrate a run: groups in order, budgets and skips, resume, and the executor that measures each group.

Executors: `InProcess` measures a group in this process; `Isolated` in a child process per group, which
reports each step it starts on a channel of its own (a file, never stdout, which a plugin may write to), so
a crash or a hang is pinned on the cell in flight: that cell is recorded `crashed` or `timeout`, and the
rest of its group is measured again without it; `attnbench.ray_executor.RayExecutor` sends each group to a
Ray task, several at a time. An executor takes the groups as they come (each after the budget skips that
the results so far imply) and yields each group's result as it finishes. The run folder has one writer,
this process.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, TypeVar

import torch
from attnbench.config import Settings, SweepConfig
from attnbench.machine import allocator_note, best_peaks, machine_info, measure_peaks, remember_peaks
from attnbench.measure import GroupResult, measure_group, memory_limit
from attnbench.plan import Cell, Group
from attnbench.registry import Registry
from attnbench.registry import registry as default_registry
from attnbench.results import read_results, row_for
from attnbench.rundir import RunFolder, new_run_dir
from attnbench.worker import group_request, read_result_record
from tqdm import tqdm


PR_SET_PDEATHSIG = 1
STARTUP_S = 120.0  # the longest a worker may take to start (imports) before it is deemed hung
T = TypeVar("T")


class Executor(Protocol):
    def measure(self, groups: Iterator[Group]) -> Iterator[tuple[Group, GroupResult]]:
        """Each group's result as it finishes; the next group is drawn only when the executor can start it."""
        ...

    def close(self) -> None: ...


class OneAtATime:
    """Groups measured one after the other, each before the next is drawn (budgets see every result)."""

    def run_group(self, group: Group) -> GroupResult:
        raise NotImplementedError

    def measure(self, groups: Iterator[Group]) -> Iterator[tuple[Group, GroupResult]]:
        for group in groups:
            yield group, self.run_group(group)

    def close(self) -> None:
        pass


class InProcess(OneAtATime):
    """Each group measured in this process (on a thread of its own, see `interruptible`); self-checks shared
    across groups."""

    def __init__(self, settings: Settings, registry: Registry) -> None:
        self.settings, self.registry = settings, registry
        self.self_checks: dict[tuple, tuple[bool, str]] = {}

    def run_group(self, group: Group) -> GroupResult:
        return interruptible(lambda: measure_group(group, self.settings, self.registry, self_checks=self.self_checks))


_abandoned: list[threading.Event] = []  # the "finished" flags of measurements left running by an interrupt


def interruptible(work: Callable[[], T]) -> T:
    """`work()` on a thread of its own while this thread waits, so that Ctrl-C (or SIGTERM) stops the run within
    a fraction of a second even inside one long torch call, which holds no GIL but never returns to Python
    where a signal could stop it. An interrupted call is abandoned: the process must exit soon after
    (`exit_now_if_abandoned`), its finished rows already on disk.

    The wait is on an Event, not `Thread.join`: a join interrupted by KeyboardInterrupt marks a running thread
    as stopped (CPython 3.11), and the abandoned call would then go unnoticed."""
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:  # handed to the waiting thread
            outcome["error"] = error
        finally:
            finished.set()

    threading.Thread(target=target, name="attnbench-measure", daemon=True).start()
    try:
        while not finished.wait(0.1):
            pass
    except BaseException:
        _abandoned.append(finished)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def exit_now_if_abandoned(code: int) -> None:
    """After an interrupt: leave at once when a measurement still runs on its thread (it cannot be stopped, and
    waiting for it is what Ctrl-C was pressed to avoid; a normal exit would tear torch down under it and abort);
    output is flushed first."""
    if any(not finished.is_set() for finished in _abandoned):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM handled like Ctrl-C while a run measures: finished rows kept, meta.json says interrupted."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signal: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Isolated(OneAtATime):
    """Each group in a child process (`python -m attnbench.worker`): a segfault, a hard out-of-memory kill
    or a hang costs the cell in flight, not the run. A step with no progress for `cell_timeout_s` is killed."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        remove_stale_worker_folders()

    def run_group(self, group: Group) -> GroupResult:
        rows, samples = [], []
        while group.cells:
            result, culprits = self._attempt(group)
            if not culprits:
                return GroupResult(rows + result.rows, samples + result.samples)
            rows += culprits  # the cell in flight (or, in a group step, every cell); the rest measured again
            group = group.without({row.cell_key for row in culprits})
        return GroupResult(rows, samples)

    def _attempt(self, group: Group) -> tuple[GroupResult, list[Any]]:
        with tempfile.TemporaryDirectory(prefix=f"{WORKER_FOLDER}{os.getpid()}-") as folder:
            channel, errors = Path(folder) / "channel.jsonl", Path(folder) / "stderr.txt"
            request = json.dumps(group_request(group, self.settings))
            process = subprocess.Popen(
                [sys.executable, "-m", "attnbench.worker", str(channel)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,  # whatever a plugin prints is not our concern
                stderr=errors.open("w"),  # a file, not a pipe: a chatty plugin cannot fill it and block
                text=True,
                preexec_fn=_die_with_parent,
            )
            assert process.stdin is not None
            process.stdin.write(request)
            process.stdin.close()
            last_change, size = time.monotonic(), -1
            while process.poll() is None:
                time.sleep(0.05)
                # progress is the channel growing; its last step is read only when the watchdog fires
                if channel.exists() and channel.stat().st_size != size:
                    size, last_change = channel.stat().st_size, time.monotonic()
                # until its first step the worker is importing torch: slow on a busy machine, not a hang
                limit = self.settings.cell_timeout_s if size > 0 else max(self.settings.cell_timeout_s, STARTUP_S)
                if time.monotonic() - last_change > limit:
                    process.kill()
                    process.wait()
                    last_step = _last_step(channel)
                    cells, where = _in_flight(group, last_step)
                    reason = (
                        f"no progress within cell_timeout_s={self.settings.cell_timeout_s:g} s ({where}); "
                        "the group's process was killed"
                    )
                    return GroupResult([]), [row_for(cell, status="timeout", reason=reason) for cell in cells]
            stderr = errors.read_text(errors="replace")
            records = _records(channel)
            final = next((r for r in records if "rows" in r), None)
            if process.returncode == 0 and final is not None:
                return read_result_record(final), []
            if process.returncode < 0:
                name = signal.Signals(-process.returncode).name
                why = f"killed by {name}" + (" (likely the system's out-of-memory killer)" if name == "SIGKILL" else "")
            else:
                why = f"exited with status {process.returncode}"
            last_step = next((r for r in reversed(records) if "step" in r), None)
            tail = " | ".join(stderr.strip().splitlines()[-3:])
            cells, where = _in_flight(group, last_step)
            reason = f"the group's process {why} ({where}): {tail}"
            return GroupResult([]), [row_for(cell, status="crashed", reason=reason) for cell in cells]


WORKER_FOLDER = "attnbench-worker-"  # + the parent's pid + a random part: a worker's channel and stderr


def remove_stale_worker_folders() -> None:
    """Worker folders whose parent process is gone (a `kill -9` of an --isolate run leaves its folder behind)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{WORKER_FOLDER}*-*"):
        pid = folder.name.removeprefix(WORKER_FOLDER).split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:  # alive, another user's
            continue


def _die_with_parent() -> None:
    """In the worker, before it starts: ask Linux to kill it when the parent dies (no orphan keeps timing)."""
    try:
        ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: an orphan finishes its group and exits
        pass


def _records(channel: Path) -> list[dict[str, Any]]:
    if not channel.exists():
        return []
    out = []
    for line in channel.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the last line, cut short by a kill
            continue
    return out


def _last_step(channel: Path) -> dict[str, Any] | None:
    return next((r for r in reversed(_records(channel)) if "step" in r), None)


def _in_flight(group: Group, step: dict[str, Any] | None) -> tuple[list[Cell], str]:
    """The cells the worker's last step concerned, and that step in words: one cell's step (its self-check, output,
    timing, ...), or a step of the whole group (starting, building the inputs, the exact reference): every cell."""
    if step is None:
        return list(group.cells), "while starting: importing attnbench, torch and the plugins, before any step"
    key = step.get("cell") or ""
    cell = next((c for c in group.cells if c.key() == key), None)
    if cell is None:
        return list(group.cells), f"while {step.get('step')} of the whole group, before any cell ran"
    return [cell], f"{step.get('step')} of {cell.variant.label()}"


class Budgets:
    """Once a variant is over its time budget, out of memory, crashed or timed out at some N, or measured a peak
    over the memory limit (its cost() understated it), its larger N (same series: every other axis equal) are
    skipped with that reason."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.time_budget_s = settings.time_budget_s
        self.over: dict[str, tuple[int, str]] = {}  # series -> (the N it went over at, why)

    def note(self, cell: Cell, status: str, median_s: float | None, peak_bytes: float | None = None) -> None:
        reason = None
        if status in ("oom", "crashed", "timeout"):
            reason = f"{'out of memory' if status == 'oom' else status} at N={cell.seq_len}"
        elif status == "ok" and median_s is not None and median_s == median_s and median_s > self.time_budget_s:
            reason = (
                f"{cell.variant.label()} took {median_s:.3g} s at N={cell.seq_len}, "
                f"over time_budget_s={self.time_budget_s:g}"
            )
        elif status == "ok" and peak_bytes is not None and peak_bytes == peak_bytes:
            limit, source = memory_limit(self.settings, cell.device)
            if peak_bytes > limit:
                reason = (
                    f"{cell.variant.label()} measured a peak of {peak_bytes / 2**20:,.0f} MiB at N={cell.seq_len}, "
                    f"over the limit {limit / 2**20:,.0f} MiB ({source}): its cost() understates its memory"
                )
        known = self.over.get(cell.series_key())
        if reason is not None and (known is None or cell.seq_len < known[0]):
            self.over[cell.series_key()] = (cell.seq_len, reason)

    def skip_reason(self, cell: Cell) -> str | None:
        """Why `cell` is skipped: its series went over at a smaller N (any input: time barely depends on it)."""
        known = self.over.get(cell.series_key())
        return None if known is None or cell.seq_len <= known[0] else f"larger N skipped: {known[1]}"


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


def _measure_peaks(config: SweepConfig, trials: int = 5) -> dict[str, Any]:
    peaks = {}
    for device in config.axes["device"]:
        for dtype in config.axes["dtype"]:
            try:
                peaks[f"{device}/{dtype}"] = measure_peaks(device, getattr(torch, dtype), trials=trials)
            except Exception as error:  # e.g. cuda asked for on a machine without it: cells say so too
                peaks[f"{device}/{dtype}"] = {"error": f"{type(error).__name__}: {error}"}
    return peaks


EXECUTORS = ("local", "ray")


class Processes(OneAtATime):
    """`--processes k`: each group measured in k fresh worker processes, one after another (each timing
    `min_run_time / k`), merged by `attnbench.processes.merge_processes`: the spread between processes enters
    every speedup interval."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.each = Isolated(replace(settings, min_run_time=settings.min_run_time / settings.processes))

    def run_group(self, group: Group) -> GroupResult:
        from attnbench.processes import merge_processes

        results = [self.each.run_group(group) for _ in range(self.settings.processes)]
        return merge_processes(group, results, self.settings.baseline)


def _executor(
    name: str, settings: Settings, registry: Registry, *, isolate: bool, address: str | None, say
) -> Executor:
    if name == "ray":
        from attnbench.ray_executor import RayExecutor

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
) -> Path:
    """Measure every group of `config` into a new folder under `out_root` (or `run_dir`); returns the folder.

    With `resume`, `run_dir` is an earlier run: only its missing cells are measured, budgets replayed.
    `executor` "ray" sends each group to a Ray task (a local runtime, or the cluster at `address`).
    """
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
            else:
                meta = {
                    "run_id": run_dir.name,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "command": command or [],
                    "config": config.to_dict(),
                    "overrides": config.overrides,
                    "cells": len(config.cells()),
                    "duplicate_cells_removed": config.duplicates(),
                    "machine": machine_info(config.axes["device"]),
                    "cpu_allocator": allocator_note(),
                    "isolated": isolate,
                    "executor": executor if address is None else f"{executor} at {address}",
                }
            folder.write_meta(meta)  # first, before any work: a run killed at once is still a run folder
            if not resume:
                folder.write_text("config.toml", config.to_toml())  # `attnbench run <run>/config.toml` runs it again
            if "peaks" not in meta:
                say("measuring this machine's matmul and copy peaks (the yardsticks of efficiency)…")
                meta["peaks"] = _measure_peaks(config)
                folder.write_meta(meta)
            remember_peaks(meta["peaks"])  # the guard's time estimates use them
            budgets = Budgets(config.settings)
            done: set[str] = set()
            if resume and (run_dir / "results.csv").exists():
                finished = read_results(run_dir).drop_duplicates("cell_key", keep="last").set_index("cell_key")
                done = set(finished.index)
                # a group whose rows a kill cut short is measured again whole (with its baseline), its rows and
                # samples forgotten: a resume sees a group done or not done, never half
                half: set[str] = set()
                for group in config.groups():
                    keys = {cell.key() for cell in group.cells}
                    if 0 < len(keys & done) < len(keys):
                        half |= keys
                done -= half
                for cell in config.cells():
                    if cell.key() in done:
                        row = finished.loc[cell.key()]
                        budgets.note(cell, row["status"], row["time_median_s"], row.get("peak_mem_bytes"))
            if resume:  # every row and sample of a cell not done goes (a group cut short, or samples written with
                # no rows before a full disk): each cell is measured again from nothing, its samples one measurement's
                folder.forget({cell.key() for cell in config.cells()} - done)
            todo = [group.without(done) for group in config.groups()]
            todo = [group for group in todo if group.cells]
            if executor == "ray":  # the cluster actually joined, and attnbench on each of its nodes
                meta.update(measuring.meta)
                folder.write_meta(meta)
            bar = tqdm(total=sum(len(g.cells) for g in todo), disable=not progress, unit="cell", dynamic_ncols=True)
            def peaks_between() -> None:  # a quiet moment between groups may show a higher peak than the ends
                if executor == "local":  # on Ray the groups run on other machines than this one
                    meta["peaks_between"] = best_peaks(meta.get("peaks_between", {}), _measure_peaks(config, trials=2))

            try:
                with terminate_as_interrupt():
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
                peaks_at_end=_measure_peaks(config),
            )
            folder.write_meta(meta)
    finally:
        measuring.close()  # Ray: outstanding tasks cancelled, a runtime we started stopped (again: idempotent)
    return run_dir
