"""The plots of a generation grid, placed at what a method costs: accuracy (a line per method, its Wilson interval as
bars) and continuation quality, each in two panels per N, against the share of the exact cache a step reads and
against the share it holds (kvpress's figure, with its two panels). Quest holds every key and reads a share of them:
its points sit at its real read share on the left, and at the whole cache on the right. A method without a knob (an
RNN state, a sparse prefill) is one point; the exact model is the reference line, its interval a band. A figure far
off the scale (an untrained RNN's perplexity thousands of times the exact model's) is drawn at the panel's edge, so
the band where the methods differ stays readable. Every name and figure is in the legend, none drawn over a panel:
labels at line ends collide where lines end close together (the review found two edge labels printed over each
other). Drawn under the run report's theme, styles and legend (attnbench.report.plots)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from attnbench.report.generation_bytes import (
    EVICTION, EVICTION_QUANTIZED, EXACT, HEADWISE, OTHER, PAGES, QUANTIZED, RECURRENT, per_token_text,
)  # fmt: skip
from attnbench.report.generation_summary import interval_of, n_text
from attnbench.report.generation_verdict import accuracy_text
from attnbench.report.plots import FIGURE_WIDTH, GREY, PANEL_HEIGHT, Style, _finish, _key, styles, themed
from attnbench.report.text import share_text
from attnbench.stats import Interval

HEADROOM = 1.15  # the ratio axis ends this far above the swept methods' largest; a figure beyond is drawn at the edge
EDGE_ROOM = 1.05  # the ratio axis's frame this far above the edge where a figure off the scale sits; no tick that close
DODGE = 0.04  # points at one cost spread by this much of an octave (~3% a step), so bars at one cost don't hide
COSTS = (("read_share", "reads", "share a step reads"), ("cache_share", "holds", "share it holds"))
EXACT_BAND = "#dddddd"  # the exact model's interval behind the methods' lines
EXACT_LINE = "#999999"  # the exact model's dashed reference line, and its legend key
RATIO_STEPS = (1, 2, 2.5, 5, 10, 20)  # a narrow ratio axis steps by one of these × 10^k, the finest that fits
RATIO_LADDERS = ((1, 2, 5), (1, 3), (1,))  # mantissas per decade of a wide ratio axis, finest first
MAX_TICKS = 6  # a ratio axis labels at most this many values, so its labels never crowd
FAMILY_STYLES = {  # a family's colour and marker in the headline figure, the same in every report
    EXACT: Style("#000000", "*", ()), EVICTION: Style("#1f77b4", "o", ()), HEADWISE: Style("#ff7f0e", "s", ()),
    QUANTIZED: Style("#2ca02c", "D", ()), EVICTION_QUANTIZED: Style("#9467bd", "P", ()),
    PAGES: Style("#8c564b", "v", ()), RECURRENT: Style("#d62728", "^", ()), OTHER: Style("#7f7f7f", "X", ()),
}  # fmt: skip
PROTOCOL_DASHES = ((), (4.0, 2.0))  # the first protocol's lines solid, the second's dashed
METHOD_MARKERS = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "h", "p", "d", "H", "8")  # a family's methods' markers
LABEL_CHARS = 24  # a legend name's most characters: two columns of them fit under the panels
COINCIDENT = 0.01  # points whose bytes differ by less than this share are at one cost (dodged apart)
DODGE_SPAN = 0.4  # the most of an octave the points at one cost spread over (±15%), however many


def _cost_axis(ax: plt.Axes, ticks: list[float], points: list[float], label: str) -> None:
    """A share of the exact cache on a log2 axis, ticked at the grid's budgets and the whole cache."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(ticks))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: "all" if value == 1 else share_text(value)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(points + ticks) / 1.4, max(points + ticks) * 1.4)
    ax.set_xlabel(label)


def ratio_ticks(low: float, high: float) -> list[float]:
    """The most plain values, at most MAX_TICKS, between `low` and `high` for a log ratio axis: on a range under ×10
    (where a log axis is near linear) even steps of RATIO_STEPS (0.86–1.39: 0.9, 1, 1.1, 1.2, 1.3), on a wider one
    the finest of RATIO_LADDERS that fits (1–3,000: 1, 10, 100, 1,000). matplotlib's log ticks label only 0.9 and 1
    on the first and every minor tick on the second."""
    if high / low < 10:
        base = 10.0 ** math.floor(math.log10((high - low) / MAX_TICKS))
        for step in (base * m for m in RATIO_STEPS):
            ticks = [k * step for k in range(math.ceil(low / step), math.floor(high / step) + 1)]
            if len(ticks) <= MAX_TICKS:
                break
    else:
        decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
        for mantissas in RATIO_LADDERS:
            ticks = [m * 10.0**e for e in decades for m in mantissas if low <= m * 10.0**e <= high]
            if len(ticks) <= MAX_TICKS:
                break
        ticks = ticks[:: math.ceil(len(ticks) / MAX_TICKS)]
    return [float(f"{t:.10g}") for t in ticks if low <= t <= high]


