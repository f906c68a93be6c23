"""How the plots look and read: seaborn's theme sized for a phone, a colour per variant name in every plot, a memory
headline that crowns no figure the CPU tracker only half sees, and an HTML page that fits a 390 px screen.

Plots are drawn to SVG with their text kept as text, so font sizes and colours can be read from the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import matplotlib
import pandas as pd
import seaborn as sns
from attnbench.report.plots import FIGURE_WIDTH, THEME, plot_error, plot_speedup, plot_versus_n, styles, variant_colour
from attnbench.report.run_report import memory_title, write_report
from attnbench.runfolder.rows import CPU_METHOD, CUDA_METHOD, TENSOR_METHOD
from helpers import edit_rows, synthetic_run

MIB = 2**20
PHONE_PX = 368  # a plot's width on a 390 px screen: the page's 10 px side padding and the image's border taken off
SEABORN_DEFAULTS = {"#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"}  # seaborn's "deep" palette


def cells(labels: list[str], ns: tuple[int, ...] = (256, 1024)) -> pd.DataFrame:
    """ok cells of `labels` at each N: a time, a speedup against `full` with an interval, an error per input."""
    rows = []
    for i, label in enumerate(labels):
        for n in ns:
            for source in ("realistic", "gaussian"):
                speedup = (i + 1) * n / 1024
                rows.append(
                    {
                        "label": label,
                        "seq_len": n,
                        "input": source,
                        "status": "ok",
                        "family": "exact" if label == "full" else "approximate",
                        "time_median_s": 1e-6 * n * (i + 1),
                        "speedup": speedup,
                        "speedup_low": 0.9 * speedup,
                        "speedup_high": 1.1 * speedup,
                        "err_vs_uniform": 0.1 * (i + 1),
                    }
                )
    return pd.DataFrame(rows)


def svg(plot: Callable[..., Path], *args, **kwargs) -> str:
    """The SVG a plot function writes to `path`, its text kept as text."""
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        return plot(*args, **kwargs).read_text()


def font_sizes(text: str) -> list[float]:
    return [float(size) for size in re.findall(r"font-size: ([\d.]+)px", text)]


def colours(text: str) -> set[str]:
    """The stroke and fill colours used in an SVG."""
    return set(re.findall(r"(?:stroke|fill): (#[0-9a-f]{6})", text))


def test_plots_use_seaborns_theme_and_their_text_stays_readable_on_a_phone(tmp_path: Path) -> None:
    frame = cells(["full", "band(window=64)", "linear"])
    timed = frame[frame["input"] == "realistic"]
    samples = pd.DataFrame(  # five raw samples per cell, spread around its median
        [{"label": r.label, "seq_len": r.seq_len, "time_median_s": r.time_median_s * f} for r in timed.itertuples()
         for f in (0.8, 0.9, 1.0, 1.1, 1.5)]
    )  # fmt: skip
    keys = ("font.size", "xtick.labelsize", "axes.grid", "axes.edgecolor")
    settings = {key: matplotlib.rcParams[key] for key in keys}
    style = styles(list(frame.label))
    args = ("time_median_s", "time per call (ms)", "At N=1024, full is fastest", "cpu, float32")
    text = svg(plot_versus_n, timed, *args, tmp_path / "time.svg", style, scale=1e3, samples=samples)

    width_pt = float(re.search(r'<svg[^>]* width="([\d.]+)pt"', text).group(1))
    assert width_pt == FIGURE_WIDTH * 72
    sizes = font_sizes(text)
    assert min(sizes) * PHONE_PX / width_pt >= 11  # every text at least 11 px on the phone
    context = sns.plotting_context(THEME["context"], font_scale=THEME["font_scale"])
    assert sizes.count(round(context["xtick.labelsize"], 2)) >= 2  # tick labels at seaborn's sizes
    assert round(context["axes.labelsize"], 2) in sizes
    assert "#cccccc" in colours(text)  # whitegrid's grid lines
    assert text.count("fill-opacity: 0.15") == 3  # a quartile band per label, from the raw samples
    without_samples = svg(plot_versus_n, timed, *args, tmp_path / "medians.svg", style, scale=1e3)
    assert "fill-opacity: 0.15" not in without_samples
    assert {key: matplotlib.rcParams[key] for key in settings} == settings  # the theme is scoped to the plots

    facets = svg(plot_error, frame, "Most accurate", "cpu", tmp_path / "error.svg", style)
    assert "input: realistic" in facets and "input: gaussian" in facets  # seaborn's facet titles, a panel each
    assert len(re.findall(r'<g id="axes_\d+">', facets)) == 2


def test_a_variant_keeps_its_colour_and_seaborn_its_palette_out(tmp_path: Path) -> None:
    first = cells(["full", "band(window=64)", "band(window=256)", "my-plugin"])
    second = cells(["full", "lsh", "band(window=256)", "my-plugin"])
    times = svg(
        plot_versus_n, first, "time_median_s", "ms", "t", "s", tmp_path / "time.svg", styles(list(first.label))
    )
    speedups = svg(plot_speedup, second, "full", "t", "s", tmp_path / "speedup.svg", styles(list(second.label)))
    for text, names in ((times, ["full", "band", "my-plugin"]), (speedups, ["lsh", "band", "my-plugin"])):
        used = colours(text)
        assert {variant_colour(name) for name in names} <= used
        assert not used & SEABORN_DEFAULTS
    assert variant_colour("lsh") not in colours(times)


def memory_rows(method: str, peaks: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"label": label, "variant": label, "seq_len": n, "status": "ok", "peak_mem_bytes": mib * MIB * n / 1024,
             "mem_method": method}
            for label, mib in peaks.items()
            for n in (256, 1024)
        ]
    )  # fmt: skip


def test_the_memory_headline_names_the_verdicts_choice_and_a_lower_bound_as_one() -> None:
    """The title names the variant the verdict recommends (never the smallest one it may reject), and a baseline
    figure the CPU tracker only half sees (a fused kernel's scratch) as a lower bound."""
    from attnbench.report.headlines import Headline
    from attnbench.report.verdict import Choice

    peaks = {"full": 2, "linformer": 3, "linear": 1}  # linear the smallest: not the verdict's choice
    on_cpu = memory_rows(TENSOR_METHOD, peaks)  # a run of before the allocator's figure: the tracker's alone
    linformer = Choice("linformer", "low-rank", 2.0, 1.9, 2.1, 0.3, 3 * MIB, 1.5, "–")
    headline = Headline(1024, "realistic", "full", 0.5, linformer)
    title = memory_title(on_cpu, headline)
    assert "linear" not in title
    assert title == (
        "At N=1024, linformer (the verdict's choice) needs 3 MiB per call, at most 1.5× full's (full's CPU figure is "
        "a lower bound)"
    )
    assert memory_title(memory_rows(CUDA_METHOD, peaks), headline).endswith("needs 3 MiB per call, 1.5× full's")
    assert memory_title(memory_rows(CPU_METHOD, peaks), headline).endswith("needs 3 MiB per call, 1.5× full's")
    none = memory_title(on_cpu, Headline(1024, "realistic", "full", 0.5, None))
    assert none == "Peak memory per call by N: at N=1024 the verdict recommends no variant over full"


def test_the_html_report_reads_on_a_phone_and_names_a_lower_bound(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "run")
    edit_rows(  # on the CPU, and full's figure (its output alone) the smallest
        run,
        lambda rows: [
            {**r, "mem_method": TENSOR_METHOD if r["peak_mem_bytes"] else "",  # recorded before the allocator's
             "peak_mem_bytes": str(10 * int(r["seq_len"])) if r["label"] == "full" and r["peak_mem_bytes"] else
             r["peak_mem_bytes"]}
            for r in rows
        ],
    )  # fmt: skip
    write_report(run)
    assert "`full` shows a lower bound" in (run / "report.md").read_text()
    page = (run / "report.html").read_text()
    assert "<meta name='viewport' content='width=device-width, initial-scale=1'>" in page
    assert "@media (max-width:600px)" in page and "figure img{width:100%" in page
    images = page.count("data:image/png;base64,")
    assert images == 9 and page.count("<input type='checkbox'><img") == images  # a tap opens each at full size
    assert "input:checked+img{width:auto;max-width:none" in page
    assert page.count("<table>") == page.count("<div class='scroll'><table>")  # wide tables scroll, the page not
    assert "<caption>" not in page  # captions wrap to the screen, not to the table's width


def test_every_built_in_variant_has_its_own_colour() -> None:
    """A built-in added to the registry gets a colour of its own, never a plugin's."""
    from attnbench.registry import Registry
    from attnbench.report.plots import BUILT_IN_COLOURS, PLUGIN_COLOURS

    built_in = [e.name for e in Registry().entries.values() if e.target.startswith("attnbench.variants.")]
    assert set(built_in) <= set(BUILT_IN_COLOURS), set(built_in) - set(BUILT_IN_COLOURS)
    assert len(set(BUILT_IN_COLOURS.values())) == len(BUILT_IN_COLOURS)
    assert not set(BUILT_IN_COLOURS.values()) & set(PLUGIN_COLOURS)
