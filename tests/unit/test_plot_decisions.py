"""Plots that show the decision: a speed-error plot is titled with the verdict's choice, its error axis spans the
variants the verdict judges on error (the rest drawn at its edge and said so in the legend), only the verdict's
choices carry text labels, and markers that would coincide are set apart.

Figures are caught before they are saved (`_save` swapped), so the assertions read matplotlib's own objects.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from attnbench.report import plots
from attnbench.report.decision_plots import decision_points, decision_title, judged_on_error, not_judged_on_error
from attnbench.report.plot_layout import ERROR_CEILING, dodge, error_span, placed_errors
from attnbench.report.plots import plot_error, plot_pareto, plot_recall, styles, variant_colour
from attnbench.report.verdict import Choice, InputVerdict, judge
from matplotlib.colors import to_hex


def choice(label: str, family: str, speedup: float, error: float, low: float | None = None, **kwargs) -> Choice:
    """A timed choice: its speedup interval ±10% (or from `low`), 1 MB of memory, half the baseline's."""
    low = 0.9 * speedup if low is None else low
    return Choice(label, family, speedup, low, speedup + (speedup - low), error, 1e6, 0.5, "–",
                  time_s=1e-3 / speedup, **kwargs)  # fmt: skip


def full() -> Choice:
    """The baseline, new for each verdict (`judge` marks the choices it is given)."""
    return choice("full", "exact", 1.0, 0.0, low=1.0)

BAND = "band(sinks=4, window=256)"


