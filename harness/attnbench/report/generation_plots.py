"""The plots of a generation grid, placed at what a method costs: accuracy (a line per method, its Wilson interval as
bars) and continuation quality, each in two panels per N, against the share of the exact cache a step reads and
against the share it holds (kvpress's figure, with its two panels). Quest holds every key and reads a share of them:
its points sit at its real read share on the left, and at the whole cache on the right. A method without a knob (an
RNN state, a sparse prefill) is one point; the exact model is the reference line, its interval a band. A figure far
off the scale (an untrained RNN's perplexity thousands of times the exact model's) is drawn at the panel's edge and
named there, so the band where the methods differ stays readable. Drawn under the run report's theme, styles and
legend (attnbench.report.plots)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from attnbench.report.generation_summary import interval_of
from attnbench.report.generation_verdict import accuracy_text
from attnbench.report.plots import (
    FIGURE_WIDTH, GREY, HALO, PANEL_HEIGHT, Style, _finish, _key, _log_y, _reference_line, styles, themed,
)  # fmt: skip
from attnbench.report.text import share_text
from attnbench.stats import Interval

HEADROOM = 1.15  # the ratio axis ends this far above the swept methods' largest; a figure beyond is drawn at the edge
DODGE = 0.04  # methods' points spread by this much of an octave (±3% for five), so bars at one cost don't hide
COSTS = (("read_share", "reads", "share a step reads"), ("cache_share", "holds", "share it holds"))
EXACT_BAND = "#dddddd"  # the exact model's interval behind the methods' lines


def _cost_axis(ax: plt.Axes, ticks: list[float], points: list[float], label: str) -> None:
    """A share of the exact cache on a log2 axis, ticked at the grid's budgets and the whole cache."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(ticks))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: "all" if value == 1 else share_text(value)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(points + ticks) / 1.4, max(points + ticks) * 1.4)
    ax.set_xlabel(label)


def _draw_method(ax: plt.Axes, rows: pd.DataFrame, x: pd.Series, value: str, top: float | None, look: Style) -> None:
    """One method's line of `value` (its budgets in order), its interval as bars for an accuracy; a figure above
    `top` at the edge, named."""
    method = rows.method.iloc[0]
    y = rows[value] * (100 if value == "accuracy" else 1)
    if top is not None and (y > top).any():  # off the scale: at the edge, named with its figure
        for spot, figure in zip(x[y > top], y[y > top]):
            ax.plot([spot], [top], color=look.colour, marker="^", markersize=9, linestyle="none", clip_on=False)
            ax.annotate(f"{method} {figure:,.0f}×", (spot, top), xytext=(6, -4), textcoords="offset points",
                        fontsize="small", color=GREY, va="top", bbox=HALO)  # fmt: skip
        rows, x, y = rows[y <= top], x[y <= top], y[y <= top]
    ax.plot(x, y, color=look.colour, marker=look.marker, linestyle=look.linestyle if len(rows) > 1 else "none",
            markersize=7)  # fmt: skip
    if value == "accuracy" and len(rows):
        ax.errorbar(x, y, yerr=[y - 100 * rows.low, 100 * rows.high - y], fmt="none", ecolor=look.colour, alpha=0.6,
                    capsize=3)  # fmt: skip


