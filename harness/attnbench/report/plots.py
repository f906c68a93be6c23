"""Plots of one run, drawn apart from measuring: speedup, time, memory and error against N, speed against error.

Drawn with seaborn under one theme sized for a phone: a figure is FIGURE_WIDTH inches wide, so shown 368 px
wide (on a 390 px screen) its smallest text is still 11 px. A variant keeps its colour in every report
(fixed for the built-ins, derived from the name for plugins); its hyperparameter settings differ by marker and
dashes. Titles say the message, the setting is the subtitle; legends sit under the plot and list only what
has data, and name the reference lines (1×, the roofline, averaging V, the error budget) that data crowds around;
log axes are ticked in plain numbers ("2×", "4096"); plots with several inputs (or swaps) are seaborn facets, one
panel each. A direct label never covers a point or other text (`_place_labels`), and markers that would coincide
are set a little apart (attnbench.report.plot_layout).
"""

from __future__ import annotations

import functools
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatter, MaxNLocator, NullLocator  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from attnbench.atomic import write_atomic  # noqa: E402
from attnbench.plan.cells import label_variant  # noqa: E402
from attnbench.report.analysis import ERROR_RESOLUTION  # noqa: E402
from attnbench.report.plot_layout import ErrorSpan, dodge, error_span, log_fraction, placed_errors  # noqa: E402

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
    "nystromformer": "#a6761d",
    "bigbird": "#1b9e77",
    "topk": "#e6ab02",
    "h2o": "#e7298a",  # KV-cache compression (decode)
    "snapkv": "#6a3d9a",
    "retnet": "#393b79",  # gated and delta-rule linear attention: dark, apart from the approximations' colours
    "gla": "#637939",
    "deltanet": "#843c39",
    "gated-deltanet": "#e377c2",
    # kvpress's presses, DuoAttention's head-wise cache, ThinK's key channels, KIVI's quantized cache (decode)
    "random": "#aaaaaa",
    "knorm": "#66a61e",
    "keydiff": "#a6cee3",
    "lagkv": "#fb9a99",
    "tova": "#cab2d6",
    "observed-attention": "#fdbf6f",
    "cur": "#b2df8a",
    "compactor": "#ff7f00",
    "expected-attention": "#e31a1c",
    "finch": "#33a02c",
    "kvzip": "#b15928",
    "duo-attention": "#1f78b4",
    "think": "#8dd3c7",
    "kivi": "#4d4d4d",
}
PLUGIN_COLOURS = ["#bcbd22", "#8c6d31", "#7b4173", "#3182bd", "#e6550d", "#b5cf6b", "#9c9ede", "#e7969c", "#636363"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
DASHES: list[tuple[float, ...]] = [(), (4, 1.5), (1, 1), (3, 1.25, 1.5, 1.25)]  # solid, dashed, dotted, dash-dot

FIGURE_WIDTH = 6.0  # inches; with the theme's fonts (≥ 13 pt) text is ≥ 11 px where the figure is 368 px wide
PANEL_HEIGHT = 3.8  # inches of plot area per panel; title, subtitle and legend add their own height
DPI = 160  # 960 px wide: sharp on a phone's dense screen, and the size the report shows when a plot is opened
THEME = {"style": "whitegrid", "context": "notebook", "font_scale": 1.3}  # seaborn's: 14.3 pt ticks, 15.6 pt labels
GREY = "#555555"
N_LABEL = "sequence length N (tokens)"  # the x axis of plots against N; decode's says context (attnbench.report.modes)
HALO = {"facecolor": "white", "alpha": 0.7, "edgecolor": "none", "pad": 1}  # behind text drawn over lines
MARK_RADIUS = 10  # points: a marker's half width (a bubble's at most), which no direct label may cover


@dataclass(frozen=True)
class Style:
    colour: str
    marker: str
    dashes: tuple[float, ...]  # seaborn's dash spec: () is a solid line

    @property
    def linestyle(self) -> str | tuple[int, tuple[float, ...]]:
        """The dashes as a matplotlib line style."""
        return (0, self.dashes) if self.dashes else "-"


def variant_name(label: str) -> str:
    """`band(window=64)` -> `band` (`band compiled` too: a compiled setting keeps its variant's colour)."""
    return label_variant(label).split("(", 1)[0]


def variant_colour(name: str) -> str:
    """The colour of a variant name: fixed for the built-ins, from a hash of the name for any other."""
    return BUILT_IN_COLOURS.get(name) or PLUGIN_COLOURS[zlib.crc32(name.encode()) % len(PLUGIN_COLOURS)]


def styles(labels: list[str]) -> dict[str, Style]:
    """Per label, in the given order (legends follow it): its variant's colour, and a marker and dashes per
    hyperparameter setting of that variant (settings numbered in sorted order)."""
    by_name: dict[str, list[str]] = {}
    for label in sorted(set(labels)):
        by_name.setdefault(variant_name(label), []).append(label)
    out = {}
    for label in dict.fromkeys(labels):
        name = variant_name(label)
        index = by_name[name].index(label)
        out[label] = Style(variant_colour(name), MARKERS[index % len(MARKERS)], DASHES[index % len(DASHES)])
    return out


def themed(plot: Callable[..., Path]) -> Callable[..., Path]:
    """Draw under the report's seaborn theme, scoped: the caller's matplotlib settings are left as they were."""

    @functools.wraps(plot)
    def themed(*args, **kwargs) -> Path:
        with sns.axes_style(THEME["style"]), sns.plotting_context(THEME["context"], font_scale=THEME["font_scale"]):
            return plot(*args, **kwargs)

    return themed


def _present(frame: pd.DataFrame, style: dict[str, Style]) -> list[str]:
    """The labels of `frame` in the style's (the report's) order."""
    present = set(frame.label)
    return [label for label in style if label in present]


def _by_label(style: dict[str, Style], labels: list[str], lines: bool = True) -> dict:
    """seaborn's arguments that draw each label in its own colour and marker (and dashes, for `lines`)."""
    kwargs = {
        "hue": "label",
        "style": "label",
        "hue_order": labels,
        "style_order": labels,
        "palette": {label: style[label].colour for label in labels},
        "markers": {label: style[label].marker for label in labels},
    }
    return kwargs | ({"dashes": {label: style[label].dashes for label in labels}} if lines else {})


def _lines(
    ax: plt.Axes,
    data: pd.DataFrame,
    y: str,
    style: dict[str, Style],
    errorbar: tuple[str, int] | None = None,
    x: str = "seq_len",
) -> list[str]:
    """A seaborn line per label of `data` against N in its fixed colour, marker and dashes: the median of the rows
    at each N, with `errorbar` (seaborn's, e.g. ("pi", 50) for the quartiles) shaded. Returns the labels drawn."""
    labels = _present(data, style)
    if labels:
        sns.lineplot(
            data=data,
            x=x,
            y=y,
            **_by_label(style, labels),
            estimator="median",
            errorbar=errorbar,
            err_kws={"alpha": 0.15, "linewidth": 0},
            markersize=7,
            legend=False,
            ax=ax,
        )
    return labels


def _key(style: Style, line: bool = True) -> Line2D:
    """A legend handle: the marker, on a line in the label's dashes when `line`."""
    return Line2D(
        [], [], color=style.colour, marker=style.marker, linestyle=style.linestyle if line else "none", markersize=7
    )


def _times(value: float, _position: int = 0) -> str:
    """A ratio as a tick label: "4×", and "1/4×" under one (shorter than 0.25×, much shorter than 0.015625×)."""
    return f"{value:g}×" if value >= 1 else f"1/{1 / value:g}×"


def _n_axis(ax: plt.Axes, ns: list[int]) -> None:
    """N on a log2 axis, ticked at the swept lengths and written as plain numbers."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(ns))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    if len(ticks) == 1:
        ax.set_xlim(ticks[0] / 1.5, ticks[0] * 1.5)


class _PlainLogFormatter(LogFormatter):
    """matplotlib's choice of which log ticks to label, written as plain numbers (0.3, 2, 100): no superscripts,
    which are too small to read on a phone."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:g}" if super().__call__(x, pos) else ""


def _log_y(ax: plt.Axes) -> None:
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(_PlainLogFormatter())
    ax.yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False))


