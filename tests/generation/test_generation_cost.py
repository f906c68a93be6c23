"""The generation report's cost table: attention time per token and its ratio to the exact model's from the timed
rows alone (the first sample of each unit; NaN elsewhere), said to be eager steps timed in turns with the exact model;
the cache held after the prompt and at the end, each a share of the exact model's; no time anywhere else."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from attnbench.report.generation import write_generation_report
from attnbench.report.generation_cost import (
    attention_text, cost_caption, cost_table, costs, milliseconds_text, times_text,
)  # fmt: skip
from attnbench.runfolder.generations import COLUMNS

SAMPLES, BLOCK = 4, 2  # two units of two samples: samples 0 and 2 are timed
PROMPT_BYTES, TOKEN_BYTES = 1000, 10


def grid(timing: dict[str, list[tuple[float, float, float, float]]], answered: dict[str, int] | None = None,
         rule: str = "kvpress") -> pd.DataFrame:  # fmt: skip
    """Passkey rows at N=2048: method -> (attention_s, ratio, low, high) of each unit's first sample; the exact
    model holds PROMPT_BYTES after the prompt, snapkv half; each grows by TOKEN_BYTES a token it answers (kvpress)."""
    answered = answered or {}
    out = []
    for method, units in timing.items():
        share = None if method == "full" else 0.5
        held = PROMPT_BYTES * (1.0 if share is None else share)
        for sample in range(SAMPLES):
            timed = units[sample // BLOCK] if sample % BLOCK == 0 else (math.nan,) * 4
            grown = TOKEN_BYTES * answered.get(method, 8) if rule == "kvpress" else 0
            out.append(dict(key=f"{method}{sample}", task="passkey", seq_len=2048, protocol="question-agnostic",
                            sample=sample, method=method, variant=method, hparams="{}", prefill="dense", dense_layers=0,
                            decode="own", share=share, status="ok", reason="", score=1.0, answer="",
                            cache_share=held / PROMPT_BYTES, read_share=held / PROMPT_BYTES, cache_bytes=held,
                            final_cache_bytes=held + grown, attention_s=timed[0], attention_ratio=timed[1],
                            attention_low=timed[2], attention_high=timed[3],
                            step_form="eager" if sample % BLOCK == 0 else "", budget_rule=rule))  # fmt: skip
    return pd.DataFrame(out).reindex(columns=COLUMNS)


EXACT_TIMES = [(0.0142, 1.0, 1.0, 1.0), (0.0150, 1.0, 1.0, 1.0)]


def cost_of(frame: pd.DataFrame, method: str) -> object:
    return next(c for c in costs(frame).itertuples() if c.method == method)


def test_the_time_and_ratio_come_from_the_timed_rows_with_their_interval() -> None:
    one = [(0.0074, 0.52, 0.49, 0.55)] * 2
    frame = grid({"full": EXACT_TIMES, "snapkv": one})
    assert attention_text(cost_of(frame, "snapkv")) == "7.4 ms (0.52× [0.49–0.55] of full, eager)"
    assert attention_text(cost_of(frame, "full")) == "14.6 ms (the reference, eager)"  # the median of its two units
    assert cost_of(frame, "snapkv").timed == 2  # the NaN rows of the other samples are left out, not counted as 0


def test_several_timed_units_give_the_median_ratio_and_the_span_of_their_intervals() -> None:
    frame = grid({"full": EXACT_TIMES, "snapkv": [(0.006, 0.50, 0.47, 0.53), (0.008, 0.56, 0.52, 0.60)]})
    assert attention_text(cost_of(frame, "snapkv")) == "7.0 ms (0.53× [0.47–0.60] of full, eager)"


def test_a_run_from_before_the_timing_shows_no_time() -> None:
    """Rows with an attention_s but no ratio (the old forward-pass figure) are not timed in turns: no time shown."""
    frame = grid({"full": EXACT_TIMES, "snapkv": [(0.0074, 0.52, 0.49, 0.55)] * 2})
    frame = frame.assign(attention_s=0.01).drop(columns=["attention_ratio", "attention_low", "attention_high",
                                                         "step_form"])  # fmt: skip
    frame = frame.reindex(columns=[c for c in COLUMNS if c in frame])
    found = costs(frame)
    assert set(attention_text(c) for c in found.itertuples()) == {"–"}
    assert "no time is shown" in cost_caption(found) and "eager" not in cost_caption(found)


def test_the_cache_held_after_the_prompt_and_at_the_end() -> None:
    """kvpress's rule: both caches grow by the question and the answer, so snapkv's end share rises above its
    prompt share (500 + 80 of 1000 + 80); fixed-total: it stays at its share."""
    timing = {"full": EXACT_TIMES, "snapkv": [(0.0074, 0.52, 0.49, 0.55)] * 2}
    headers, table = cost_table(costs(grid(timing)))
    snap = dict(zip(headers, next(row for row in table if row[0] == "snapkv")))
    assert snap["holds after the prompt"] == "50.0%" and snap["holds at the end"] == f"{580 / 1080:.1%}"
    headers, table = cost_table(costs(grid(timing, rule="fixed-total")))
    assert dict(zip(headers, next(row for row in table if row[0] == "snapkv")))["holds at the end"] == "50.0%"
    old = grid(timing).assign(final_cache_bytes=math.nan)  # a run from before the column
    assert set(row[headers.index("holds at the end")] for row in cost_table(costs(old))[1]) == {"–"}


def test_the_report_says_how_steps_were_timed_and_shows_time_nowhere_else(tmp_path: Path) -> None:
    frame = grid({"full": EXACT_TIMES, "snapkv": [(0.0074, 0.52, 0.49, 0.55)] * 2})
    text = write_generation_report(tmp_path, frame, {"grid": "t"}).read_text()
    assert "eager PyTorch" in text and "one method at a time in turns with the exact model's step" in text
    timed_lines = [line for line in text.splitlines() if " ms" in line]
    assert timed_lines and all(line.startswith("| ") and ("× [" in line or "reference" in line) for line in timed_lines)


def test_times_and_ratios_are_written_to_be_read() -> None:
    """Milliseconds to a tenth (three digits below one); a ratio's interval rounded outward, so it holds the one
    computed: [0.265, 0.2835] shows as [0.26–0.29]."""
    assert [milliseconds_text(s) for s in (0.0074, 0.000312, 0.1234, 0.007)] == ["7.4 ms", "0.312 ms", "123 ms", "7.0 ms"]
    frame = grid({"full": EXACT_TIMES, "snapkv": [(0.0016, 0.274, 0.265, 0.2835)] * 2})
    assert attention_text(cost_of(frame, "snapkv")) == "1.6 ms (0.27× [0.26–0.29] of full, eager)"
    assert times_text(0.55, math.ceil) == "0.55" and times_text(0.049) == "0.049"  # no float noise; small ones


def test_the_report_modules_keep_the_names_other_code_imports() -> None:
    """The verdict and the summary moved out of report/generation.py; what was imported from it still is."""
    from attnbench.report import generation, generation_summary, generation_verdict

    for name in ("EXACT_FLOOR", "accuracy_text", "pooled", "ranking_text", "verdict_lines"):
        assert getattr(generation, name) is getattr(generation_verdict, name)
    for name in ("summarize", "interval_of", "EXACT"):
        assert getattr(generation, name) is getattr(generation_summary, name)
    assert callable(generation.terminal_summary) and callable(generation.write_generation_report)
