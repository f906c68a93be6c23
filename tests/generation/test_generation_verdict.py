"""The generation verdict's statistics: methods put in order only where their Wilson intervals separate, "no clear
difference" otherwise; the beyond-the-model gate on the exact model's interval; what the run can resolve, near the
top; the budget rule in the header; and the accuracy plot's two panels (what a step reads | what it holds)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from attnbench.report import generation_plots
from attnbench.report.generation import (
    BUDGET_RULES, accuracy_table, ranking_text, summarize, verdict_lines, write_generation_report,
)  # fmt: skip
from attnbench.report.plots import variant_colour
from attnbench.runfolder.generations import COLUMNS
from attnbench.stats import Interval

SAMPLES = 10


def grid(hits: dict[tuple[str, str, float | None], int], extra: dict | None = None) -> pd.DataFrame:
    """Rows of a grid at N=2048: (task, method, share) -> how many of SAMPLES answer; Quest holds the whole cache
    and reads its share, the others hold and read it."""
    out = []
    for (task, method, share), k in hits.items():
        held = 1.0 if share is None or method == "quest" else share
        read = 1.0 if share is None else (share + 0.1 if method == "quest" else share)
        for sample in range(SAMPLES):
            out.append(dict(key=f"{task}{method}{share}{sample}", task=task, seq_len=2048, protocol="question-agnostic",
                            sample=sample, method=method, variant={"quest": "topk"}.get(method, method), hparams="{}",
                            prefill="dense", dense_layers=0, decode="own", share=share, status="ok", reason="",
                            score=float(sample < k), cache_share=held, read_share=read, attention_s=0.01,
                            **(extra or {})))  # fmt: skip
    frame = pd.DataFrame(out)
    return frame.reindex(columns=COLUMNS + [c for c in frame if c not in COLUMNS])


SEPARATED = {("passkey", "full", None): 10, ("passkey", "quest", 0.125): 9, ("passkey", "h2o", 0.125): 0,
             ("passkey", "snapkv", 0.5): 5, ("passkey", "h2o", 0.5): 3}  # fmt: skip


def line_at(lines: list[str], share: str) -> str:
    return next(line for line in lines if f"budget of {share} of the cache" in line)


def test_separated_intervals_are_ranked_overlapping_ones_are_not() -> None:
    rows = grid(SEPARATED)
    lines = verdict_lines(rows, summarize(rows))
    eighth = line_at(lines, "1/8")
    assert "quest 90% [59–99] lies clearly above h2o 0% [0–28]" in eighth  # [60–98] against [0–28]: apart
    half = line_at(lines, "1/2")  # 5/10 [24–76] against 3/10 [11–60]: they overlap
    assert "no clear difference between h2o 30% [10–61] and snapkv 50% [23–77] (their intervals overlap)" in half
    assert "above" not in half and "below" not in half
    assert all("(the exact model 100% [72–100])" in line for line in (eighth, half))  # beside every figure


def test_a_chain_of_overlaps_orders_only_the_pairs_that_separate() -> None:
    """a overlaps b, b overlaps c and d, a lies clearly above c and d: a and b lead, no clear difference between
    them; c and d lie below a only."""
    intervals = {"a": Interval(0.8, 0.6, 0.95), "b": Interval(0.5, 0.3, 0.7), "c": Interval(0.2, 0.05, 0.35),
                 "d": Interval(0.25, 0.1, 0.4)}  # fmt: skip
    text = ranking_text({name: name for name in intervals}, intervals)
    assert text == "at the top, no clear difference between a and b (their intervals overlap); c and d (no clear " \
                   "difference between them) lie clearly below a"  # fmt: skip
    both = {"a": Interval(0.9, 0.8, 1.0), "b": Interval(0.85, 0.7, 0.95), "c": Interval(0.1, 0.0, 0.3)}
    assert ranking_text({n: n for n in both}, both).endswith("; c lies clearly below both")


@pytest.mark.parametrize("exact_hits, verdict", [
    (10, "able"),  # 100% [72–100]: judged
    (7, "kept"),  # 70% [40–89]: below 80%, but its interval reaches it: too few samples to say it fails
    (2, "beyond"),  # 20% [6–51]: its whole interval below 80%: the model cannot do it
])  # fmt: skip
def test_the_gate_uses_the_exact_models_interval(exact_hits: int, verdict: str) -> None:
    rows = grid({("passkey", "full", None): exact_hits, ("passkey", "snapkv", 0.5): 5})
    summary = summarize(rows)
    lines = verdict_lines(rows, summary)
    header = accuracy_table(summary)[0][-1]
    assert ("Beyond the model" in lines[0]) == (verdict == "beyond")
    assert ("Kept only because the exact model's interval is too wide to decide" in lines[0]) == (verdict == "kept")
    assert ("nothing to judge" in lines[1]) == (verdict == "beyond")
    assert header.endswith({"able": "N=2,048", "kept": " ‡", "beyond": " †"}[verdict])


def test_the_report_says_what_the_run_can_resolve_and_its_budget_rule(tmp_path: Path) -> None:
    text = write_generation_report(tmp_path, grid(SEPARATED, {"budget_rule": "kvpress"}), {"grid": "t"}).read_text()
    top = text[: text.index("## Verdict")]
    assert "with 10 samples a cell" in top and "about 62 points" in top  # at 50%, Wilson intervals of 10 samples
    assert BUDGET_RULES["kvpress"] in top and "Budget rule" in top
    old = write_generation_report(tmp_path, grid(SEPARATED), {"grid": "t"}).read_text()
    assert "Budget rule" not in old  # a run from before the column says nothing of it


def test_a_grid_mixing_budget_rules_names_the_rule_with_the_method() -> None:
    rows = pd.concat([grid(SEPARATED, {"budget_rule": "kvpress"}),
                      grid({("passkey", "snapkv", 0.5): 9}, {"budget_rule": "fixed-total"})])  # fmt: skip
    summary = summarize(rows.assign(key=range(len(rows))))
    assert {"snapkv", "snapkv (fixed-total)", "full"} <= set(summary.method)


def test_the_accuracy_plot_places_each_method_at_what_it_reads_and_holds(tmp_path: Path, monkeypatch) -> None:
    figures = []
    finish = generation_plots._finish
    monkeypatch.setattr(generation_plots, "_finish", lambda fig, *args: figures.append(fig) or finish(fig, *args))
    report = write_generation_report(tmp_path, grid(SEPARATED), {"grid": "t"}, reads=True)
    assert (tmp_path / "plots" / "generation-accuracy-vs-kept.png").is_file() and report.is_file()
    reads, holds = figures[0].axes[:2]
    assert "reads" in reads.get_title() and "holds" in holds.get_title()
    colour = variant_colour("quest")
    quest_x = {name: [x for line in ax.lines if line.get_color() == colour for x in line.get_xdata()]
               for name, ax in (("reads", reads), ("holds", holds))}  # fmt: skip
    assert len(quest_x["reads"]) == len(quest_x["holds"]) == 1
    assert all(0.2 < x < 0.25 for x in quest_x["reads"])  # its real read share (0.225), a few % dodge at most
    assert all(0.95 < x < 1.05 for x in quest_x["holds"])  # it holds the whole cache


def test_two_protocols_are_two_lines_named_by_protocol(tmp_path: Path, monkeypatch) -> None:
    """SnapKV question-aware and question-agnostic at one budget are two lines in the plot's legend, not one."""
    figures = []
    finish = generation_plots._finish
    monkeypatch.setattr(generation_plots, "_finish", lambda fig, *args: figures.append(fig) or finish(fig, *args))
    hits = {("niah_single", "full", None): 10, ("niah_single", "snapkv", 0.5): 2}
    aware = grid(hits).assign(protocol="question-aware", key=lambda f: f.key + "aware")
    aware.loc[aware.method == "snapkv", "score"] = 1.0
    write_generation_report(tmp_path, pd.concat([grid(hits), aware], ignore_index=True), {"grid": "t"})
    names = {text.get_text() for fig in figures[:1] for legend in fig.legends for text in legend.get_texts()}
    assert {"snapkv (question-agnostic)", "snapkv (question-aware)"} <= names