def _ratio_axis(axis: matplotlib.axis.Axis, low: float, high: float) -> None:
    """A log ratio axis ticked at plain powers of two (…, 0.5×, 1×, 2×, 4×, …) between `low` and `high`."""
    exponents = range(int(np.floor(np.log2(max(low, 1e-3)))), int(np.ceil(np.log2(max(high, 1e-3)))) + 1)
    ticks = [2.0**e for e in exponents]
    if len(ticks) > 6:  # a wide range: every other power (every third for a very wide one), so labels fit
        ticks = ticks[:: 2 if len(ticks) <= 12 else 3]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(_times))
    axis.set_minor_locator(NullLocator())


def _speedup_x_axis(ax: plt.Axes, points: pd.DataFrame) -> None:
    """A log speedup axis (ticked "2×") spanning the points' speedups and intervals, 1× included, with room for
    direct labels."""
    ax.set_xscale("log")
    low = float(pd.concat([points.speedup_low, points.speedup, pd.Series([1.0])]).min())
    high = float(pd.concat([points.speedup_high, points.speedup, pd.Series([1.0])]).max())
    _ratio_axis(ax.xaxis, low, high)
    ax.set_xlim(low / 1.3, high * 1.6)


def _speedup_xerr(row) -> list[list[float]]:
    """matplotlib's asymmetric x error of one point: its speedup interval, never negative."""
    return [[max(row.speedup - row.speedup_low, 0)], [max(row.speedup_high - row.speedup, 0)]]


