"""Safe at any size: every large allocation and every long call is estimated and refused before it happens;
Ctrl-C and SIGTERM stop a run within seconds even inside one long call, keeping every finished row."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from attnbench import AttentionVariant, Cost
from attnbench.measure.estimate import cell_estimate, group_cost, over_budget_reason
from attnbench.measure.machine import warm_allocator
from attnbench.measure.memory import LiveTensorPeak
from attnbench.measure.reference import exact_reference
from attnbench.plan.config import parse_config
from attnbench.registry import registry
from attnbench.runfolder.results import read_results
from helpers import answer_ctrl_c, only_run, run_cli, write_tiny

PEAKS = {  # a slow machine's yardsticks, so that the figures below do not depend on this one's
    "cpu/float32": {"matmul_flops_per_s": 1e11, "copy_bytes_per_s": 1e10},
    "cpu/float64": {"matmul_flops_per_s": 5e10, "copy_bytes_per_s": 1e10},
}


def one_cell(text: str):
    (cell,) = parse_config({"variants": ["full"], "heads": 1, "head_dim": 8, **text}).plan().cells
    return cell


def test_the_reference_is_computed_in_chunks_within_its_estimate() -> None:
    """Beyond its O(N·D) copies and outputs, the float64 reference holds a chunk of scores, never N x N."""
    n, chunk = 1024, 1024 * 64
    q, k, v = (torch.randn(1, 2, n, 16) for _ in range(3))
    with LiveTensorPeak(exclude=(q, k, v)) as tracker:
        exact_reference(q, k, v, causal=True, key_padding_mask=None, max_chunk_elements=chunk)
    assert tracker.peak < 2 * n * n * 8 / 4  # a quarter of one (b, h, N, N) float64 score matrix
    cost = group_cost(one_cell({"seq_lens": [n], "heads": 2, "head_dim": 16}), error=True, float64_peaks=None)
    o_of_n = 2 * n * 16 * 8 * (3 + 2)  # Q, K, V and the two outputs in float64
    assert tracker.peak <= o_of_n + 4 * 2 * 64 * n * 8  # and a few chunks
    assert cost.reference_peak_bytes >= o_of_n  # the estimate covers the copies


def test_a_call_far_over_the_time_budget_is_skipped_with_its_estimate() -> None:
    cell = one_cell({"seq_lens": [262144], "heads": 8, "head_dim": 64, "error": False})
    estimate = cell_estimate(cell, registry.create("full"), error=False, peaks=PEAKS)
    reason = over_budget_reason(estimate, time_budget_s=2.0)
    assert estimate.call_s > 1000  # 4 N^2 D H flops at 100 GFLOP/s: ~24 min
    assert reason is not None and reason.startswith("one call would take at least 23") and "time_budget_s" in reason


def test_the_reference_of_a_huge_n_is_refused_even_for_a_linear_variant() -> None:
    """N = 10^7 with one head of width 8 passes for `linear` itself; its float64 reference (N^2) cannot."""
    cell = one_cell({"seq_lens": [10**7]})
    estimate = cell_estimate(cell, registry.create("linear"), error=True, peaks=PEAKS)
    assert estimate.call_s < 1.0
    reason = over_budget_reason(estimate, time_budget_s=10.0)
    assert reason is not None and "float64 exact reference would take at least" in reason and "days" in reason
    assert "--no-error (error = false in a config)" in reason


@pytest.mark.slow
def test_huge_n_ends_within_seconds_with_reasons_and_exit_3(tmp_path: Path) -> None:
    """The command that once took the machine down (anon-rss 23 GB, exit 137) now skips every cell at once."""
    started = time.monotonic()
    result = run_cli(
        "run", "quick", "--variants", "full,full-math,band", "--seq-lens", "262144", "--no-progress",
        "--out", str(tmp_path), timeout=120,
    )  # fmt: skip
    assert time.monotonic() - started < 90
    assert result.returncode == 3, result.stderr
    frame = read_results(only_run(tmp_path))
    # full, full-math, band, band with sinks × 2 inputs, and causal (quick's [[also]]): full, band, band with sinks
    assert len(frame) == 11 and (frame.status == "skipped").all()
    reasons = frame.set_index(["label", "input"]).reason
    assert reasons[("full-math", "realistic")].startswith("estimated peak memory")
    assert "float64 exact reference would take at least" in reasons[("band(window=256)", "realistic")]
    report = run_cli("report", str(only_run(tmp_path)))
    assert report.returncode == 3 and "no cell ran ok" in report.stderr


def test_dry_run_prints_the_plan_and_its_estimates_without_a_run_folder(tmp_path: Path) -> None:
    result = run_cli("run", "quick", "--seq-lens", "256,262144", "--dry-run", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "N=256 fwd non-causal realistic" in out and "peak memory" in out and "≥ " in out
    said = " ".join(out.split())  # as read, the lines wrapped to the terminal joined
    assert "lsh(shared_qk=False) at N=262144: estimated peak memory" in said
    assert "band(window=256) at N=262144: the float64 exact reference would take at least" in said
    assert said.split("total: ")[-1].startswith("30 of 60 cells would run in 6 groups, at least")  # quick: 52 + 8 causal
    assert not any(tmp_path.iterdir())  # nothing was written


def test_report_on_a_run_folder_with_no_finished_cell_says_so(tmp_path: Path) -> None:
    from attnbench.runfolder.results import ResultsWriter

    run = tmp_path / "killed"
    run.mkdir()
    with ResultsWriter(run / "results.csv"):  # the header a run writes first, and no row
        pass
    result = run_cli("report", str(run))
    assert result.returncode == 3
    assert "has no finished cell" in result.stderr and "--resume" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_run_inside_one_long_call(installed_plugins, tmp_path: Path, stop: signal.Signals) -> None:
    """A 40-second torch call (SDPA on its thread pool) at N=64 never returns to Python; the run still stops
    within seconds (the watcher beside the main thread leaves 2 s after the signal, the call unfinished), exits 130
    (not torch's abort at a normal exit under a running kernel), keeps the rows of N=16 and says how to resume."""
    marker = tmp_path / "in-the-long-call"
    config = write_tiny(tmp_path / "long.toml", "seq_lens = [16, 64]\nvariants = ['long-call', 'full']\n", heads=2, head_dim=16)
    log = tmp_path / "run.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "attnbench.cli", "run", str(config), "--out", str(tmp_path / "out"), "--no-progress",
         "--no-report"],
        stdout=subprocess.DEVNULL, stderr=log.open("w"),
        env={**installed_plugins, "ATTNBENCH_TEST_LONG_CALL": str(marker)}, preexec_fn=answer_ctrl_c,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not marker.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), log.read_text()
        time.sleep(0.5)  # well inside the call
        sent = time.monotonic()
        process.send_signal(stop)
        time.sleep(0.05)
        process.send_signal(stop)  # pressed twice, as people do: the second must not cut the clean-up
        process.wait(timeout=30)
        stopped_after = time.monotonic() - sent
    finally:
        process.kill()
    err = log.read_text()
    assert process.returncode == 130, err
    # about a second on an idle machine; far less than the call's 40 s even when others load the machine
    assert stopped_after < 15, f"took {stopped_after:.1f} s to stop"
    run = only_run(tmp_path / "out")
    assert "attnbench run --resume" in err and "Traceback" not in err
    frame = read_results(run)
    assert set(frame.seq_len) == {16} and (frame.status == "ok").all()  # the finished group, whole
    assert "interrupted" in json.loads((run / "meta.json").read_text())