def _ratio_y(ax: plt.Axes, low: float, high: float) -> None:
    """A log ratio y axis from `low` to the edge `high` (where a figure off the scale sits) and EDGE_ROOM above it,
    labelled at `ratio_ticks` only (no minor labels to crowd them), none within EDGE_ROOM of the edge (a tick there
    would read as the off-scale figure)."""
    ax.set_yscale("log")
    ax.set_ylim(low, high * EDGE_ROOM)
    ax.yaxis.set_major_locator(FixedLocator(ratio_ticks(low, high / EDGE_ROOM)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,g}"))
    ax.yaxis.set_minor_locator(NullLocator())


def _draw_method(ax: plt.Axes, rows: pd.DataFrame, x: pd.Series, value: str, top: float | None,
                 look: Style) -> list[float]:  # fmt: skip
    """One method's line of `value` (its budgets in order), its interval as bars for an accuracy; a figure above
    `top` a triangle at that edge, returned (the legend names it: a label at the edge would cover another's)."""
    y = rows[value] * (100 if value == "accuracy" else 1)
    off = [] if top is None else [float(figure) for figure in y[y > top]]
    if off:
        ax.plot(x[y > top], [top] * len(off), color=look.colour, marker="^", markersize=9, linestyle="none",
                clip_on=False)  # fmt: skip
        rows, x, y = rows[y <= top], x[y <= top], y[y <= top]
    ax.plot(x, y, color=look.colour, marker=look.marker, linestyle=look.linestyle if len(rows) > 1 else "none",
            markersize=7)  # fmt: skip
    if value == "accuracy" and len(rows):
        ax.errorbar(x, y, yerr=[y - 100 * rows.low, 100 * rows.high - y], fmt="none", ecolor=look.colour, alpha=0.6,
                    capsize=3)  # fmt: skip
    return off


def _exact_name(exact: dict[int, tuple[Interval, str]], band: bool) -> str:
    """The exact model's legend name: its figure ('exact model 93% [78–99]', one per N where there are several) and,
    with `band`, what the grey band is."""
    figures = [(n, words) for n, (_, words) in sorted(exact.items()) if words]
    name = "exact model"
    if len(figures) == 1:
        name += f" {figures[0][1]}"
    elif figures:
        name += ": " + ", ".join(f"{words} at {n_text(n)}" for n, words in figures)
    return name + (" (band: its interval)" if band else "")


def _method_name(method: str, off: dict[int, list[float]], several_n: bool) -> str:
    """A method's legend name, with its figures drawn as a triangle at the panel's top edge ('deltanet (2,950×: ▲ at
    the top edge)'; each with its N where the plot has `several_n`)."""
    figures = [(n, figure) for n, values in sorted(off.items()) for figure in values]
    if not figures:
        return method
    words = ", ".join(f"{figure:,.0f}×" + (f" at {n_text(n)}" if several_n else "") for n, figure in figures)
    return f"{method} ({words}: ▲ at the top edge)"


@themed
def _panels(data: pd.DataFrame, value: str, exact: dict[int, tuple[Interval, str]], ylabel: str, title: str,
            subtitle: str, path: Path, style: dict[str, Style]) -> Path:  # fmt: skip
    """Two panels per N, one under the other: `value` against the share a step reads | the share held, a line per
    method; the exact model's (estimate, its figure in words) a reference line, its interval a band; every name and
    figure in the legend."""
    percent = value == "accuracy"
    ns = sorted(set(data.seq_len))
    fig, axes = plt.subplots(len(ns), 2, figsize=(FIGURE_WIDTH, PANEL_HEIGHT * len(ns)), squeeze=False, sharey="row")
    methods = list(dict.fromkeys(data.method))
    shift = {m: 2 ** (DODGE * (i - (len(methods) - 1) / 2)) for i, m in enumerate(methods)}
    budgets = sorted(set(data.share.dropna()) | {1.0})
    off: dict[str, dict[int, list[float]]] = {m: {} for m in methods}  # figures drawn at the top edge
    for row, n in zip(axes, ns):
        panel = data[data.seq_len == n].sort_values("share", ascending=False, na_position="last")
        swept = panel[panel.share.notna()][value]
        top = None if percent else max(1.1, HEADROOM * float(swept.max() if len(swept) else 1.0))
        for ax, (column, short, label) in zip(row, COSTS):
            for method, rows in panel.groupby("method", sort=False):
                if figures := _draw_method(ax, rows, rows[column] * shift[method], value, top, style[method]):
                    off[method][n] = figures  # the same in both panels
            if n in exact:
                interval, _ = exact[n]
                scale = 100 if percent else 1
                if interval.low == interval.low and interval.high > interval.low:
                    ax.axhspan(scale * interval.low, scale * interval.high, color=EXACT_BAND, alpha=0.6, zorder=0)
                ax.axhline(scale * interval.estimate, color=EXACT_LINE, linestyle="--", linewidth=1.2)
            _cost_axis(ax, budgets, [x for x in panel[column] if x == x], label)
            ax.set_title(f"{'N = ' + format(n, ',') if n else 'own lengths'}: {short}", fontsize="medium")
        row[0].set_ylabel(ylabel)
        if percent:
            row[0].set_ylim(-3, 103)
        else:
            for ax in row:
                _ratio_y(ax, min(0.95, float(panel[value].min()) / HEADROOM), top)
    legend = {_method_name(method, off[method], len(ns) > 1): _key(style[method]) for method in methods}
    legend[_exact_name(exact, band=percent)] = Line2D([], [], color=EXACT_LINE, linestyle="--")
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
        exact = {r.seq_len: (interval_of(r), accuracy_text(interval_of(r)))
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
        path = _panels(data, "ppl_ratio", {n: (Interval(1.0, 1.0, 1.0), "") for n in set(forced.seq_len)},
                       "perplexity ÷ exact (↓)", "Continuation quality with each method",
                       "the next tokens of a real text after the compressed prompt, teacher-forced; geometric mean",
                       folder / "generation-continuation-vs-kept.png", style)  # fmt: skip
        made.append((path, "The continuation's perplexity against the exact model's on the same tokens, against the "
                           "share of the exact cache a step reads (left) and holds (right) (a figure off the scale is "
                           "a triangle at the top edge, its figure in the legend)." + quest))  # fmt: skip
    return made


def bytes_ticks(low: float, high: float) -> list[float]:
    """The powers of two bytes between `low` and `high`, at most MAX_TICKS (every second or third where there are
    more)."""
    powers = list(range(math.ceil(math.log2(low)), math.floor(math.log2(high)) + 1))
    return [2.0**p for p in powers[:: max(1, math.ceil(len(powers) / MAX_TICKS))]]


def _line_style(rows: pd.DataFrame, protocols: list[str], marker: str) -> Style:
    """A method's look: its family's colour, its marker among the family's, dashed for the second protocol."""
    look = FAMILY_STYLES.get(rows.family.iloc[0], FAMILY_STYLES[OTHER])
    return Style(look.colour, marker, PROTOCOL_DASHES[protocols.index(rows.protocol.iloc[0]) % 2])


def _markers(methods: pd.DataFrame) -> dict[str, str]:
    """Per method, a marker distinct within its family (the family's own first; cycling past METHOD_MARKERS)."""
    out: dict[str, str] = {}
    for family, at in methods.groupby("family", sort=False):
        own = FAMILY_STYLES.get(family, FAMILY_STYLES[OTHER]).marker
        ladder = [own, *(m for m in METHOD_MARKERS if m != own)]
        out |= {method: ladder[i % len(ladder)] for i, method in enumerate(dict.fromkeys(at.method))}
    return out


def _short(text: str) -> str:
    """A legend name cut to LABEL_CHARS (a long one would run past the figure's edge)."""
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def _dodged(panel: pd.DataFrame) -> pd.Series:
    """Each point's x: its bytes, points at one cost (within COINCIDENT) spread DODGE of an octave apart (at most
    DODGE_SPAN in all), multiplicatively, in the lines' order, so equal points and their bars do not overlap."""
    x = panel.held_per_token.astype(float)
    key = (x.map(math.log2) / math.log2(1 + COINCIDENT)).round()
    out = x.copy()
    for _, at in x.groupby(key, sort=False):
        step = min(DODGE, DODGE_SPAN / max(len(at) - 1, 1))
        out[at.index] = at * [2 ** (step * (i - (len(at) - 1) / 2)) for i in range(len(at))]
    return out


@themed
def _bytes_panels(lines: pd.DataFrame, title: str, subtitle: str, path: Path) -> Path:
    """A panel per N, one under the other: accuracy (its Wilson interval as bars) against the bytes held per token on
    a log2 axis, a line per method through its settings in order of bytes, coloured by family with a marker of its
    own, the exact model a star (its interval a band where it is one point); the legend under the panels lists each
    family and its methods."""
    ns, protocols = sorted(set(lines.seq_len)), sorted(set(lines.protocol))
    fig, axes = plt.subplots(len(ns), 1, figsize=(FIGURE_WIDTH, PANEL_HEIGHT * len(ns)), squeeze=False, sharex=True)
    others = lines[~lines.exact_method]
    marker = _markers(others)
    legend: dict[str, Line2D] = {}
    for family, at in others.groupby("family", sort=False):  # the lines' order: by family
        colour = FAMILY_STYLES.get(family, FAMILY_STYLES[OTHER]).colour
        legend[family] = Line2D([], [], color=colour, linewidth=6)
        legend |= {f"  {_short(m)}": _key(Style(colour, marker[m], ()), line=False) for m in dict.fromkeys(at.method)}
    for ax, n in zip(axes[:, 0], ns):
        panel = lines[lines.seq_len == n]
        x = _dodged(panel[~panel.exact_method])
        for _, rows in panel[~panel.exact_method].groupby("line", sort=False):
            _draw_method(ax, rows, x[rows.index], "accuracy", None,
                         _line_style(rows, protocols, marker[rows.method.iloc[0]]))  # fmt: skip
        exact = panel[panel.exact_method]
        for r in exact.itertuples():
            bars = [[100 * (r.accuracy - r.low)], [100 * (r.high - r.accuracy)]]
            ax.errorbar([r.held_per_token], [100 * r.accuracy], yerr=bars, fmt="*", color=FAMILY_STYLES[EXACT].colour,
                        markersize=14, capsize=3, zorder=3)  # fmt: skip
            ax.axhline(100 * r.accuracy, color=EXACT_LINE, linestyle="--", linewidth=1.2)
        if len(exact) == 1 and exact.high.iloc[0] > exact.low.iloc[0]:
            ax.axhspan(100 * exact.low.iloc[0], 100 * exact.high.iloc[0], color=EXACT_BAND, alpha=0.6, zorder=0)
        ax.set_title(f"{'N = ' + format(n, ',') if n else 'own lengths'}", fontsize="medium")
        ax.set_ylabel("needles answered, % (↑)")
        ax.set_ylim(-3, 103)
    low, high = float(lines.held_per_token.min()) / 1.4, float(lines.held_per_token.max()) * 1.4
    bottom = axes[-1, 0]
    bottom.set_xscale("log", base=2)
    bottom.xaxis.set_major_locator(FixedLocator(bytes_ticks(low, high)))
    bottom.xaxis.set_major_formatter(FuncFormatter(lambda value, _: per_token_text(value)))
    bottom.xaxis.set_minor_locator(NullLocator())
    bottom.set_xlim(low, high)
    bottom.set_xlabel("bytes held per token (every layer, log)")
    if len(protocols) > 1:
        legend |= {_short(p): Line2D([], [], color=GREY, linestyle=Style(GREY, "", PROTOCOL_DASHES[i % 2]).linestyle)
                   for i, p in enumerate(protocols)}  # fmt: skip
    exact = lines[lines.exact_method]
    words = "" if len(exact) != 1 else (f" {accuracy_text(interval_of(exact.iloc[0]))}, "
                                        f"{per_token_text(exact.held_per_token.iloc[0])} a token")  # fmt: skip
    legend[f"exact model (★){words}"] = Line2D([], [], color=FAMILY_STYLES[EXACT].colour, marker="*", markersize=10,
                                              linestyle="--")  # fmt: skip
    return _finish(fig, title, subtitle, path, legend)


def plot_accuracy_vs_bytes(lines: pd.DataFrame, tasks: list[str], folder: Path) -> list[tuple[Path, str]]:
    """The report's headline figure from `generation_bytes.bytes_lines` (written only when a method has bytes): accuracy
    over `tasks` (those within the model) against the bytes each setting holds per token, a line per method
    coloured by family."""
    if lines[~lines.exact_method].empty:
        return []
    path = _bytes_panels(lines, "What the model answers for the bytes it holds",
                         f"{', '.join(tasks)} (the tasks within the model); mean over samples, Wilson 95% interval; "
                         "every layer's states after the prompt ÷ the prompt's tokens",
                         folder / "generation-accuracy-vs-bytes.png")  # fmt: skip
    return [(path, "The headline: accuracy against the bytes a method's states hold per token of context after the "
                   "prompt (every layer, log scale), a line per method through its settings in order of bytes, "
                   "coloured by its family (the legend lists each family's methods by marker), a panel per N; the "
                   "exact model is the star, its accuracy the dashed line. Eviction, head-wise budgets, "
                   "quantization and recurrent states share this one axis: a recurrent state's fixed bytes are "
                   "divided by the context the same way, so it sits further left as N grows; page selection (Quest) "
                   "holds every key, at the exact model's bytes (what it reads is in the bytes table). Points at one "
                   "cost are spread a few percent apart so their bars stay visible.")]  # fmt: skip