def _reference_line(
    ax: plt.Axes, y: float, text: str, linestyle: str = "--", colour: str = "#999999", right: bool = False
) -> None:
    """A horizontal reference (the baseline, uniform averaging, the exact floor) named above its left end, or with
    `right` under its right end (two references close together keep their names apart)."""
    ax.axhline(y, color=colour, linestyle=linestyle, linewidth=1.2)
    x, ha, va = (0.99, "right", "top") if right else (0.01, "left", "bottom")
    ax.text(x, y, text, transform=ax.get_yaxis_transform(), fontsize="small", color=GREY, ha=ha, va=va, bbox=HALO)


def _marks(ax: plt.Axes, points: list[tuple[float, float]]) -> list[Bbox]:
    """The pixel box of a marker (MARK_RADIUS) at each point, in data coordinates; after the layout."""
    radius = MARK_RADIUS * ax.figure.dpi / 72
    centres = [ax.transData.transform(point) for point in points]
    return [Bbox.from_extents(x - radius, y - radius, x + radius, y + radius) for x, y in centres]


def _wrap(text: str, points: float, width_in: float) -> str:
    """`text` wrapped to lines that fit `width_in` inches at a font of `points` (an average glyph ~0.56 em)."""
    return textwrap.fill(text, max(int(width_in * 72 / (0.56 * points)), 20))


def _frame(fig: plt.Figure, title: str, subtitle: str, legend: dict[str, Line2D]) -> None:
    """Title and subtitle above the plot, the legend in two columns under it; the figure grows to hold them
    (its width stays FIGURE_WIDTH: the phone's text size depends on it)."""
    size = plt.rcParams["font.size"]
    title_pt, subtitle_pt = 1.15 * size, 0.85 * size
    width = fig.get_figwidth()
    title = _wrap(title, title_pt * 1.08, width - 0.15)  # bold is wider
    subtitle = _wrap(subtitle, subtitle_pt, width - 0.15)
    header = (title.count("\n") + 1) * 1.3 * title_pt / 72 + (subtitle.count("\n") + 1) * 1.3 * subtitle_pt / 72 + 0.2
    legend_height, options = 0.0, {"fontsize": "small", "frameon": False, "handlelength": 2.0, "columnspacing": 1.0}
    if legend:
        trial = fig.legend(list(legend.values()), list(legend), ncols=2, **options)  # two columns, if they fit
        columns = 2 if trial.get_window_extent(fig.canvas.get_renderer()).width <= fig.bbox.width else 1
        trial.remove()
        rows = -(-len(legend) // columns)
        legend_height = rows * 1.45 * 0.83 * size / 72 + 0.25
    body = fig.get_figheight()
    height = body + header + legend_height
    fig.set_figheight(height)
    fig.set_layout_engine("constrained", rect=(0, 0, 1, 1 - header / height))
    fig.text(0.1 / width, 1 - 0.1 / height, title, fontsize=title_pt, fontweight="bold", va="top")
    fig.text(0.1 / width, 1 - 0.1 / height - (title.count("\n") + 1) * 1.3 * title_pt / 72 / height, subtitle,
             fontsize=subtitle_pt, color=GREY, va="top")  # fmt: skip
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=columns, **options)


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # a full disk leaves no half image
        kind = path.suffix.lstrip(".") or "png"  # the temporary file's name does not say it
        write_atomic(path, lambda temporary: fig.savefig(temporary, format=kind, dpi=DPI, facecolor="white"))
    finally:
        plt.close(fig)
    return path


def _finish(fig: plt.Figure, title: str, subtitle: str, path: Path, legend: dict[str, Line2D]) -> Path:
    _frame(fig, title, subtitle, legend)
    return _save(fig, path)


