"""The plots of an MQAR grid (`attnbench recall`): accuracy against pairs, against N, and against the state a mixer
keeps (Zoology's figure), each a point per variant setting at the mean over seeds with its 95% interval as a bar.
Drawn under the run report's theme, styles and legend (attnbench.report.plots)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from attnbench.report.plots import Style, themed, facets, finish_facets

ACCURACY_LABEL = "MQAR accuracy, % (↑ better)"


def _accuracy_facets(summary: pd.DataFrame, x: str, facet: str, facet_words: str, style: dict[str, Style]):
    """A panel per value of `facet`, each a line per label of mean accuracy against `x` with its interval bars."""
    data = summary.assign(percent=100 * summary.mean_accuracy)
    grid, labels = facets(data, x, "percent", facet, facet_words, style)
    for (value,), ax in zip([(v,) for v in grid.row_names], grid.axes.flat):
        panel = data[data[facet] == value]
        for label in labels:
            rows = panel[panel.label == label].sort_values(x)
            low, high = 100 * rows.low, 100 * rows.high
            ax.errorbar(rows[x], rows.percent, yerr=[rows.percent - low, high - rows.percent], fmt="none",
                        ecolor=style[label].colour, alpha=0.6, capsize=3)  # fmt: skip
        ax.set_xscale("log", base=2)
        ticks = sorted(data[x].unique())
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_ylim(-3, 103)
        ax.set_ylabel(ACCURACY_LABEL)
    return grid, labels


@themed
def plot_accuracy_versus(
    summary: pd.DataFrame, x: str, title: str, subtitle: str, path: Path, style: dict[str, Style]
) -> Path:
    """Accuracy against pairs (one panel per N) or against N (one panel per number of pairs)."""
    facet, words, xlabel = (
        ("seq_len", "N = {row_name}", "key–value pairs in the context")
        if x == "pairs"
        else ("pairs", "{row_name} pairs", "sequence length N (tokens)")
    )
    grid, labels = _accuracy_facets(summary, x, facet, words, style)
    for ax in grid.axes.flat:
        ax.set_xlabel(xlabel)
    return finish_facets(grid, title, subtitle, path, style, labels)


@themed
def plot_accuracy_versus_state(
    summary: pd.DataFrame, title: str, subtitle: str, path: Path, style: dict[str, Style]
) -> Path:
    """Zoology's figure: accuracy against the bytes a mixer keeps to decode (log), one panel per number of pairs;
    a variant whose state grows with N (a KV cache) draws a line across its N, a constant state one point."""
    data = summary[summary.state_bytes > 0].assign(state_kib=lambda f: f.state_bytes / 1024)
    grid, labels = _accuracy_facets(data, "state_kib", "pairs", "{row_name} pairs", style)
    for ax in grid.axes.flat:
        ax.xaxis.set_major_locator(FixedLocator(sorted({2**k for k in range(0, 40)})))
        ax.set_xlim(data.state_kib.min() / 1.5, data.state_kib.max() * 1.5)
        ax.set_xlabel("state kept to decode, KiB (log)")
    return finish_facets(grid, title, subtitle, path, style, labels)