def test_the_warm_allocator_returns_what_it_kept() -> None:
    """Freed memory is kept for reuse only while timing: afterwards it goes back to the system."""

    def resident_mib() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20

    before = resident_mib()
    with warm_allocator():
        blocks = [torch.ones(2**24) for _ in range(8)]  # 8 x 64 MiB
        del blocks
        kept = resident_mib()
    after = resident_mib()
    assert kept - before > 256  # kept while timing (warm: no page faults on the next call)
    assert after - before < 64  # and returned after it


class Greedy(AttentionVariant):
    name, family, exact = "greedy", "test", False

    def cost(self, shape):
        return Cost(flops=1.0, bytes_moved=1.0, working_bytes=1.0)  # says it needs nothing

    def forward(self, q, k, v, *, causal, key_padding_mask):
        scratch = torch.ones(8 * 2**20)  # 32 MiB it never declared
        return torch.nn.functional.scaled_dot_product_attention(q, k, v) + scratch[0] * 0


def test_a_measured_peak_over_the_limit_skips_larger_n(toy_registry, tmp_path: Path) -> None:
    """A plugin whose cost() understates its memory passes the estimate once; its measured peak stops its larger N."""
    from attnbench.run.sweep import run_plan

    registry = toy_registry(Greedy)
    config = parse_config(
        {"variants": ["greedy"], "seq_lens": [16, 32], "heads": 1, "head_dim": 8, "memory_limit_gb": 0.02,
         "min_run_time": 0.01, "min_rounds": 2},
        registry=registry,
    )  # fmt: skip
    frame = read_results(run_plan(config, tmp_path, registry=registry, progress=False)).set_index("seq_len")
    assert frame.loc[16, "status"] == "ok" and frame.loc[16, "peak_mem_bytes"] > 0.02 * 2**30
    assert frame.loc[32, "status"] == "skipped"
    assert "measured a peak of 32 MiB at N=16, over the limit 20 MiB" in frame.loc[32, "reason"]


def test_a_sigterm_while_the_peaks_are_measured_stops_the_run_as_ctrl_c_does(tmp_path: Path, monkeypatch) -> None:
    """The machine's peaks are measured before the first group and after the last, outside the groups' own
    handling: a SIGTERM there is still an interrupt (not the default kill), and meta.json says the run was
    interrupted."""
    import os

    from attnbench.plan.config import parse_config
    from attnbench.run import sweep

    def terminated(config, trials: int = 5) -> dict:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises inside the sleep
        raise AssertionError("SIGTERM was not turned into an interrupt")

    monkeypatch.setattr(sweep, "_measure_peaks", terminated)
    before = signal.getsignal(signal.SIGTERM)
    config = parse_config({"variants": ["full"], "seq_lens": [16], "heads": 1, "head_dim": 8, "error": False,
                           "min_run_time": 0.01, "min_rounds": 2})  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        sweep.run_plan(config, tmp_path, progress=False)
    [run] = list(tmp_path.iterdir())
    assert "interrupted" in json.loads((run / "meta.json").read_text())
    assert signal.getsignal(signal.SIGTERM) is before  # the handler put back
    monkeypatch.setattr(sweep, "_measure_peaks", lambda config, trials=5, streams=True: {})
    sweep.run_plan(config, tmp_path, progress=False, run_dir=run, resume=True)  # resumed to the end
    meta = json.loads((run / "meta.json").read_text())
    assert "finished" in meta and "interrupted" not in meta and len(meta["interrupted_before"]) == 1