def facets(
    data: pd.DataFrame, x: str, y: str, row: str, row_words: str, style: dict[str, Style]
) -> tuple[sns.FacetGrid, list[str]]:
    """One panel per value of `row` (one under the other, axes shared), a line per label of `y` against `x` in its
    fixed style; titled `row_words` ("input: {row_name}"). Returns the grid and the labels drawn."""
    labels = _present(data, style)
    grid = sns.relplot(
        data=data,
        kind="line",
        x=x,
        y=y,
        row=row,
        **_by_label(style, labels),
        markersize=7,
        legend=False,
        height=PANEL_HEIGHT,
        aspect=FIGURE_WIDTH / PANEL_HEIGHT,
        facet_kws={"sharey": True, "sharex": True, "despine": False},
    )
    grid.set_titles(row_template=row_words)
    for ax in grid.axes.flat:  # a long input label ("needles(background=heads, pairs=16, text=prose)") wraps
        title = ax.title
        ax.set_title(_wrap(title.get_text(), title.get_fontsize(), FIGURE_WIDTH - 1.0))
    return grid, labels


def finish_facets(
    grid: sns.FacetGrid,
    title: str,
    subtitle: str,
    path: Path,
    style: dict[str, Style],
    labels: list[str],
    legend: dict[str, Line2D] | None = None,
) -> Path:
    """A facet grid sized FIGURE_WIDTH wide and PANEL_HEIGHT a panel, titled, its legend under it (a key per label,
    or `legend` where given), saved."""
    fig = grid.figure
    fig.set_size_inches(FIGURE_WIDTH, PANEL_HEIGHT * len(grid.axes.flat))
    return _finish(fig, title, subtitle, path, legend or {label: _key(style[label]) for label in labels})


@themed
def plot_versus_n(
    cells: pd.DataFrame,
    column: str,
    ylabel: str,
    title: str,
    subtitle: str,
    path: Path,
    style: dict[str, Style],
    scale: float = 1.0,
    samples: pd.DataFrame | None = None,
    lower_bounds: frozenset[str] = frozenset(),
    xlabel: str = N_LABEL,
) -> Path:
    """One line per label of `column` (times `scale`) against N, log-log: time per call or per generated token,
    peak memory, a decode cache. With `samples` (label, seq_len and `column`, one row per raw sample) the line is
    their median and the band their quartiles; without, the cells' own values. Labels in `lower_bounds` are marked
    so in the legend (a figure that misses something)."""
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, PANEL_HEIGHT))
    ok = cells[(cells.status == "ok") & cells[column].notna()]
    data = ok if samples is None else samples[samples.label.isin(set(ok.label))]
    data = data.assign(**{column: data[column].astype(float) * scale})
    labels = _lines(ax, data, column, style, errorbar=None if samples is None else ("pi", 50))
    _n_axis(ax, list(cells.seq_len))
    _log_y(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    legend = {label + (" (lower bound)" if label in lower_bounds else ""): _key(style[label]) for label in labels}
    return _finish(fig, title, subtitle, path, legend)


@themed
def plot_speedup(
    cells: pd.DataFrame,
    baseline: str,
    title: str,
    subtitle: str,
    path: Path,
    style: dict[str, Style],
    xlabel: str = N_LABEL,
) -> Path:
    """Speedup against the baseline by N, one line per label, its paired 95% interval as error bars, 1× marked."""
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, PANEL_HEIGHT))
    ok = cells[(cells.status == "ok") & cells.speedup.notna() & (cells.label != baseline)]
    present = _present(ok, style)
    # dodged: the labels' intervals at one N side by side, a few percent of an octave apart, not on top of each other
    shift = {label: 2 ** (0.05 * (i - (len(present) - 1) / 2)) for i, label in enumerate(present)}
    ok = ok.assign(dodged=ok.seq_len * ok.label.map(shift))
    labels = _lines(ax, ok, "speedup", style, x="dodged")
    for label in labels:
        group = ok[ok.label == label].sort_values("seq_len")
        y = group.speedup.to_numpy(dtype=float)
        errors = np.vstack([y - group.speedup_low.to_numpy(dtype=float), group.speedup_high.to_numpy(dtype=float) - y])
        ax.errorbar(
            group.dodged, y, yerr=np.clip(np.nan_to_num(errors), 0, None), fmt="none", ecolor=style[label].colour,
            capsize=3, linewidth=1.2,
        )  # fmt: skip
    one = ax.axhline(1.0, color="black", linewidth=1.2)  # named in the legend: a dozen lines cross it
    _n_axis(ax, list(cells.seq_len))
    ax.set_yscale("log")
    values = pd.concat([ok.speedup_low, ok.speedup_high, pd.Series([1.0])]).dropna()
    _ratio_axis(ax.yaxis, float(values.min()), float(values.max()))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"speedup vs {baseline} (↑ better)")
    legend = {label: _key(style[label]) for label in labels} | {f"{baseline} (1×)": one}
    return _finish(fig, title, subtitle, path, legend)


