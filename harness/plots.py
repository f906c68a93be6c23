"""Plots of one run, drawn apart from measuring: speedup, time, memory and error against N, speed against error.

A variant keeps its colour in every report (fixed for the built-ins, derived from the name for plugins);
its hyperparameter settings differ by marker and line style. Titles say the message, the setting is the
subtitle; legends list only what has data; log axes are ticked in plain numbers ("2×", "4096").
"""

from __future__ import annotations

import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from attnbench.analysis import ERROR_RESOLUTION, pareto_front  # noqa: E402

EXACT_FLOOR = 1e-7  # error shown for exact variants (float rounding), so they sit on a log axis
BUILT_IN_COLOURS = {  # one colour per variant name, the same in every report
    "full": "#222222",
    "full-math": "#7f7f7f",
    "full-xformers": "#8c564b",
    "band": "#1f77b4",
    "strided": "#17becf",
    "lsh": "#d62728",
    "linformer": "#9467bd",
    "linear": "#2ca02c",
    "performer": "#ff7f0e",
}
PLUGIN_COLOURS = ["#e377c2", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
LINESTYLES = ["-", "--", ":", "-."]


@dataclass(frozen=True)
class Style:
    colour: str
    marker: str
    linestyle: str


def variant_name(label: str) -> str:
    """`band(window=64)` -> `band`."""
    return label.split("(", 1)[0]


def variant_colour(name: str) -> str:
    """The colour of a variant name: fixed for the built-ins, from a hash of the name for any other."""
    return BUILT_IN_COLOURS.get(name) or PLUGIN_COLOURS[zlib.crc32(name.encode()) % len(PLUGIN_COLOURS)]


def styles(labels: list[str]) -> dict[str, Style]:
    """Per label, in the given order (legends follow it): its variant's colour, and a marker and line style per
    hyperparameter setting of that variant (settings numbered in sorted order)."""
    by_name: dict[str, list[str]] = {}
    for label in sorted(set(labels)):
        by_name.setdefault(variant_name(label), []).append(label)
    out = {}
    for label in dict.fromkeys(labels):
        index = by_name[variant_name(label)].index(label)
        out[label] = Style(
            variant_colour(variant_name(label)), MARKERS[index % len(MARKERS)], LINESTYLES[index % len(LINESTYLES)]
        )
    return out


def _in_order(frame: pd.DataFrame, style: dict[str, Style]):
    """(label, rows) per label present, in the style's (the report's) order."""
    for label in style:
        rows = frame[frame.label == label]
        if len(rows):
            yield label, rows.sort_values("seq_len")


def _times(value: float, _position: int = 0) -> str:
    return f"{value:g}×"


def _n_axis(ax: plt.Axes, ns: list[int]) -> None:
    """N on a log2 axis, ticked at the swept lengths and written as plain numbers."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(ns))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    if len(ticks) == 1:
        ax.set_xlim(ticks[0] / 1.5, ticks[0] * 1.5)


def _ratio_axis(axis: matplotlib.axis.Axis, low: float, high: float) -> None:
    """A log ratio axis ticked at plain powers of two (…, 0.5×, 1×, 2×, 4×, …) between `low` and `high`."""
    exponents = range(int(np.floor(np.log2(max(low, 1e-3)))), int(np.ceil(np.log2(max(high, 1e-3)))) + 1)
    ticks = [2.0**e for e in exponents]
    if len(ticks) > 9:  # a wide range: every other power
        ticks = ticks[::2]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(_times))
    axis.set_minor_locator(NullLocator())


def _speedup_x_axis(ax: plt.Axes, points: pd.DataFrame) -> None:
    """A log speedup axis (ticked "2×") spanning the points' speedups and intervals, 1× included, with room for
    direct labels on the right."""
    ax.set_xscale("log")
    low = float(pd.concat([points.speedup_low, points.speedup, pd.Series([1.0])]).min())
    high = float(pd.concat([points.speedup_high, points.speedup, pd.Series([1.0])]).max())
    _ratio_axis(ax.xaxis, low, high)
    ax.set_xlim(low / 1.3, high * 2.2)


def _speedup_xerr(row) -> list[list[float]]:
    """matplotlib's asymmetric x error of one point: its speedup interval, never negative."""
    return [[max(row.speedup - row.speedup_low, 0)], [max(row.speedup_high - row.speedup, 0)]]


def _exact_floor(errors: pd.Series) -> float:
    """Where errors at float rounding are drawn: a decade under the smallest error that is not rounding."""
    approximate = errors[errors >= ERROR_RESOLUTION]
    return 10 ** np.floor(np.log10(approximate.min()) - 1) if len(approximate) else 1e-2


def _finish(fig: plt.Figure, axes: list[plt.Axes], title: str, subtitle: str, path: Path) -> Path:
    title = textwrap.fill(title, 85)
    fig.text(0.01, 0.985, title, fontsize=11, fontweight="bold", va="top")
    top = 0.985 - 0.05 * (title.count("\n") + 1)
    fig.text(0.01, top, textwrap.fill(subtitle, 130), fontsize=8, color="#555555", va="top")
    handles, labels = {}, []
    for ax in axes:
        ax.grid(True, which="major", alpha=0.3)
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles and not label.startswith("_"):
                handles[label] = handle
                labels.append(label)
    if handles:
        axes[-1].legend(
            [handles[label] for label in labels],
            labels,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            fontsize=8,
            frameon=False,
        )
    fig.tight_layout(rect=(0, 0, 1, top - 0.04))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _line(ax: plt.Axes, x, y, style: Style, label: str) -> None:
    ax.plot(x, y, marker=style.marker, linestyle=style.linestyle, color=style.colour, label=label, markersize=5)


def plot_versus_n(
    cells: pd.DataFrame,
    column: str,
    ylabel: str,
    title: str,
    subtitle: str,
    path: Path,
    style: dict[str, Style],
    scale: float = 1.0,
    band: tuple[str, str] | None = None,
) -> Path:
    """One line per label of `column` (times `scale`) against N, log-log; `band` = (low, high) columns shaded
    (the quartiles of the timing samples)."""
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    ok = cells[(cells.status == "ok") & cells[column].notna()]
    for label, group in _in_order(ok, style):
        _line(ax, group.seq_len, group[column].to_numpy(dtype=float) * scale, style[label], label)
        if band is not None and group[list(band)].notna().all().all():
            low, high = (group[b].to_numpy(dtype=float) * scale for b in band)
            ax.fill_between(group.seq_len, low, high, color=style[label].colour, alpha=0.15, linewidth=0)
    _n_axis(ax, list(cells.seq_len))
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel(ylabel)
    return _finish(fig, [ax], title, subtitle, path)


def plot_speedup(
    cells: pd.DataFrame, baseline: str, title: str, subtitle: str, path: Path, style: dict[str, Style]
) -> Path:
    """Speedup against the baseline by N, one line per label, its paired 95% interval as error bars, 1× marked."""
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    ok = cells[(cells.status == "ok") & cells.speedup.notna() & (cells.label != baseline)]
    for label, group in _in_order(ok, style):
        y = group.speedup.to_numpy(dtype=float)
        errors = np.vstack([y - group.speedup_low.to_numpy(dtype=float), group.speedup_high.to_numpy(dtype=float) - y])
        s = style[label]
        ax.errorbar(
            group.seq_len,
            y,
            yerr=np.clip(np.nan_to_num(errors), 0, None),
            color=s.colour,
            marker=s.marker,
            linestyle=s.linestyle,
            capsize=3,
            markersize=5,
            label=label,
        )
    ax.axhline(1.0, color="black", linewidth=1)
    ax.text(1.0, 1.0, f" {baseline} ", transform=ax.get_yaxis_transform(), fontsize=8, va="bottom", ha="right")
    _n_axis(ax, list(cells.seq_len))
    ax.set_yscale("log")
    values = pd.concat([ok.speedup_low, ok.speedup_high, pd.Series([1.0])]).dropna()
    _ratio_axis(ax.yaxis, float(values.min()), float(values.max()))
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel(f"speedup vs {baseline} (higher is better)")
    return _finish(fig, [ax], title, subtitle, path)


def plot_error(cells: pd.DataFrame, title: str, subtitle: str, path: Path, style: dict[str, Style]) -> Path:
    """Error relative to uniform averaging against N of the approximate variants, one panel per input; errors at
    float rounding (an exact-pattern variant whose support covers everything) sit on an "exact" floor line."""
    ok = cells[(cells.status == "ok") & cells.err_vs_uniform.notna() & (cells.family != "exact")]
    inputs = list(dict.fromkeys(ok["input"])) or ["(none)"]
    floor = _exact_floor(ok.err_vs_uniform)
    fig, axes = plt.subplots(1, len(inputs), figsize=(4.6 * len(inputs) + 2.6, 4.8), squeeze=False, sharey=True)
    for ax, source in zip(axes[0], inputs):
        for label, group in _in_order(ok[ok["input"] == source], style):
            _line(ax, group.seq_len, group.err_vs_uniform.clip(lower=floor), style[label], label)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.text(
            0.01, 1.0, "uniform averaging", transform=ax.get_yaxis_transform(), fontsize=7, color="grey", va="bottom"
        )
        if (ok.err_vs_uniform < ERROR_RESOLUTION).any():
            ax.axhline(floor, color="#999999", linestyle=":", linewidth=1)
            ax.text(
                0.01,
                floor,
                "exact (error ≈ 0)",
                transform=ax.get_yaxis_transform(),
                fontsize=7,
                color="grey",
                va="bottom",
            )
        _n_axis(ax, list(cells.seq_len))
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N (tokens)")
        ax.set_title(f"input: {source}", fontsize=9)
    axes[0][0].set_ylabel("error ‖O − O*‖ / ‖U − O*‖ (lower is better)")
    return _finish(fig, list(axes[0]), title, subtitle, path)


def _place_labels(ax: plt.Axes, points: list[tuple[float, float, str, str]]) -> None:
    """Direct labels beside their points, nudged up or down until they do not overlap (in pixels)."""
    fig = ax.figure
    fig.canvas.draw()
    placed: list[tuple[float, float, float, float]] = []
    for x, y, text, colour in sorted(points, key=lambda p: (-p[1], p[0])):
        px, py = ax.transData.transform((x, y))
        width, height = 5.2 * len(text) + 4, 11
        for dy in (4, -14, 14, -24, 24, -34, 34, -44, 44, 54, -54):
            box = (px + 7, py + dy, px + 7 + width, py + dy + height)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
                break
        placed.append(box)
        ax.annotate(
            text,
            (x, y),
            xytext=(7, dy),
            textcoords="offset points",
            fontsize=7.5,
            color=colour,
            arrowprops={"arrowstyle": "-", "color": colour, "lw": 0.5, "alpha": 0.6} if abs(dy) > 14 else None,
        )


def plot_pareto(
    points: pd.DataFrame, baseline: str, title: str, subtitle: str, path: Path, style: dict[str, Style]
) -> Path:
    """Speedup against error, one labelled bubble per label (area ~ peak memory), the frontier drawn.

    points: label, speedup, speedup_low, speedup_high, error, memory_ratio (to the baseline). Exact variants
    (error below ERROR_RESOLUTION) sit on a floor line marked "exact", a decade under the most accurate
    approximation, so the axis spans the errors that differ.
    """
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    floor = _exact_floor(points.error)
    shown = points.assign(error=points.error.clip(lower=floor))
    memory = shown.memory_ratio.fillna(1.0).clip(lower=0.01)
    sizes = 40 + 260 * np.sqrt(memory / memory.max())
    for (_, row), size in zip(shown.iterrows(), sizes):
        s = style[row.label]
        ax.errorbar(
            row.speedup,
            row.error,
            xerr=_speedup_xerr(row),
            color=s.colour,
            linewidth=1,
            zorder=2,
        )
        ax.scatter(
            row.speedup, row.error, s=size, color=s.colour, marker=s.marker, alpha=0.75, edgecolor="white", zorder=3
        )
    for label in style:  # legend entries of one size, only for what is drawn
        if label in set(shown.label):
            ax.plot([], [], linestyle="none", marker=style[label].marker, color=style[label].colour, label=label)
    front = pareto_front(shown.assign(error=shown.error.clip(lower=ERROR_RESOLUTION)))
    if len(front) > 1:
        front = shown.set_index("label").loc[front.label].sort_values("speedup")
        ax.step(
            front.speedup,
            front.error,
            where="post",
            color="black",
            linewidth=1,
            alpha=0.5,
            zorder=1,
            label="Pareto frontier",
        )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.text(0.01, 1.0, "uniform averaging", transform=ax.get_yaxis_transform(), fontsize=7, color="grey", va="bottom")
    if (points.error < ERROR_RESOLUTION).any():
        ax.axhline(floor, color="#999999", linestyle=":", linewidth=1)
        ax.text(
            0.01, floor, "exact (error ≈ 0)", transform=ax.get_yaxis_transform(), fontsize=7, color="grey", va="bottom"
        )
    ax.axvline(1.0, color="black", linewidth=1)
    _speedup_x_axis(ax, shown)
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, max(float(shown.error.max()) * 2, 2.0))
    ax.set_xlabel(f"speedup vs {baseline} (→ faster; bubble area ~ peak memory)")
    ax.set_ylabel("error vs uniform averaging (↓ more accurate)")
    _place_labels(ax, [(r.speedup, r.error, r.label, style[r.label].colour) for r in shown.itertuples()])
    return _finish(fig, [ax], title, subtitle, path)


