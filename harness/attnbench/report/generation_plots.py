"""The plots of a generation grid: kvpress's figure (accuracy against the share of the cache kept, a line per method,
a panel per N) and continuation quality against the same axis. A method without a knob (an RNN state, a sparse
prefill) is one point at the share its state takes; the exact model is the reference line. Drawn under the run
report's theme, styles and legend (attnbench.report.plots)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from attnbench.report.generation import share_text, within_model
from attnbench.report.plots import FIGURE_WIDTH, PANEL_HEIGHT, Style, _finish, _key, _reference_line, styles, themed


def _kept_axis(ax: plt.Axes, shares: list[float]) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(shares))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: share_text(value)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(ticks) / 1.6, max(ticks) * 1.6)
    ax.set_xlabel("share of the KV cache kept (Quest: read), log")


def _points(frame: pd.DataFrame, value: str) -> pd.DataFrame:
    """Per (N, method, share): the mean of `value` over the tasks, x = the share (a fixed state: its own share)."""
    data = frame.assign(x=frame.share.fillna(frame.cache_share))
    return data.groupby(["seq_len", "method", "x"], sort=False)[value].mean().reset_index()


@themed
def _panels(data: pd.DataFrame, value: str, exact: dict[int, float], ylabel: str, title: str, subtitle: str,
            path: Path, style: dict[str, Style], percent: bool) -> Path:  # fmt: skip
    ns = sorted(set(data.seq_len))
    fig, axes = plt.subplots(len(ns), 1, figsize=(FIGURE_WIDTH, PANEL_HEIGHT * len(ns)), squeeze=False, sharex=True)
    shares = sorted(set(data.x))
    for ax, n in zip(axes[:, 0], ns):
        panel = data[data.seq_len == n]
        for method, rows in panel.groupby("method", sort=False):
            rows = rows.sort_values("x")
            y = 100 * rows[value] if percent else rows[value]
            look = style[method]
            ax.plot(rows.x, y, color=look.colour, marker=look.marker, linestyle=look.linestyle if len(rows) > 1 else "none",
                    markersize=7)  # fmt: skip
        if n in exact:
            _reference_line(ax, 100 * exact[n] if percent else exact[n], "exact model")
        _kept_axis(ax, shares)
        ax.set_ylabel(ylabel)
        ax.set_title(f"N = {n:,}", fontsize="medium")
        if percent:
            ax.set_ylim(-3, 103)
        else:
            ax.set_yscale("log")
    legend = {method: _key(style[method]) for method in dict.fromkeys(data.method)}
    return _finish(fig, title, subtitle, path, legend)


def plot_accuracy_vs_kept(summary: pd.DataFrame, folder: Path) -> list[tuple[Path, str]]:
    """The report's plots (each written only when it has points): needles and continuation against the cache kept."""
    made = []
    methods = [m for m in dict.fromkeys(summary.method) if m != "full"]
    style = styles(methods)
    needles = within_model(summary)
    others = needles[~needles.exact_method]
    if len(others):
        exact = needles[needles.exact_method].groupby("seq_len").accuracy.mean().to_dict()
        tasks = ", ".join(sorted(set(needles.task)))
        path = _panels(_points(others, "accuracy"), "accuracy", exact, "needles answered, % (↑ better)",
                       "What the model answers with each method", f"{tasks}; mean over the tasks within the model",
                       folder / "generation-accuracy-vs-kept.png", style, percent=True)  # fmt: skip
        made.append((path, "Accuracy against the share of the cache kept, a line per method (kvpress's figure), a "
                           "panel per N; the exact model's is the dashed line."))  # fmt: skip
    forced = summary[summary.ppl_ratio.notna() & ~summary.exact_method]
    if len(forced):
        path = _panels(_points(forced, "ppl_ratio"), "ppl_ratio", {n: 1.0 for n in set(forced.seq_len)},
                       "perplexity ÷ the exact model's (↓ better)", "Continuation quality with each method",
                       "teacher-forced next tokens of a real text after the compressed prompt; geometric mean",
                       folder / "generation-continuation-vs-kept.png", style, percent=False)  # fmt: skip
        made.append((path, "The continuation's perplexity against the exact model's on the same tokens, against the "
                           "share of the cache kept."))  # fmt: skip
    return made