ROOFLINE_TARGET = 1.5  # time over roofline the plot marks: within it, a speedup is mostly the method's


@themed
def plot_roofline(
    cells: pd.DataFrame, title: str, subtitle: str, path: Path, style: dict[str, Style], xlabel: str = N_LABEL
) -> Path:
    """Time over roofline (1 / `of_roofline`) by N, one line per label, the roofline (1×) and 1.5× marked: where a
    line sits far above them, the implementation, not the method, sets that variant's speed."""
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, PANEL_HEIGHT))
    ok = cells[(cells.status == "ok") & (cells.of_roofline > 0)]
    ok = ok.assign(over_roofline=1 / ok.of_roofline)
    labels = _lines(ax, ok, "over_roofline", style)
    references = {  # named in the legend: the lines near them would cover their names
        "roofline (1×)": ax.axhline(1.0, color="black", linewidth=1.2),
        f"{ROOFLINE_TARGET:g}× the roofline": ax.axhline(ROOFLINE_TARGET, color="#999999", linestyle="--", lw=1.2),
    }
    _n_axis(ax, list(cells.seq_len))
    ax.set_yscale("log")
    values = pd.concat([ok.over_roofline, pd.Series([1.0, ROOFLINE_TARGET])]).dropna()
    _ratio_axis(ax.yaxis, float(values.min()), float(values.max()))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("time / roofline (↓ better)")
    return _finish(fig, title, subtitle, path, {label: _key(style[label]) for label in labels} | references)


OFF_MARKER = "^"  # a point drawn at the top edge of an error axis: beyond it, or not judged on error
OFF_SIZE = 70  # its area, pt²: one size, its error is not on the axis to size it by


def _off_words(label: str, error: float, judged: bool) -> str:
    """A legend entry for a variant drawn at the top edge of an error axis (its triangle says where): why."""
    shown = f"{error:,.0f}" if error >= 100 else f"{error:.3g}"
    return f"{label}: error {shown}, off the axis" if judged else f"{label}: not judged on error ({shown})"


def _error_axis(ax: plt.Axes, span: ErrorSpan, budget: float | None, floor_used: bool) -> dict[str, Line2D]:
    """A log error axis over `span`, with its reference lines: averaging V (1), the budget, the exact floor if
    used. Returns their legend entries: named there, not on the plot, where the points crowd around them."""
    _log_y(ax)
    ax.set_ylim(span.low, span.high)
    references = {"uniform averaging (1)": (1.0, "--")}
    if budget is not None:
        references[f"error budget {budget:g}"] = (budget, "-.")
    if floor_used:
        references["exact (error ≈ 0)"] = (span.floor, ":")
    ax.set_ylabel("error vs uniform (↓ better)")
    return {
        name: ax.axhline(y, color="#999999", linestyle=linestyle, linewidth=1.2)
        for name, (y, linestyle) in references.items()
    }


def _dodged_n(data: pd.DataFrame, y: str, low: float, high: float, panel: str | None = None) -> pd.Series:
    """N of each row moved sideways where its marker would hide another's at the same N and about the same `y`
    (a linear axis from `low` to `high`), panel by panel: one octave-fraction per step, in the rows' order."""
    ns = data.seq_len.astype(float)
    octaves = np.log2(ns.max() / ns.min()) * 1.1 if ns.max() > ns.min() else np.log2(1.5**2)  # the axis' span
    shifted = pd.Series(0.0, index=data.index)
    for _, rows in data.groupby(panel, sort=False) if panel else [(None, data)]:
        x = np.log2(rows.seq_len.astype(float)) / octaves
        shifted[rows.index] = dodge(x, (rows[y].astype(float) - low) / (high - low))
    return ns * 2 ** (shifted * octaves)