@pytest.fixture
def figures(monkeypatch) -> list[plt.Figure]:
    """The figures the plot functions draw, kept open instead of saved."""
    kept: list[plt.Figure] = []

    def keep(fig: plt.Figure, path: Path) -> Path:
        kept.append(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    yield kept
    for fig in kept:
        plt.close(fig)


def legend_texts(fig: plt.Figure) -> list[str]:
    return [text.get_text() for text in fig.legends[0].get_texts()]


def points_in(ax: plt.Axes, colour: str) -> np.ndarray:
    """The (x, y) of every scatter point drawn in `colour`."""
    found = [
        c.get_offsets() for c in ax.collections
        if len(c.get_offsets()) and len(c.get_facecolor()) and to_hex(c.get_facecolor()[0]) == colour
    ]  # fmt: skip
    return np.vstack(found) if found else np.empty((0, 2))


# --- titles ----------------------------------------------------------------------------------------------------------


def test_the_title_names_the_verdicts_choice_or_says_none_in_one_short_line() -> None:
    use = judge(8192, [full(), choice(BAND, "band", 3.0, 0.3), choice("linformer", "low-rank", 5.0, 0.8)], "full")
    assert use.use == BAND and decision_title(use) == f"N=8192: {BAND}"
    over = judge(8192, [full(), choice("nystromformer", "low-rank", 4.0, 0.78)], "full")
    assert decision_title(over) == "N=8192: nothing within the error budget 0.5 beats full"
    slower = judge(256, [full(), choice("topk", "block-sparse", 0.5, 0.1)], "full")  # within the budget, slower
    assert decision_title(slower) == "N=256: nothing beats full"
    unclear = judge(8192, [full(), choice("band", "band", 1.5, 0.3, low=0.9)], "full")  # its interval reaches 1×
    assert [c.label for c in unclear.choices] == ["full", "band"] and unclear.use == ""
    assert decision_title(unclear) == "N=8192: none recommended"
    exact = judge(4096, [full(), choice("full-flash", "exact", 2.0, 0.0)], "full")
    assert decision_title(exact) == "N=4096: full-flash (exact)"


def test_the_pareto_plot_is_titled_with_the_choice_not_the_verdicts_sentence(tmp_path: Path, figures) -> None:
    answer = judge(8192, [full(), choice(BAND, "band", 3.0, 0.3), choice("linear", "linear", 6.0, 0.99)], "full")
    points = decision_points(answer)
    plot_pareto(points, [c.label for c in answer.choices], "full", decision_title(answer), "on realistic",
                tmp_path / "p.png", styles(list(points.label)), budget=0.5)  # fmt: skip
    (fig,) = figures
    title = fig.texts[0].get_text()
    assert title == f"N=8192: {BAND}" and "\n" not in title
    assert answer.sentence.startswith("Use") and answer.sentence not in " ".join(t.get_text() for t in fig.texts)


# --- the error axis --------------------------------------------------------------------------------------------------


def test_which_variants_are_judged_on_error_is_read_from_the_verdict() -> None:
    gla = choice("gla", "linear", 4.0, 300.0, approximates=False)
    answer = judge(4096, [full(), choice("band", "band", 3.0, 0.3), gla], "full")
    assert not judged_on_error(gla)  # the verdict left it out as a different operator from softmax
    assert dict(zip(decision_points(answer).label, decision_points(answer).judged)) == {
        "full": True, "band": True, "gla": False,
    }  # fmt: skip
    verdict = InputVerdict("cpu", "realistic", "full", "", "realistic", answers=[answer])
    assert not_judged_on_error([verdict]) == frozenset({"gla"})


def test_the_error_axis_spans_the_judged_errors_and_the_rest_sit_at_its_edge() -> None:
    span = error_span([0.0, 0.3, 0.6], budget=0.5)  # exact (0), two approximations
    assert (span.floor, span.low, span.high) == (0.01, 0.005, 2.0)  # a decade under 0.3; twice averaging V's 1
    assert error_span([0.3, 40.0]).high == ERROR_CEILING  # a judged error far beyond averaging V: the axis is capped
    assert error_span([0.3], floor=False).low == 0.15  # no exact floor drawn: from half the least error
    errors = pd.Series([0.0, 0.3, 300.0, 40.0])
    shown, off = placed_errors(errors, pd.Series([True, True, False, True]), error_span([0.0, 0.3, 40.0]))
    assert list(off) == [False, False, True, True]
    assert shown[0] == 0.01 and shown[1] == 0.3  # float rounding on the floor, the rest where they are
    assert shown[2] == shown[3] < ERROR_CEILING  # not judged, or beyond the axis: at its top edge, inside it


def test_a_different_operators_error_does_not_stretch_the_pareto_plots_axis(tmp_path: Path, figures) -> None:
    gla = choice("gla", "linear", 4.0, 300.0, approximates=False)
    answer = judge(4096, [full(), choice("band", "band", 3.0, 0.3), choice("lsh", "lsh", 0.5, 0.9), gla], "full")
    points = decision_points(answer)
    plot_pareto(points, [c.label for c in answer.choices], "full", decision_title(answer), "",
                tmp_path / "p.png", styles(list(points.label)), budget=0.5)  # fmt: skip
    (fig,) = figures
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    assert (low, high) == pytest.approx((0.005, 2.0))  # judged: 0.3 and 0.9, the budget and averaging V
    (x, y), = points_in(ax, variant_colour("gla"))  # fmt: skip
    assert x == pytest.approx(4.0) and high / 1.5 < y < high  # at the top edge, inside the axes
    assert "gla: not judged on error (300)" in legend_texts(fig)
    entry = legend_texts(fig).index("gla: not judged on error (300)")
    assert fig.legends[0].legend_handles[entry].get_marker() == "^"  # an arrow-like triangle, not its own marker
    assert {"band", "lsh", "full"} <= set(legend_texts(fig))  # the judged keep their plain entries


def test_the_error_plot_spans_the_judged_errors_and_marks_the_others_off_the_axis(tmp_path: Path, figures) -> None:
    rows = [
        {"label": label, "seq_len": n, "input": "realistic", "status": "ok", "family": family, "err_vs_uniform": error}
        for label, family, errors in (("band", "band", (0.2, 0.4)), ("gla", "linear", (120.0, 300.0)))
        for n, error in zip((1024, 4096), errors)
    ]
    cells = pd.DataFrame(rows)
    style = styles(list(cells.label))
    plot_error(cells, "Error", "", tmp_path / "e.png", style, budget=0.5, unjudged=frozenset({"gla"}))
    plot_error(cells, "Error", "", tmp_path / "judged.png", style, budget=0.5)  # gla judged: beyond the ceiling
    unjudged, judged = figures
    assert unjudged.axes[0].get_ylim() == pytest.approx((0.1, 2.0))  # band's errors, the budget and averaging V
    assert len(points_in(unjudged.axes[0], variant_colour("gla"))) == 2  # a triangle per N at the edge
    assert "gla: not judged on error (300)" in legend_texts(unjudged)
    assert judged.axes[0].get_ylim()[1] == ERROR_CEILING
    assert "gla: error 300, off the axis" in legend_texts(judged)


# --- direct labels ---------------------------------------------------------------------------------------------------


def test_only_the_verdicts_choices_are_labelled_and_no_label_overlaps(tmp_path: Path, figures) -> None:
    others = [choice(f"lsh(buckets={b})", "lsh", 2.0 + 0.1 * b, 0.7 + 0.01 * b) for b in range(6)]  # over budget
    answer = judge(4096, [full(), choice(BAND, "band", 3.0, 0.3), choice("topk", "topk", 1.6, 0.1), *others], "full")
    front = [c.label for c in answer.choices]
    assert front == ["full", BAND, "topk"]
    points = decision_points(answer)
    plot_pareto(points, front, "full", decision_title(answer), "", tmp_path / "p.png", styles(list(points.label)),
                budget=0.5)  # fmt: skip
    (fig,) = figures
    ax = fig.axes[0]
    labels = [t for t in ax.texts if not t.get_text().startswith("bubble area")]
    assert sorted(t.get_text().replace(",\n", ", ") for t in labels) == sorted(front)  # the rest: the legend
    assert {c.label for c in others} <= set(legend_texts(fig))
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


# --- dodging ---------------------------------------------------------------------------------------------------------


def test_markers_that_coincide_are_set_apart_and_lone_ones_stay() -> None:
    offsets = dodge([0.5, 0.5, 0.5, 0.9, 0.2], [0.0, 0.01, 0.0, 0.0, 0.6], step=0.02)
    assert list(offsets[:3]) == pytest.approx([-0.02, 0.0, 0.02])  # one cluster, spread around its place in order
    assert list(offsets[3:]) == [0.0, 0.0]  # apart already: not moved


def test_equal_recall_at_one_n_is_dodged_in_the_needle_plot(tmp_path: Path, figures) -> None:
    recall = {"full": (1.0, 1.0), "band": (0.0, 0.0), "lsh": (0.0, 0.0), "topk": (0.5, 0.0)}
    cells = pd.DataFrame(
        [{"label": label, "seq_len": n, "input": "needles(pairs=16)", "status": "ok", "needle_accuracy": share}
         for label, shares in recall.items() for n, share in zip((256, 1024), shares)]
    )  # fmt: skip
    plot_recall(cells, "Recall", "", tmp_path / "r.png", styles(list(recall)))
    (fig,) = figures
    x = {label: [] for label in recall}
    for line in fig.axes[0].lines:
        for label in recall:
            if to_hex(line.get_color()) == variant_colour(label) and len(line.get_xdata()) == 2:
                x[label] = list(line.get_xdata())
    assert x["full"] == [256, 1024] and x["topk"][0] == 256  # alone at their recall: where they are
    assert x["band"][0] != x["lsh"][0]  # both retrieve none at 256: side by side
    assert len({x["band"][1], x["lsh"][1], x["topk"][1]}) == 3  # three at 0% at 1024
    assert all(abs(np.log2(v[i] / n)) < 0.2 for v in x.values() for i, n in enumerate((256, 1024)))  # a small shift
