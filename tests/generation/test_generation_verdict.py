"""The generation verdict's statistics: methods put in order only where their Wilson intervals separate, "no clear
difference" otherwise, each set against the exact model by the same rule; a method reading off its budget saying
what it reads; the beyond-the-model gate on the exact model's interval; what the run can resolve, near the top; the
budget rule in the header; and the plots: the accuracy plot's two panels (what a step reads | what it holds), no label
over another, a continuation axis with a few readable ticks."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from attnbench.report import generation_plots
from matplotlib.backends.backend_agg import FigureCanvasAgg
from attnbench.report.generation import (
    BUDGET_RULES, accuracy_table, ranking_text, summarize, verdict_lines, write_generation_report,
)  # fmt: skip
from attnbench.report.generation_verdict import exact_comparison_text
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
    assert "quest 90% [59–99] (reads 22% of the cache a step) lies clearly above h2o 0% [0–28]" in eighth  # apart
    half = line_at(lines, "1/2")  # 5/10 [24–76] against 3/10 [11–60]: they overlap
    assert "no clear difference between h2o 30% [10–61] and snapkv 50% [23–77] (their intervals overlap)" in half
    ranking = half.split(". Against the exact model")[0]
    assert "above" not in ranking and "below" not in ranking
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


def test_a_method_reading_off_its_budget_says_what_it_reads() -> None:
    """Quest at 1/2 reading 104% a step on average (the mean, as the cost table says: one row at 500% among nine at
    60%) says so; SnapKV reading 52% is within READ_TOLERANCE of its budget and says nothing; neither does H2O."""
    rows = grid({("passkey", "full", None): 10, ("passkey", "quest", 0.5): 9, ("passkey", "snapkv", 0.5): 5,
                 ("passkey", "h2o", 0.5): 3})  # fmt: skip
    rows.loc[rows.method == "snapkv", "read_share"] = 0.52
    rows.loc[rows.index[(rows.method == "quest")][0], "read_share"] = 5.0
    half = line_at(verdict_lines(rows, summarize(rows)), "1/2")
    assert "quest 90% [59–99] (reads 104% of the cache a step)" in half
    assert "snapkv 50% [23–77]" in half and "h2o 30% [10–61]" in half and half.count("(reads") == 1


def test_each_budget_line_sets_the_methods_against_the_exact_model() -> None:
    """By the ranking's rule: quest's [59–99] overlaps the exact model's [72–100], h2o's [0–28] lies below it; with
    h2o's [0–28] and snapkv's [11–61], every method lies below it."""
    lines = verdict_lines(grid(SEPARATED), summarize(grid(SEPARATED)))
    assert line_at(lines, "1/8").endswith(
        ". Against the exact model: quest is not clearly below it; h2o lies clearly below it.")
    rows = grid({("passkey", "full", None): 10, ("passkey", "snapkv", 0.5): 3, ("passkey", "h2o", 0.5): 0})
    assert line_at(verdict_lines(rows, summarize(rows)), "1/2").endswith(
        ". Against the exact model: every method lies clearly below it.")
    exact = Interval(0.5, 0.3, 0.7)
    assert exact_comparison_text({"a": Interval(0.9, 0.8, 1.0), "b": Interval(0.5, 0.3, 0.7)}, exact) == \
        "Against the exact model: b is not clearly below it; a lies clearly above it"  # fmt: skip


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


def continuation_grid() -> pd.DataFrame:
    """SEPARATED's needles with a continuation: SnapKV and H2O near the exact model's perplexity, Quest 1.3×, and two
    untrained RNNs thousands of times it, their states close in size (their points at one spot off the scale)."""
    ratios = {("full", None): 1.0, ("snapkv", 0.5): 1.02, ("snapkv", 0.125): 1.2, ("h2o", 0.5): 1.05,
              ("h2o", 0.125): 1.25, ("quest", 0.125): 1.3, ("deltanet", None): 3000.0, ("mamba", None): 1800.0}
    states = {"deltanet": 0.09, "mamba": 0.1}
    rows = grid({("continuation", method, share): 0 for method, share in ratios})
    shares = [None if share != share else share for share in rows.share]
    rows = rows.assign(score=None, ppl_ratio=[ratios[key] for key in zip(rows.method, shares)])
    for method, state in states.items():
        rows.loc[rows.method == method, ["cache_share", "read_share"]] = state
    needles = grid({**SEPARATED, ("passkey", "deltanet", None): 0, ("passkey", "mamba", None): 1})
    return pd.concat([needles, rows], ignore_index=True)


def drawn_figures(tmp_path: Path, monkeypatch, rows: pd.DataFrame) -> list:
    """The report's figures for `rows`, as drawn (accuracy, then continuation)."""
    figures = []
    finish = generation_plots._finish
    monkeypatch.setattr(generation_plots, "_finish", lambda fig, *args: figures.append(fig) or finish(fig, *args))
    write_generation_report(tmp_path, rows, {"grid": "t"}, reads=True)
    return figures


def test_no_label_in_a_panel_covers_another_and_the_legend_names_every_figure(tmp_path: Path, monkeypatch) -> None:
    """Two RNNs off the continuation's scale at nearly one spot: their figures are in the legend, not printed over
    each other at the edge; the exact model's figure too, not over Quest's bar."""
    accuracy, continuation = drawn_figures(tmp_path, monkeypatch, continuation_grid())
    for fig in (accuracy, continuation):
        renderer = FigureCanvasAgg(fig).get_renderer()  # the report closed it
        for ax in fig.axes:
            boxes = [text.get_window_extent(renderer) for text in ax.texts if text.get_text()]
            assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:]), ax.get_title()
    names = {fig: {text.get_text() for legend in fig.legends for text in legend.get_texts()}
             for fig in (accuracy, continuation)}  # fmt: skip
    assert "exact model 100% [72–100] (band: its interval)" in names[accuracy]
    assert {"deltanet (3,000×: ▲ at the top edge)", "mamba (1,800×: ▲ at the top edge)"} <= names[continuation]


def test_the_continuation_axis_labels_a_few_plain_ratios(tmp_path: Path, monkeypatch) -> None:
    """Between the exact model's 1× and Quest's 1.3× the axis says 0.9, 1, 1.1, …, not just 0.9 and 1 (matplotlib's
    log ticks), nor every minor tick."""
    _, continuation = drawn_figures(tmp_path, monkeypatch, continuation_grid())
    ax = continuation.axes[0]
    low, high = ax.get_ylim()

    def labelled(axis_ticks, formatter) -> list[str]:
        shown = [value for value in axis_ticks if low <= value <= high]
        return [label for label in formatter.format_ticks(shown) if label]

    labels = labelled(ax.yaxis.get_majorticklocs(), ax.yaxis.get_major_formatter())
    labels += labelled(ax.yaxis.get_minorticklocs(), ax.yaxis.get_minor_formatter())
    assert "1" in labels and "1.2" in labels and 3 <= len(labels) <= generation_plots.MAX_TICKS, labels


@pytest.mark.parametrize("low, high, ticks", [
    (0.865, 1.386, [0.9, 1.0, 1.1, 1.2, 1.3]),  # narrow: even steps
    (0.86, 3450, [1.0, 10.0, 100.0, 1000.0]),  # wide: the finest ladder that fits
    (0.86, 30, [1.0, 2.0, 5.0, 10.0, 20.0]),
])  # fmt: skip
def test_ratio_ticks(low: float, high: float, ticks: list[float]) -> None:
    assert generation_plots.ratio_ticks(low, high) == ticks