@themed
def plot_error(
    cells: pd.DataFrame,
    title: str,
    subtitle: str,
    path: Path,
    style: dict[str, Style],
    budget: float | None = None,
    xlabel: str = N_LABEL,
    unjudged: frozenset[str] = frozenset(),
) -> Path:
    """Error relative to uniform averaging against N of the approximate variants, a seaborn facet (one panel
    under the other) per input; errors at float rounding (an exact-pattern variant whose support covers
    everything) sit on an "exact" floor line; with `budget`, the verdict's accuracy budget is a line too. The axis
    spans the errors of the variants the verdict judges on error: those in `unjudged` (a different operator from
    softmax, `attnbench.report.decision_plots.not_judged_on_error`) and errors beyond the axis are drawn as
    triangles at its top edge, their legend entry saying so."""
    ok = cells[(cells.status == "ok") & cells.err_vs_uniform.notna() & (cells.family != "exact")]
    judged = ~ok.label.isin(unjudged)
    rounding = bool((ok.err_vs_uniform[judged] < ERROR_RESOLUTION).any())  # an exact-pattern variant: a floor line
    span = error_span(ok.err_vs_uniform[judged], budget, floor=rounding)
    shown, off = placed_errors(ok.err_vs_uniform, judged, span)
    data = ok.assign(shown=shown, off=off, line=shown.where(judged))  # a line for the judged, clipped at the edge
    grid, labels = facets(data, "seq_len", "line", "input", "input: {row_name}", style)
    edge = data[data.off]
    edge = edge.assign(dodged=_dodged_n(edge, "shown", 0, 1, panel="input"))
    for name, ax in grid.axes_dict.items():
        for row in edge[edge["input"] == name].itertuples():
            ax.scatter(row.dodged, span.edge, marker=OFF_MARKER, s=OFF_SIZE, color=style[row.label].colour, zorder=3,
                       edgecolors="white", clip_on=False)  # fmt: skip
        references = _error_axis(ax, span, budget, rounding)
        _n_axis(ax, list(cells.seq_len))
        ax.set_xlabel(xlabel)
    worst = data[data.off].groupby("label").err_vs_uniform.max()
    legend = {}
    for label in labels:
        if label in worst.index:
            legend[_off_words(label, worst[label], label not in unjudged)] = _key(
                Style(style[label].colour, OFF_MARKER, style[label].dashes), line=label not in unjudged
            )
        else:
            legend[label] = _key(style[label])
    return finish_facets(grid, title, subtitle, path, style, labels, legend | references)


@themed
def plot_recall(
    cells: pd.DataFrame, title: str, subtitle: str, path: Path, style: dict[str, Style], xlabel: str = N_LABEL
) -> Path:
    """Needle recall against N, one panel per `needles` input (its pairs, margin, background): the share of needles
    each variant's output retrieves (exact attention at 100%, chance near 0). Markers that would coincide (equal
    recall at one N, as every variant that finds none) are set side by side, a little apart in N."""
    data = cells[(cells.status == "ok") & cells.needle_accuracy.notna()]
    order = {label: i for i, label in enumerate(style)}
    data = data.assign(recall=100 * data.needle_accuracy, order=data.label.map(order)).sort_values(["order", "seq_len"])
    data = data.assign(dodged=_dodged_n(data, "recall", -3, 103, panel="input"))
    grid, labels = facets(data, "dodged", "recall", "input", "input: {row_name}", style)
    for ax in grid.axes.flat:
        _n_axis(ax, list(data.seq_len))
        ax.set_ylim(-3, 103)
        ax.set_ylabel("needles retrieved, % (↑ better)")
        ax.set_xlabel(xlabel)
    return finish_facets(grid, title, subtitle, path, style, labels)


def _label_spots(step: float) -> list[tuple[float, float, str]]:
    """Where a direct label may go, in order of preference: (x, y offset from its point in points, alignment):
    beside it, then centred above or below it, then beside it further up or down."""
    beside = [(10.0 * side, k * step) for k in (0, -1, 1, -2, 2) for side in (1, -1)]
    centred = [(0.0, k * step) for k in (-1.5, 1.5, -2.5, 2.5, -3.5, 3.5)]
    further = [(10.0 * side, k * step) for k in (-3, 3, -4, 4, -5, 5) for side in (1, -1)]
    return [(x, y, "left" if x > 0 else "right" if x < 0 else "center") for x, y in beside + centred + further]