@themed
def _panels(data: pd.DataFrame, value: str, exact: dict[int, tuple[Interval, str]], ylabel: str, title: str,
            subtitle: str, path: Path, style: dict[str, Style]) -> Path:  # fmt: skip
    """Two panels per N, one under the other: `value` against the share a step reads | the share held, a line per
    method; the exact model's (estimate, its words) a reference line, its interval a band."""
    percent = value == "accuracy"
    ns = sorted(set(data.seq_len))
    fig, axes = plt.subplots(len(ns), 2, figsize=(FIGURE_WIDTH, PANEL_HEIGHT * len(ns)), squeeze=False, sharey="row")
    methods = list(dict.fromkeys(data.method))
    shift = {m: 2 ** (DODGE * (i - (len(methods) - 1) / 2)) for i, m in enumerate(methods)}
    budgets = sorted(set(data.share.dropna()) | {1.0})
    for row, n in zip(axes, ns):
        panel = data[data.seq_len == n].sort_values("share", ascending=False, na_position="last")
        swept = panel[panel.share.notna()][value]
        top = None if percent else max(1.1, HEADROOM * float(swept.max() if len(swept) else 1.0))
        for ax, (column, short, label) in zip(row, COSTS):
            for method, rows in panel.groupby("method", sort=False):
                _draw_method(ax, rows, rows[column] * shift[method], value, top, style[method])
            if n in exact:  # named once, under the right end of the reads panel, where few methods read
                interval, words = exact[n]
                scale = 100 if percent else 1
                if interval.low == interval.low and interval.high > interval.low:
                    ax.axhspan(scale * interval.low, scale * interval.high, color=EXACT_BAND, alpha=0.6, zorder=0)
                _reference_line(ax, scale * interval.estimate, words if column == "read_share" else "", right=True)
            _cost_axis(ax, budgets, [x for x in panel[column] if x == x], label)
            ax.set_title(f"{'N = ' + format(n, ',') if n else 'own lengths'}: {short}", fontsize="medium")
        row[0].set_ylabel(ylabel)
        if percent:
            row[0].set_ylim(-3, 103)
        else:
            for ax in row:
                _log_y(ax)
            row[0].set_ylim(min(0.95, float(panel[value].min()) / HEADROOM), top * 1.05)
    legend = {method: _key(style[method]) for method in methods}
    exact_key = "exact model (band: its interval)" if percent else "exact model"
    legend[exact_key] = Line2D([], [], color="#999999", linestyle="--")
    return _finish(fig, title, subtitle, path, legend)


def plot_accuracy_vs_cost(
    overall: pd.DataFrame, summary: pd.DataFrame, tasks: list[str], folder: Path, reads: bool = False
) -> list[tuple[Path, str]]:
    """The report's plots (each written only when it has points): `overall` (`generation_verdict.pooled`: accuracy
    over `tasks`, those within the model) and the continuation's perplexity ratio from `summary`, against the share
    of the exact cache read and held; `reads`: a method whose knob sets what a step reads (Quest) is among
    them, which the caption says."""
    made = []
    if len(overall) and overall.protocol.nunique() > 1:  # one line per method and protocol, named so
        overall = overall.assign(method=[m if exact else f"{m} ({p})" for m, p, exact
                                         in zip(overall.method, overall.protocol, overall.exact_method)])  # fmt: skip
    names = [m for m in dict.fromkeys([*summary.method, *(overall.method if len(overall) else [])]) if m != "full"]
    style = styles(names)
    quest = " Quest holds the whole cache and reads its budget: its points differ most between the panels."
    quest = quest if reads else ""
    others = overall[~overall.exact_method] if len(overall) else overall
    if len(others):
        exact = {r.seq_len: (interval_of(r), f"exact model {accuracy_text(interval_of(r))}")
                 for r in overall[overall.exact_method].itertuples()}  # fmt: skip
        path = _panels(others, "accuracy", exact, "needles answered, % (↑)", "What the model answers with each method",
                       f"{', '.join(tasks)} (the tasks within the model); mean over samples, Wilson 95% interval",
                       folder / "generation-accuracy-vs-kept.png", style)  # fmt: skip
        made.append((path, "Accuracy against the share of the exact cache a step reads (left) and the share it holds "
                           "(right), a line per method with its Wilson 95% interval, a row per N; the exact model's "
                           "is the dashed line, its interval the grey band. Points at one cost are spread a few "
                           "percent apart so their bars stay visible." + quest))  # fmt: skip
    forced = summary[summary.ppl_ratio.notna() & ~summary.exact_method]
    if len(forced):
        data = forced.groupby(["seq_len", "method", forced.share.fillna(-1.0)], sort=False).agg(
            ppl_ratio=("ppl_ratio", "mean"), cache_share=("cache_share", "mean"), read_share=("read_share", "mean"),
        ).reset_index()  # fmt: skip
        data["share"] = data.share.where(data.share >= 0)
        path = _panels(data, "ppl_ratio", {n: (Interval(1.0, 1.0, 1.0), "exact model") for n in set(forced.seq_len)},
                       "perplexity ÷ exact (↓)", "Continuation quality with each method",
                       "the next tokens of a real text after the compressed prompt, teacher-forced; geometric mean",
                       folder / "generation-continuation-vs-kept.png", style)  # fmt: skip
        made.append((path, "The continuation's perplexity against the exact model's on the same tokens, against the "
                           "share of the exact cache a step reads (left) and holds (right) (a figure off the scale is "
                           "drawn at the edge, named)." + quest))  # fmt: skip
    return made
