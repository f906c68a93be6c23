"""A run on a busy machine: the threads fall to what the idle cores hold (a real busy loop beside it), and a group whose
times are the scheduler's is measured once more (at one thread unless the user set them) and, where it still is, left
unusable: no speedup, no verdict, and a comparison that will not decide on it."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from attnbench.measure import group as group_module
from attnbench.measure import machine, threads
from attnbench.measure.dispatch import measure_group
from attnbench.measure.noise import MEASURED_AGAIN
from attnbench.measure.threads import ThreadChoice
from attnbench.plan.config import parse_config
from attnbench.registry import registry
from attnbench.report.unusable import is_unusable
from helpers import tiny

DECODE = tiny(mode="decode", causal=True, variants=["full", {"name": "band", "window": 4}], decode_steps=4)


@contextmanager
def busy_loop() -> Iterator[None]:
    """Another process spinning on one core for as long as the block lasts."""
    spin = subprocess.Popen([sys.executable, "-c", "print('spinning', flush=True)\nwhile True: pass"],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert spin.stdout is not None and spin.stdout.readline().strip() == "spinning"
        time.sleep(0.05)
        yield
    finally:
        spin.kill()
        spin.wait()


def test_a_busy_loop_on_one_of_two_cores_leaves_one_thread(monkeypatch) -> None:
    monkeypatch.setattr(threads, "_last_seen", [])  # no earlier group's load: this one is watched
    with busy_loop():
        choice = threads.fit_threads(0, window_s=0.4, cores=2)
    if choice.competing is None:
        pytest.skip("no /proc/stat here: the load cannot be watched")
    assert choice.competing >= 0.7, choice  # the loop is seen
    assert choice.threads == 1 and choice.chosen and "1 thread fit" in choice.why


def test_the_user_s_threads_are_taken_without_watching() -> None:
    start = time.perf_counter()
    choice = threads.fit_threads(3)
    assert choice.threads == 3 and not choice.chosen and time.perf_counter() - start < 0.05


def stalls_while(monkeypatch, more_than: int) -> list[int]:
    """The group's times read as the scheduler's whenever it ran at more than `more_than` threads; the thread counts
    the rule was asked about, in order. The machine's peaks are given (measuring them takes seconds on a busy one)."""
    given = {"matmul_flops_per_s": 1e11, "copy_bytes_per_s": 3e10}
    monkeypatch.setattr(machine, "_known_peaks", {"cpu/float32": given, "cpu/float64": given})
    asked: list[int] = []

    def bound(timed, *, threads, competing, cores):
        asked.append(threads)
        return "full, band all took 24 ms while their work differs 8x" if threads > more_than else ""

    monkeypatch.setattr(group_module, "scheduler_bound", bound)
    return asked


def test_a_scheduler_bound_group_is_measured_once_more_at_one_thread_when_the_harness_chose_two(monkeypatch) -> None:
    asked = stalls_while(monkeypatch, more_than=1)
    monkeypatch.setattr(group_module, "fit_threads", lambda requested, watch: ThreadChoice(2, "test", chosen=True))
    config = parse_config(DECODE)
    [group] = config.plan().groups
    rows = measure_group(group, config.settings, registry).rows
    assert asked == [2, 1]
    assert all(row.status == "ok" and row.threads == 1 for row in rows)
    assert all(row.reruns.startswith(f"{MEASURED_AGAIN} 2 threads (full, band all took 24 ms") for row in rows)
    assert all(not is_unusable(row.noisy) and row.speedup is not None for row in rows)


def test_a_group_still_scheduler_bound_when_measured_once_more_is_unusable_and_has_no_speedup(monkeypatch) -> None:
    asked = stalls_while(monkeypatch, more_than=0)
    monkeypatch.setattr(group_module, "fit_threads", lambda requested, watch: ThreadChoice(1, "test", chosen=True))
    config = parse_config(DECODE)
    [group] = config.plan().groups
    rows = measure_group(group, config.settings, registry).rows
    assert asked == [1, 1] and {row.threads for row in rows} == {1}  # one more try, at one thread again
    assert all(row.reruns.startswith(f"{MEASURED_AGAIN} 1 thread (") for row in rows)
    assert all(is_unusable(row.noisy) and row.speedup is None and row.speedup_low is None for row in rows)
    assert all(row.time_median_s is not None for row in rows)  # the figures stay, marked


def test_the_user_s_threads_are_kept_when_a_group_is_measured_once_more(monkeypatch) -> None:
    asked = stalls_while(monkeypatch, more_than=1)
    config = parse_config({**DECODE, "threads": 2})
    [group] = config.plan().groups
    rows = measure_group(group, config.settings, registry).rows
    assert asked == [2, 2] and {row.threads for row in rows} == {2}
    assert all(is_unusable(row.noisy) and row.speedup is None for row in rows)


def test_the_report_draws_no_verdict_from_unusable_times_and_says_why(monkeypatch, tmp_path: Path) -> None:
    from attnbench.report.compare import compare_runs
    from attnbench.report.run_report import header_blocks
    from attnbench.report.summary import noise_line
    from attnbench.report.view import RunView
    from attnbench.run import sweep

    stalls_while(monkeypatch, more_than=1)
    monkeypatch.setattr(sweep, "_measure_peaks", lambda config, **_: dict(machine._known_peaks))  # seconds, here
    forward = tiny(variants=["full", {"name": "band", "window": 4}], threads=2)  # no decode: no read stream to measure
    bound = sweep.run_plan(parse_config(forward), tmp_path / "a", progress=False)
    view = RunView.read(bound)
    [verdict] = view.verdicts
    assert verdict.answers == []  # nothing judged at N=16
    assert "No speed verdict at N=16 (full, band all took 24 ms while their work differs 8x, at 2 threads)" in (
        verdict.sentence
    )
    assert "2 of them are unusable" in noise_line(view.frame)
    assert view.meta.raw["threads"]["unusable"] == 1 and view.meta.raw["threads"]["groups_by_threads"] == {"2": 1}
    said = " ".join(block.text for block in header_blocks(bound, view.meta, view.frame) if block.kind == "text")
    assert "Threads: 2, set by the user" in said and "measured once more, at 2 threads" in said
    assert "1 group stayed scheduler-bound: unusable" in said
    table = compare_runs(bound, bound).table
    [verdict] = table[table.label == "band(window=4)"].verdict
    assert verdict.startswith("inconclusive (") and "A's times scheduler-bound; B's times scheduler-bound" in verdict