def _place_labels(
    ax: plt.Axes, points: list[tuple[float, float, str, str]], others: list[tuple[float, float]] = ()
) -> None:
    """Direct labels beside their points, in the order given (the first gets the best spot): each on the first
    spot (`_label_spots`; a long label broken after its commas where it fits no other way) inside the axes that
    covers no point (`others`: the points drawn without a label too), no other label and no text already drawn.
    A label with no free spot is left out: the legend names its point. Call after the layout is done (it works in
    its pixels)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    taken = [text.get_window_extent(renderer) for text in ax.texts]
    owners = [text for _, _, text, _ in points] + [""] * len(others)
    marks = list(zip(owners, _marks(ax, [(x, y) for x, y, _, _ in points] + list(others))))
    kwargs = {"textcoords": "offset points", "fontsize": "small", "va": "center", "bbox": HALO}
    for x, y, text, colour in points:
        avoid = taken + [box for owner, box in marks if owner != text]
        label = ax.annotate(text, (x, y), xytext=(10, 0), color=colour, **kwargs)
        step = label.get_fontsize() * 1.2  # points: a line of the label's font
        forms = [text] + ([text.replace(", ", ",\n")] if ", " in text else [])  # one line, then broken
        spots = [(form, spot) for form in forms for spot in _label_spots(step)]
        for form, (dx, dy, ha) in spots:
            label.set_text(form)
            label.xyann = (dx, dy * (form.count("\n") + 1) if dy and not dx else dy)
            label.set_horizontalalignment(ha)
            box = label.get_window_extent(renderer)
            fits = box.x0 >= inside.x0 and box.x1 <= inside.x1 and box.y0 >= inside.y0 and box.y1 <= inside.y1
            if fits and not any(box.overlaps(other) for other in avoid):
                break
        else:
            label.remove()
            continue
        taken.append(box)
        if label.xyann[1]:  # moved off its point's height: drawn again with a thin leader line back to it
            offset = label.xyann
            label.remove()
            leader = {"arrowstyle": "-", "color": colour, "lw": 0.8, "alpha": 0.6, "shrinkB": 6}
            label = ax.annotate(form, (x, y), xytext=offset, ha=ha, color=colour, arrowprops=leader, **kwargs)
        label.set_in_layout(False)


@themed
def plot_pareto(
    points: pd.DataFrame,
    front: list[str],
    baseline: str,
    title: str,
    subtitle: str,
    path: Path,
    style: dict[str, Style],
    budget: float | None = None,
    bubble: str = "peak memory",
) -> Path:
    """Speedup against error, one bubble per label (area ~ `bubble`: peak memory, or decode's cache), the
    verdict's choices joined and labelled on the plot (the rest named in the legend); with `budget`, the verdict's
    accuracy budget as a line (above it, no variant is recommended).

    points: label, speedup, speedup_low, speedup_high, error, memory_ratio (to the baseline), and optionally
    judged (whether the verdict weighs its error: `attnbench.report.decision_plots`); `front`: the labels the
    verdict offers (`attnbench.report.verdict.pareto_set`, one rule for both), drawn as the frontier. The error
    axis spans the judged errors (`attnbench.report.plot_layout.error_span`): exact variants (error below
    ERROR_RESOLUTION) sit on a floor line marked "exact", a decade under the most accurate approximation; a variant
    not judged on error, or beyond the axis, is a triangle at its top edge, its legend entry saying so. Bubbles
    that would hide one another are set a little apart sideways.
    """
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, PANEL_HEIGHT + 0.6))
    judged = points.judged.astype(bool) if "judged" in points else pd.Series(True, index=points.index)
    span = error_span(points.error[judged], budget)
    shown, off = placed_errors(points.error, judged, span)
    memory = points.memory_ratio.fillna(1.0).clip(lower=0.01)
    shown = points.assign(
        shown=shown, off=off, judged=judged, size=(50 + 350 * memory / memory.max()).where(~off, OFF_SIZE)
    )  # area: 50 pt² plus a part in proportion to peak memory
    _speedup_x_axis(ax, shown)  # the axes first: markers are dodged in their fractions
    low, high = ax.get_xlim()
    factor = np.exp(dodge(log_fraction(shown.speedup, low, high), log_fraction(shown.shown, span.low, span.high))
                    * np.log(high / low))  # fmt: skip
    shown = shown.assign(x=shown.speedup * factor)
    labels = _present(shown, style)
    legend = {}
    for row in shown.set_index("label").loc[labels].itertuples():
        colour = style[row.Index].colour
        low_error, high_error = _speedup_xerr(row)
        ax.errorbar(row.x, row.shown, xerr=[[e * row.x / row.speedup for e in low_error],
                    [e * row.x / row.speedup for e in high_error]], color=colour, linewidth=1.2)  # fmt: skip
        marker = OFF_MARKER if row.off else style[row.Index].marker
        ax.scatter(row.x, row.shown, s=row.size, marker=marker, color=colour, alpha=0.75, edgecolors="white", zorder=3)
        name = _off_words(row.Index, row.error, row.judged) if row.off else row.Index
        legend[name] = _key(Style(colour, marker, ()), line=False)
    chosen = shown.set_index("label").loc[[label for label in front if label in set(shown.label)]]
    if len(chosen) > 1:
        chosen = chosen.sort_values("x")
        (legend["the verdict's choices"],) = ax.step(
            chosen.x, chosen.shown, where="post", color="black", linewidth=1.2, alpha=0.5, zorder=1
        )
    legend |= _error_axis(ax, span, budget, bool((points.error[judged] < ERROR_RESOLUTION).any()))
    ax.axvline(1.0, color="black", linewidth=1.2)
    ax.set_xlabel(f"speedup vs {baseline} (→ faster)")
    ax.text(1.0, 1.01, f"bubble area ~ {bubble}", transform=ax.transAxes, fontsize="small", color=GREY,
            ha="right", va="bottom")  # fmt: skip
    _frame(fig, title, subtitle, legend)
    fig.canvas.draw()  # the layout first: labels are placed in its pixels
    labelled = [label for label in front[1:] + front[:1] if label in set(chosen.index)]  # the exact one last
    _place_labels(
        ax,
        [(chosen.x[label], chosen.shown[label], label, style[label].colour) for label in labelled],
        [(r.x, r.shown) for r in shown.itertuples() if r.label not in set(chosen.index)],
    )
    return _save(fig, path)


@themed
def plot_layer_errors(rows: pd.DataFrame, title: str, subtitle: str, path: Path, style: dict[str, Style]) -> Path:
    """`attnbench model`: relative error by layer, per variant, a seaborn facet per swap: left every layer swapped
    (hidden states), right one layer swapped at a time (that layer's attention output), where measured."""
    exact = rows.groupby("label").rel_error.max() < ERROR_RESOLUTION  # exact everywhere: nothing to draw
    rows = rows[~rows.label.map(exact) & (rows.layer != "final")]
    names = {"all": "every layer swapped", "single": "one layer swapped"}
    data = rows.assign(
        layer=rows.layer.astype(int), rel_error=rows.rel_error.clip(lower=EXACT_FLOOR), panel=rows.swap.map(names)
    )
    labels = _present(data, style)
    grid = sns.relplot(
        data=data,
        kind="line",
        x="layer",
        y="rel_error",
        col="panel",
        col_order=[names[swap] for swap in ("all", "single") if swap in set(rows.swap)],
        **_by_label(style, labels),
        markersize=7,
        legend=False,
        height=PANEL_HEIGHT,
        aspect=FIGURE_WIDTH / 2 / PANEL_HEIGHT,
        facet_kws={"sharey": True, "despine": False},
    )
    grid.set_titles(col_template="{col_name}")
    grid.set_axis_labels("layer", "relative error vs exact")
    for ax in grid.axes.flat:
        _log_y(ax)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
    fig = grid.figure
    fig.set_size_inches(FIGURE_WIDTH, PANEL_HEIGHT)
    return _finish(fig, title, subtitle, path, {label: _key(style[label]) for label in labels})


@themed
def plot_loss_vs_speedup(finals: pd.DataFrame, title: str, subtitle: str, path: Path, style: dict[str, Style]) -> Path:
    """`attnbench model`: each variant's end-to-end forward speedup against its change in loss."""
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, PANEL_HEIGHT))
    labels = _present(finals, style)
    for row in finals.itertuples():
        ax.errorbar(row.speedup, row.loss_change, xerr=_speedup_xerr(row), color=style[row.label].colour, capsize=4,
                    linewidth=1.2)  # fmt: skip
    sns.scatterplot(
        data=finals,
        x="speedup",
        y="loss_change",
        **_by_label(style, labels, lines=False),
        s=70,
        legend=False,
        zorder=3,
        ax=ax,
    )
    ax.axhline(0.0, color="#999999", linestyle="--", linewidth=1.2)
    ax.axvline(1.0, color="black", linewidth=1.2)
    _speedup_x_axis(ax, finals)
    ax.set_xlabel("forward speedup vs exact (→ faster)")
    ax.set_ylabel("loss change (nats/token)")
    _frame(fig, title, subtitle, {label: _key(style[label], line=False) for label in labels})
    fig.canvas.draw()
    ranked = finals.sort_values(["loss_change", "speedup"], ascending=[False, True])  # from the top, left first
    _place_labels(ax, [(r.speedup, r.loss_change, r.label, style[r.label].colour) for r in ranked.itertuples()])
    return _save(fig, path)
