"""A run measures on the main thread, where a user's code runs its calls: a call timed on a thread of its own paid
a second OpenMP team's start and spin (tests/benchmarks/harness_overhead.py times both ways). The watcher beside it
leaves the signal wiring as it found it."""

from __future__ import annotations

import signal
import threading

from attnbench.plan.config import parse_config
from attnbench.registry import registry
from attnbench.run import executors
from attnbench.run.executors import InProcess, if_stuck, interruptible
from helpers import tiny


def test_the_work_runs_on_the_main_thread_and_the_wakeup_fd_is_restored():
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    assert interruptible(lambda: threading.current_thread() is threading.main_thread())
    assert signal.set_wakeup_fd(before) == before  # nothing left registered
    assert not any(t.name == "attnbench-watch" and t.is_alive() for t in threading.enumerate())


def test_a_group_is_measured_on_the_main_thread(monkeypatch):
    seen = []
    real = executors.measure_group

    def spy(*args, **kwargs):
        seen.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(executors, "measure_group", spy)
    config = parse_config(tiny())
    [group] = config.plan().groups
    [row] = InProcess(config.settings, registry).run_group(group).rows
    assert seen == [True] and row.status == "ok"


def test_an_error_in_the_work_reaches_the_caller_and_the_stuck_actions_are_unregistered():
    def fails():
        raise ValueError("inside")

    with if_stuck(lambda: None):
        try:
            interruptible(fails)
        except ValueError as error:
            assert str(error) == "inside"
    assert executors._IF_STUCK == []
