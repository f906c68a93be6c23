"""The plots of a generation grid: kvpress's figure (accuracy against the share of the cache kept, a line per method
with its interval over samples, a panel per N) and continuation quality against the same axis. A method without a
knob (an RNN state, a sparse prefill) is one point at the share its state takes; the exact model is the reference
line. A figure far off the scale (an untrained RNN's perplexity thousands of times the exact model's) is drawn at the
panel's edge and named there, so the band where the methods differ stays readable. Drawn under the run report's
theme, styles and legend (attnbench.report.plots)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from attnbench.report.plots import (
    FIGURE_WIDTH, GREY, HALO, PANEL_HEIGHT, Style, _finish, _key, _log_y, _reference_line, styles, themed,
)  # fmt: skip
from attnbench.report.text import share_text

HEADROOM = 1.15  # the ratio axis ends this far above the swept methods' largest; a figure beyond is drawn at the edge
DODGE = 0.08  # methods' points at one share spread by this much of an octave apart, so bars and markers don't hide


def _kept_axis(ax: plt.Axes, ticks: list[float], points: list[float], reads: bool) -> None:
    """The share kept on a log2 axis, ticked at the grid's shares only; the fixed states' points fit inside it."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(ticks))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: share_text(value)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(points + ticks) / 1.6, max(points + ticks) * 1.6)
    ax.set_xlabel("share of the KV cache kept" + (" (Quest: read)" if reads else ""))


@themed
def _panels(data: pd.DataFrame, value: str, exact: dict[int, float], ylabel: str, title: str, subtitle: str,
            path: Path, style: dict[str, Style], reads: bool) -> Path:  # fmt: skip
    """A panel per N: a line per method of `value` against x (its interval as bars where `low`/`high` are given)."""
    percent = value == "accuracy"
    ns = sorted(set(data.seq_len))
    fig, axes = plt.subplots(len(ns), 1, figsize=(FIGURE_WIDTH, PANEL_HEIGHT * len(ns)), squeeze=False, sharex=True)
    swept = data[data.share.notna()]
    methods = list(dict.fromkeys(data.method))
    data = data.assign(x=[x * 2 ** (DODGE * (methods.index(m) - (len(methods) - 1) / 2)) for x, m in zip(data.x, data.method)])
    for ax, n in zip(axes[:, 0], ns):
        panel = data[data.seq_len == n]
        shown = swept[swept.seq_len == n][value] if len(swept) else pd.Series([1.0])
        top = None if percent else max(1.1, HEADROOM * float(shown.max()))
        for method, rows in panel.groupby("method", sort=False):
            rows, look = rows.sort_values("x"), style[method]
            y = rows[value] * (100 if percent else 1)
            if top is not None and (y > top).any():  # off the scale: at the edge, named with its figure
                for x, figure in zip(rows.x[y > top], y[y > top]):
                    ax.plot([x], [top], color=look.colour, marker="^", markersize=9, linestyle="none", clip_on=False)
                    ax.annotate(f"{method} {figure:,.0f}×", (x, top), xytext=(6, -4), textcoords="offset points",
                                fontsize="small", color=GREY, va="top", bbox=HALO)  # fmt: skip
                rows, y = rows[y <= top], y[y <= top]
            ax.plot(rows.x, y, color=look.colour, marker=look.marker, linestyle=look.linestyle if len(rows) > 1 else "none",
                    markersize=7)  # fmt: skip
            if percent and len(rows):
                ax.errorbar(rows.x, y, yerr=[y - 100 * rows.low, 100 * rows.high - y], fmt="none", ecolor=look.colour,
                            alpha=0.5, capsize=3)  # fmt: skip
        if n in exact:  # named under its right end: at 100% a name above it would sit on the frame
            _reference_line(ax, 100 * exact[n] if percent else exact[n], "exact model", right=True)
        _kept_axis(ax, list(swept.share), list(panel.x), reads)
        ax.set_ylabel(ylabel)
        ax.set_title(f"N = {n:,}" if n else "the rows' own lengths", fontsize="medium")
        if percent:
            ax.set_ylim(-3, 103)
        else:
            _log_y(ax)
            ax.set_ylim(min(0.95, float(shown.min()) / HEADROOM), top * 1.05)
    legend = {method: _key(style[method]) for method in dict.fromkeys(data.method)}
    return _finish(fig, title, subtitle, path, legend)


def plot_accuracy_vs_kept(
    overall: pd.DataFrame, summary: pd.DataFrame, tasks: list[str], folder: Path, reads: bool = False
) -> list[tuple[Path, str]]:
    """The report's plots (each written only when it has points): `overall` (`attnbench.report.generation.pooled`:
    accuracy over `tasks`, those within the model) and the continuation's perplexity ratio from `summary`, against
    the cache kept; `reads`: a method whose knob sets what a step reads (Quest) is among them."""
    made = []
    style = styles([m for m in dict.fromkeys(summary.method) if m != "full"])
    others = overall[~overall.exact_method] if len(overall) else overall
    if len(others):
        exact = overall[overall.exact_method].groupby("seq_len").accuracy.mean().to_dict()
        data = others.assign(x=others.share.fillna(others.cache_share))
        path = _panels(data, "accuracy", exact, "needles answered, % (↑)", "What the model answers with each method",
                       f"{', '.join(tasks)} (the tasks within the model); mean over samples, 95% interval",
                       folder / "generation-accuracy-vs-kept.png", style, reads)  # fmt: skip
        made.append((path, "Accuracy against the share of the cache kept, a line per method (kvpress's figure), a "
                           "panel per N; the exact model's is the dashed line."))  # fmt: skip
    forced = summary[summary.ppl_ratio.notna() & ~summary.exact_method]
    if len(forced):
        data = forced.groupby(["seq_len", "method", forced.share.fillna(-1.0)], sort=False).agg(
            ppl_ratio=("ppl_ratio", "mean"), cache_share=("cache_share", "mean")).reset_index()
        data["share"] = data.share.where(data.share >= 0)
        data["x"] = data.share.fillna(data.cache_share)
        path = _panels(data, "ppl_ratio", {n: 1.0 for n in set(forced.seq_len)}, "perplexity ÷ exact (↓)",
                       "Continuation quality with each method",
                       "the next tokens of a real text after the compressed prompt, teacher-forced; geometric mean",
                       folder / "generation-continuation-vs-kept.png", style, reads)  # fmt: skip
        made.append((path, "The continuation's perplexity against the exact model's on the same tokens, against the "
                           "share of the cache kept (a figure off the scale is drawn at the edge, named)."))  # fmt: skip
    return made