def plot_layer_errors(rows: pd.DataFrame, title: str, subtitle: str, path: Path, style: dict[str, Style]) -> Path:
    """`attnbench model`: relative error by layer, per variant; left every layer swapped (hidden states), right
    one layer swapped at a time (that layer's attention output)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True, squeeze=False)
    exact = rows.groupby("label").rel_error.max() < ERROR_RESOLUTION  # exact everywhere: nothing to draw
    rows = rows[~rows.label.map(exact)]
    for ax, swap, name in zip(axes[0], ("all", "single"), ("every layer swapped", "one layer swapped")):
        chosen = rows[(rows.swap == swap) & (rows.layer != "final")]
        for label in style:
            mine = chosen[chosen.label == label]
            if len(mine):
                layers = mine.layer.astype(int)
                order = layers.argsort()
                s = style[label]
                ax.plot(
                    layers.iloc[order],
                    mine.rel_error.clip(lower=EXACT_FLOOR).iloc[order],
                    marker=s.marker,
                    linestyle=s.linestyle,
                    color=s.colour,
                    label=label,
                )
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title(name, fontsize=9)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes[0][0].set_ylabel("relative error vs the exact model")
    return _finish(fig, list(axes[0]), title, subtitle, path)


def plot_loss_vs_speedup(finals: pd.DataFrame, title: str, subtitle: str, path: Path, style: dict[str, Style]) -> Path:
    """`attnbench model`: each variant's end-to-end forward speedup against its change in loss."""
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    for row in finals.itertuples():
        s = style[row.label]
        ax.errorbar(
            row.speedup,
            row.loss_change,
            xerr=_speedup_xerr(row),
            color=s.colour,
            marker=s.marker,
            capsize=3,
            linestyle="none",
            label=row.label,
        )
    _place_labels(ax, [(r.speedup, r.loss_change, r.label, style[r.label].colour) for r in finals.itertuples()])
    ax.axhline(0.0, color="grey", linestyle="--", linewidth=1)
    ax.axvline(1.0, color="black", linewidth=1)
    _speedup_x_axis(ax, finals)
    ax.set_xlabel("forward speedup vs the exact model (→ faster)")
    ax.set_ylabel("loss change on the text (nats per token, ↓ better)")
    return _finish(fig, [ax], title, subtitle, path)
