"""Decode in the report's words and figures: the mode named, a step's speedup per token against full's KV cache, the
cache in place of the peak, prefill beside it, and the bandwidth roofline."""

from __future__ import annotations

import pandas as pd
import pytest
from attnbench.interface import mode_work
from attnbench.plan.budget import AccuracyBudget
from attnbench.report.analysis import of_roofline, scaling_table
from attnbench.report.modes import DECODE, FORWARD, mode_of
from attnbench.report.verdict import Choice, InputVerdict, judge, setting_words, verdict_rows

MIB = 2**20
PEAKS = {"cpu/float32": {"matmul_flops_per_s": 1e11, "copy_bytes_per_s": 1e10}}


def step(label: str, family: str, speedup: float, error: float, cache_mib: float, prefill_ms: float) -> Choice:
    """A decode candidate: its speedup per token (interval ±10%, none for the baseline's 1×), its cache (full's is
    16 MiB), and its prefill."""
    spread = 0.1 if speedup != 1 else 0.0
    return Choice(
        label, family, speedup, (1 - spread) * speedup, (1 + spread) * speedup, error, cache_mib * MIB,
        cache_mib / 16, "–", time_s=1e-3 / speedup, prefill_s=prefill_ms / 1e3,
    )  # fmt: skip


def decode_choices() -> list[Choice]:
    return [
        step("full", "exact", 1.0, 0.0, 16, 700),
        step("full(kv_cache=False)", "exact", 0.01, 0.0, 24, 760),
        step("band(sinks=4, window=1024)", "band", 3.2, 0.3, 4.02, 150),
        step("linear", "linear", 5.0, 0.99, 0.125, 180),
    ]


def test_a_decode_verdict_names_the_step_speedup_against_the_kv_cache_and_both_caches() -> None:
    answer = judge(4096, decode_choices(), "full", AccuracyBudget(), "realistic", DECODE)
    assert answer.use == "band(sinks=4, window=1024)"
    assert answer.sentence == (
        "Use band(sinks=4, window=1024), the fastest step within the error budget 0.5: 3.2× [2.88–3.52] faster per "
        "generated token than full's KV cache at error 0.3 vs uniform on `realistic`, cache 4.02 MiB vs 16.0 MiB."
    )
    asked = judge(4096, decode_choices(), "full", AccuracyBudget(min_speedup=2.0), "realistic", DECODE).asked
    assert asked.startswith("At least 2× faster per generated token than full's KV cache, least error: band")


def test_a_forward_verdict_keeps_its_words() -> None:
    answer = judge(4096, decode_choices(), "full", AccuracyBudget(), "realistic")
    assert answer.sentence.startswith("Use band(sinks=4, window=1024), the fastest within the error budget 0.5: 3.2×")
    assert "faster than full at error 0.3" in answer.sentence and answer.sentence.endswith(", 0.25× the peak memory of a call.")


def test_the_decode_table_shows_the_cache_and_prefill_not_the_peak() -> None:
    answer = judge(4096, decode_choices(), "full", AccuracyBudget(), "realistic", DECODE)
    verdict = InputVerdict("cpu", "realistic", "full", "", "realistic", mode=DECODE)
    headers, rows = verdict_rows(verdict, answer)
    assert headers == [
        "variant",
        "speedup per token vs full [95% CI]",
        "error vs uniform",
        "cache MiB (× full)",
        "prefill ms",
        "of bandwidth roofline",
        "faster from N",
    ]
    assert rows[0][:5] == ["full (fastest exact)", "1.00× [1.00–1.00]", "exact", "16.0 (1.00×)", "700"]
    assert rows[1][3:5] == ["4.02 (0.25×)", "150"]


def test_the_mode_is_named_in_its_words() -> None:
    setting = {"device": "cpu", "dtype": "float32", "causal": True, "batch": 1, "heads": 8, "head_dim": 64}
    words = {mode: setting_words(pd.Series({**setting, "mode": mode}), set()) for mode in ("fwd", "fwd+bwd", "decode")}
    assert words["fwd"].startswith("cpu, float32, forward, causal")
    assert words["fwd+bwd"].startswith("cpu, float32, forward + backward, causal")
    assert words["decode"].startswith("cpu, float32, decode (per generated token, after a prompt of N), causal")
    assert mode_of("decode") is DECODE and mode_of("fwd") is FORWARD and mode_of("later").words == "later"


def row(mode: str, **values: float) -> dict:
    return {"device": "cpu", "dtype": "float32", "status": "ok", "mode": mode, "useful_flops": float("nan"), **values}


def test_of_roofline_of_a_decode_step_is_its_bytes_over_the_copy_peak_without_stream_figures() -> None:
    frame = pd.DataFrame(
        [
            row("decode", time_median_s=1e-3, bytes_moved=5e6, flops=1e12),  # flops ignored: no FLOP term
            row("fwd", time_median_s=1e-3, bytes_moved=5e6, flops=2e7),  # max(2e7 / 1e11, 5e6 / 1e10) = 5e-4 s
            row("fwd+bwd", time_median_s=1e-3, bytes_moved=1e5, flops=2e7),  # backward's share of the work too
        ]
    )
    assert of_roofline(frame, PEAKS).tolist() == pytest.approx([0.5, 0.5, mode_work("fwd+bwd") * 0.2])
    copy_only = {"cpu/float32": {"copy_bytes_per_s": 1e10}}  # no matmul peak: a step still has its roofline
    assert of_roofline(frame, copy_only).tolist()[0] == pytest.approx(0.5)
    assert of_roofline(frame.assign(bytes_moved=float("nan")), PEAKS).isna().all()


def test_a_decode_groups_memory_slope_is_its_caches() -> None:
    frame = pd.DataFrame(
        {
            "label": ["full", "full", "band", "band"],
            "status": "ok",
            "mode": "decode",
            "seq_len": [1024, 4096, 1024, 4096],
            "time_median_s": [1e-4, 4e-4, 1e-4, 1e-4],
            "peak_mem_bytes": [2e3, 2e3, 2e3, 2e3],  # a step's scratch: flat
            "cache_bytes": [4 * MIB, 16 * MIB, MIB, MIB],  # a KV cache grows with N, a window does not
        }
    )
    slopes = scaling_table(frame).set_index("label").memory_slope
    assert slopes["full"] == pytest.approx(1.0) and slopes["band"] == pytest.approx(0.0)


def test_a_decode_steps_roofline_reads_over_the_read_bandwidth_and_writes_over_the_write_one() -> None:
    """Reads (bytes_moved less the three token vectors a step writes) over memory's read stream (a step timed in turns
    starts after other work: its state is not kept in a cache for it); the writes over the write stream; no
    matmul or copy figure involved."""
    step = row("decode", time_median_s=1e-3, bytes_moved=4_000_000 + 3 * 8 * 64 * 4, batch=1, heads=8, head_dim=64)
    peaks = {"cpu/float32": {"copy_bytes_per_s": 1e11, "read_bytes_per_s": 2e10, "write_bytes_per_s": 1e10}}
    seconds = 4_000_000 / 2e10 + 3 * 8 * 64 * 4 / 1e10
    assert of_roofline(pd.DataFrame([step]), peaks).iloc[0] == pytest.approx(seconds / 1e-3)
