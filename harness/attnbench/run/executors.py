"""Executors: how a group is measured — in this process, in a child process that may crash alone, or in several
processes at once — and the interrupt handling they share (Ctrl-C and SIGTERM stop between groups)."""

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

from attnbench.measure.dispatch import measure_group
from attnbench.measure.group import GroupResult
from attnbench.plan.cells import Cell, Group
from attnbench.plan.config import Settings
from attnbench.registry import Registry
from attnbench.run.worker import group_request, read_result_record
from attnbench.runfolder.rows import row_for

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
    """Each group measured in this process (on the main thread, a watcher beside it: `interruptible`); self-checks shared
    across groups."""

    def __init__(self, settings: Settings, registry: Registry) -> None:
        self.settings, self.registry = settings, registry
        self.self_checks: dict[tuple, tuple[bool, str]] = {}

    def run_group(self, group: Group) -> GroupResult:
        return interruptible(lambda: measure_group(group, self.settings, self.registry, self_checks=self.self_checks))


GRACE_S = 2.0  # after Ctrl-C or SIGTERM, how long a call may run on before the process leaves without it
_IF_STUCK: list[Callable[[], None]] = []  # what an interrupt inside a call that does not return must still do


@contextmanager
def if_stuck(action: Callable[[], None]) -> Iterator[None]:
    """While inside, `action` (mark meta.json interrupted, say how to resume) is run should an interrupt find the
    main thread inside one long call (`interruptible`), before the process leaves; the latest registered first."""
    _IF_STUCK.append(action)
    try:
        yield
    finally:
        _IF_STUCK.remove(action)


def interruptible(work: Callable[[], T]) -> T:
    """`work()` on this thread, the main one, and a watcher beside it: Ctrl-C (or SIGTERM) stops the run within
    seconds even inside one long torch call, which never returns to Python where a signal could stop it.

    The call runs where a user's own code would run it: on the main thread. Timed on a thread of its own, each
    OpenMP parallel region paid a second thread team's start and spin (a band decode step took 3-4x its
    main-thread time: tests/benchmarks/harness_overhead.py). The watcher hears a signal through the wakeup fd
    (`signal.set_wakeup_fd`: written by the C-level handler, at once, while the main thread is inside the call);
    if the main thread has not left the work `GRACE_S` later, the `if_stuck` actions run and the process exits
    130 (its finished rows are on disk). Off the main thread (Ray's workers, tests) `work()` simply runs."""
    from attnbench.measure.memory import ready_profiler

    ready_profiler()  # the memory measure's profiler registered before the work
    if threading.current_thread() is not threading.main_thread():
        return work()
    stops = {signal.SIGINT, signal.SIGTERM}
    left = threading.Event()
    decided = threading.Lock()  # the watcher leaving, or the work ending: one of them, never both
    held = signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # set-up whole: a signal now waits for the try below
    try:
        read, write = os.pipe()
        os.set_blocking(write, False)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)

        def watch() -> None:
            while True:
                try:
                    heard = os.read(read, 64)
                except OSError:
                    return
                if not heard or left.is_set():
                    return
                if {int(s) for s in stops} & set(heard) and not left.wait(GRACE_S) and decided.acquire(blocking=False):
                    for action in reversed(_IF_STUCK):  # still inside the call: leave without it
                        try:
                            action()
                        except Exception:  # noqa: BLE001 - leaving anyway; the next action may still help
                            pass
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(130)

        watcher = threading.Thread(target=watch, name="attnbench-watch", daemon=True)  # inherits the mask: the
        watcher.start()  # signals go to the main thread, whose C handler writes the wakeup fd
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    try:
        return work()
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # tear-down whole, then a pending signal is raised
        try:
            decided.acquire()  # the watcher, if it is leaving, leaves first (this never returns then)
            left.set()
            signal.set_wakeup_fd(previous)
            try:
                os.write(write, b"\0")  # wakes the watcher, which sees `left` and returns
            except OSError:
                pass
            watcher.join(timeout=1.0)
            os.close(write)
            os.close(read)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


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
    """Each group in a child process (`python -m attnbench.run.worker`): a segfault, a hard out-of-memory kill
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
                [sys.executable, "-m", "attnbench.run.worker", str(channel)],
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
    return [cell], f"{step.get('step')} of {cell.label()}"


class Processes(OneAtATime):
    """`--processes k`: each group measured in k fresh worker processes, one after another (each timing
    `min_run_time / k`), merged by `attnbench.run.processes.merge_processes`: the spread between processes enters
    every speedup interval."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.each = Isolated(replace(settings, min_run_time=settings.min_run_time / settings.processes))

    def run_group(self, group: Group) -> GroupResult:
        from attnbench.run.processes import merge_processes

        results = [self.each.run_group(group) for _ in range(self.settings.processes)]
        return merge_processes(group, results, self.settings.baseline)


