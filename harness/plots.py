"""Plots of one run, drawn apart from measuring: time, memory and error against N, and speed against error.

One colour per variant label for the whole run, log scales where the data spans decades, labelled axes
with units, and the legend outside the data.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

EXACT_FLOOR = 1e-7  # error shown for exact variants (float rounding), so they sit on a log axis


def variant_palette(labels: list[str]) -> dict[str, tuple]:
    """A fixed colour per label, the same in every plot of the run."""
    ordered = sorted(set(labels))
    colours = sns.color_palette("tab10" if len(ordered) <= 10 else "husl", len(ordered))
    return dict(zip(ordered, colours))


def _n_axis(ax: plt.Axes, ns: list[int]) -> None:
    """N on a log2 axis, ticked at the swept lengths and written as plain numbers."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(ns)))
    ax.set_xticklabels([f"{n:g}" for n in sorted(set(ns))])
    ax.minorticks_off()


def _finish(fig: plt.Figure, ax: plt.Axes, title: str, path: Path) -> Path:
    fig.suptitle(textwrap.fill(title, 100), fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_versus_n(
    cells: pd.DataFrame,
    column: str,
    ylabel: str,
    title: str,
    path: Path,
    palette: dict[str, tuple],
    scale: float = 1.0,
    band: str | None = None,
) -> Path:
    """One line per variant label of `column` (times `scale`) against N, log-log; `band` draws ± column / 2."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ok = cells[(cells.status == "ok") & cells[column].notna()]
    for label, group in ok.groupby("label", sort=True):
        group = group.sort_values("seq_len")
        y = group[column].to_numpy(dtype=float) * scale
        ax.plot(group.seq_len, y, marker="o", label=label, color=palette[label])
        if band is not None:
            half = group[band].to_numpy(dtype=float) * scale / 2
            ax.fill_between(group.seq_len, np.maximum(y - half, y * 1e-3), y + half, color=palette[label], alpha=0.2)
    _n_axis(ax, list(cells.seq_len))
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel(ylabel)
    return _finish(fig, ax, title, path)


def plot_error(cells: pd.DataFrame, title: str, path: Path, palette: dict[str, tuple]) -> Path:
    """Error relative to uniform averaging against N, one panel per input distribution."""
    ok = cells[(cells.status == "ok") & cells.err_vs_uniform.notna()]
    inputs = sorted(ok["input"].unique()) or ["(none)"]
    fig, axes = plt.subplots(1, len(inputs), figsize=(5 * len(inputs) + 3, 4.5), squeeze=False, sharey=True)
    for ax, source in zip(axes[0], inputs):
        for label, group in ok[ok["input"] == source].groupby("label", sort=True):
            group = group.sort_values("seq_len")
            ax.plot(
                group.seq_len,
                group.err_vs_uniform.clip(lower=EXACT_FLOOR),
                marker="o",
                label=label,
                color=palette[label],
            )
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        _n_axis(ax, list(cells.seq_len))
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N (tokens)")
        ax.set_title(f"input: {source}", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("‖O − O*‖ / ‖U − O*‖  (1 = uniform averaging)")
    return _finish(fig, axes[0][-1], title, path)


def pareto_front(points: pd.DataFrame) -> pd.DataFrame:
    """The points no other point beats on both speedup (higher) and error (lower), by speedup."""
    ordered = points.sort_values(["speedup", "error"], ascending=[False, True])
    front, best = [], np.inf
    for _, row in ordered.iterrows():
        if row.error < best:
            front.append(row)
            best = row.error
    return pd.DataFrame(front).sort_values("speedup") if front else points.iloc[0:0]


def plot_pareto(points: pd.DataFrame, title: str, path: Path, palette: dict[str, tuple]) -> Path:
    """Speedup vs `full` against error, one point per variant label, the frontier drawn."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    shown = points.assign(error=points.error.clip(lower=EXACT_FLOOR))
    for _, row in shown.iterrows():
        ax.scatter(row.speedup, row.error, s=60, color=palette[row.label], label=row.label, zorder=3)
    front = pareto_front(shown)
    if len(front) > 1:
        ax.step(
            front.speedup, front.error, where="post", color="black", linewidth=1, alpha=0.6, label="Pareto frontier"
        )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("speedup vs full (×, higher is better)")
    ax.set_ylabel("error vs uniform (lower is better)")
    return _finish(fig, ax, title, path)
