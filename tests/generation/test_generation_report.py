"""The generation report from rows: accuracy with its Wilson interval, the exact model's own accuracy beside
every figure, a task the exact model fails marked beyond the model and kept out of the verdict, continuation quality
as the geometric mean of perplexity ratios, and the plots a person reads."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from attnbench.report.generation import EXACT_FLOOR, summarize, verdict_lines, write_generation_report
from attnbench.report.text import share_text
from attnbench.runfolder.generations import COLUMNS
from attnbench.stats import wilson_interval


def rows() -> pd.DataFrame:
    out = []

    def add(task, method, share, scores, variant=None, ratios=None, cache=0.5):
        for sample, value in enumerate(scores):
            out.append(dict(key=f"{task}{method}{share}{sample}", task=task, seq_len=2048, protocol="question-agnostic",
                            sample=sample, method=method, variant=variant or method, hparams="{}", prefill="dense",
                            dense_layers=0, decode="own", share=share, status="ok", reason="", score=value,
                            ppl_ratio=None if ratios is None else ratios[sample], cache_share=cache, read_share=cache,
                            attention_s=0.01, answer=""))  # fmt: skip

    add("passkey", "full", None, [1, 1, 1, 1], cache=1.0)
    add("passkey", "snapkv", 0.5, [1, 1, 1, 0])
    add("passkey", "snapkv", 0.125, [1, 0, 0, 0], cache=0.125)
    add("passkey", "h2o", 0.125, [0, 0, 0, 0], cache=0.125)
    add("passkey", "deltanet", None, [0, 0, 0, 0], cache=0.09)
    add("niah_multikey", "full", None, [1, 0, 0, 0], cache=1.0)  # the model itself fails: beyond it
    add("niah_multikey", "snapkv", 0.5, [1, 1, 1, 1])
    add("continuation", "full", None, [None, None], ratios=[1.0, 1.0], cache=1.0)
    add("continuation", "snapkv", 0.5, [None, None], ratios=[1.1, 1.21])
    frame = pd.DataFrame(out).reindex(columns=COLUMNS)
    return frame


def test_summary_intervals_and_continuation() -> None:
    summary = summarize(rows())
    snap = summary[(summary.method == "snapkv") & (summary.share == 0.5) & (summary.task == "passkey")].iloc[0]
    wilson = wilson_interval(0.75, 4)
    assert snap.accuracy == 0.75 and (snap.low, snap.high) == (wilson.low, wilson.high)
    forced = summary[(summary.method == "snapkv") & (summary.task == "continuation")].iloc[0]
    assert math.isclose(forced.ppl_ratio, math.sqrt(1.1 * 1.21))


def test_the_verdict_follows_the_exact_model_and_leaves_out_what_it_fails() -> None:
    lines = verdict_lines(rows(), summarize(rows()))
    text = "\n".join(lines)
    assert "passkey 100% [51–100]" in lines[0] and "niah_multikey 25% [4–70]" in lines[0]
    assert f"below {EXACT_FLOOR:.0%}" in lines[0] and "niah_multikey" in lines[0].split("Beyond the model")[1]
    half = next(line for line in lines if "budget of 1/2" in line)
    assert "snapkv 75% [30–96]" in half  # the multikey 100% is left out: the exact model fails that task
    assert "(the exact model 100% [51–100])" in half  # beside every figure
    eighth = next(line for line in lines if "budget of 1/8" in line)
    assert "no clear difference between h2o 0% [0–49] and snapkv 25% [4–70]" in eighth  # 0/4 and 1/4 overlap
    assert "deltanet 0% [0–49]" in text and "its state 9.0% of the cache" in text


def test_share_text() -> None:
    assert [share_text(s) for s in (0.5, 0.125, 0.3, None)] == ["1/2", "1/8", "0.3", "fixed"]


def test_the_report_and_its_plots_are_written(tmp_path: Path) -> None:
    report = write_generation_report(tmp_path, rows(), {"command": ["attnbench", "generate"], "grid": "t"})
    text = report.read_text()
    assert "## Verdict" in text and "† the exact model's interval lies wholly below 80%" in text
    assert text.index("What this run can resolve") < text.index("## Verdict")
    assert (tmp_path / "plots" / "generation-accuracy-vs-kept.png").is_file()
    assert (tmp_path / "plots" / "generation-continuation-vs-kept.png").is_file()
    assert (tmp_path / "report.html").is_file()
