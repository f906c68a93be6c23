"""The report of a run: report.md, a self-contained report.html (images embedded) and plots/*.png.

The first screen answers the question (the verdict: the accuracy budget it holds to, then per setting, input and N
the answer in a sentence, the fastest exact variant and the speed-error Pareto set within the budget); then how to
reproduce the run, its machine and noise; then the plots; then the detail tables per comparison group (time,
speedup, memory, state, error, the input's statistics, dropped mass, efficiency, slopes, crossovers, failures);
then how the numbers were taken, the machine and the resolved config. Every table has one row order.
"""

from __future__ import annotations

import shlex
import zlib
from pathlib import Path
from typing import Callable

import pandas as pd

from attnbench.atomic import write_text_atomic
from attnbench.inputs.catalogue import LOCALITY_WINDOW
from attnbench.plan.config import overrides_text
from attnbench.report.analysis import compile_sentence, crossover_table, efficiency, raised_peaks, scaling_table
from attnbench.report.decision_plots import decision_points, decision_title, not_judged_on_error
from attnbench.report.document import Block, _slug, render_html, render_markdown
from attnbench.report.headlines import (
    error_title,
    recall_title,
    headline_of,
    memory_lower_bound,
    memory_title,
    roofline_title,
    speedup_title,
    time_title,
)
from attnbench.report.modes import mib_text, mode_of_rows, ms_text, read_rate_text
from attnbench.report.plots import (
    plot_error,
    plot_pareto,
    plot_recall,
    plot_roofline,
    plot_speedup,
    plot_versus_n,
    styles,
)
from attnbench.report.summary import interval_words, noise_line, reach_sentence
from attnbench.report.text import (
    GROUP_COLUMNS,
    MACHINE,
    baseline_of,
    format_number,
    format_percent,
    interval_label,
    interval_text,
    label_order,
    machine_words,
    ratio_text,
    speedup_cell,
    with_machine,
)
from attnbench.report.evidence import Unfinished, evidence_markdown, opening_markdown, unfinished
from attnbench.report.threads import threads_sentence
from attnbench.report.tuning import tuning_plot, tuning_sentences, tuning_table
from attnbench.report.verdict import (
    SETTING_COLUMNS,
    InputVerdict,
    block_title,
    budget_line,
    crossover_legend,
    fastest_labels,
    left_out_text,
    setting_key,
    setting_words,
    verdict_intro,
    verdict_rows,
)
from attnbench.report.view import RunView
from attnbench.runfolder.meta import RunMeta

MIB = 2**20


FILE_PART_CHARS = 48  # a plot file name piece made from free text (an input label holds a captured file's path)


def _file_part(text: str) -> str:
    """`text` as a piece of a file name: its slug, cut to FILE_PART_CHARS with a hash of the whole when longer
    (two long labels never share a file; the name stays far under the file system's 255 bytes)."""
    slug = _slug(text)
    if len(slug) <= FILE_PART_CHARS:
        return slug
    return f"{slug[:FILE_PART_CHARS].rstrip('-')}-{zlib.crc32(text.encode()):08x}"


def lowest(score: Callable[[pd.Series], float]) -> Callable[[pd.DataFrame], list[str]]:
    """Best of a column's rows: the label of the lowest score (memory, error)."""

    def best(at_n: pd.DataFrame) -> list[str]:
        scores = at_n.apply(score, axis=1).dropna()
        return [at_n.loc[scores.idxmin()].label] if len(scores) else []

    return best


def highest(score: Callable[[pd.Series], float]) -> Callable[[pd.DataFrame], list[str]]:
    """The labels with the highest `score` at one N, ties all (recall: several variants retrieve everything)."""

    def best(at_n: pd.DataFrame) -> list[str]:
        scores = at_n.apply(score, axis=1).dropna()
        return list(at_n.loc[scores[scores == scores.max()].index].label) if len(scores) else []

    return best


def _pivot(
    cells: pd.DataFrame,
    formatter: Callable[[pd.Series], str],
    best_of: Callable[[pd.DataFrame], list[str]] | None = None,
) -> tuple[list[str], list[list[str]], set[tuple[int, int]]]:
    """label × N table of formatter(row) over ok cells (failed cells read as their status), rows in
    `label_order`; with `best_of` (ok rows at one N -> the best labels), the best cells of each N are marked."""
    ns = sorted(cells.seq_len.unique())
    labels = label_order(cells)
    rows, best = [], set()
    for column, n in enumerate(ns, start=1):
        at_n = cells[(cells.seq_len == n) & (cells.status == "ok")]
        if best_of is None or at_n.empty:
            continue
        best |= {(labels.index(label), column) for label in best_of(at_n)}
    for label in labels:
        row = [label]
        for n in ns:
            match = cells[(cells.label == label) & (cells.seq_len == n)]
            if match.empty:
                row.append("")
            elif match.iloc[0].status != "ok":
                row.append(match.iloc[0].status)
            else:
                row.append(formatter(match.iloc[0]))
        rows.append(row)
    return ["variant"] + [f"N={n}" for n in ns], rows, best


def _table(caption: str, table: tuple[list[str], list[list[str]], set[tuple[int, int]]]) -> Block:
    headers, rows, best = table
    return Block("table", headers=headers, rows=rows, best=best, caption=caption)


def _nan(value: object) -> float:
    return float(value) if value is not None and pd.notna(value) else float("nan")


def detail_blocks(
    cells: pd.DataFrame, heading: str, peaks: dict, samples: dict[str, list[float]] | None = None
) -> list[Block]:
    """The detail tables of one comparison group (one setting and input), N as columns; the fastest per N by the
    verdict's rule (`samples`: per-round seconds, so two variants are compared in their own rounds). A decode group's
    times are per generated token, and its cache and prefill have tables of their own."""
    blocks = [Block("heading", heading, level=3)]
    baseline = baseline_of(cells)
    mode = mode_of_rows(cells)
    timed = cells.timed.fillna(True).astype(bool).any()
    base = cells[(cells.label == baseline) & (cells.status == "ok")].set_index("seq_len")

    def to_base(row: pd.Series, column: str) -> float:
        """This cell's `column` over the baseline's at the same N (NaN without a baseline)."""
        if row.seq_len not in base.index or not base.loc[row.seq_len, column]:
            return float("nan")
        return row[column] / base.loc[row.seq_len, column]

    compiled = cells[(cells.status == "ok") & cells.compiled_speedup.notna()] if "compiled" in cells else cells[:0]
    if len(compiled) and mode.decode:  # in decode a compiled cell is the fused step: nothing compiled, no graphs
        blocks.append(
            _table(
                "Fused against eager: in decode a *compiled* cell is the step's fused form (one call of attnbench's C "
                "kernels, `attnbench.kernels`), not torch.compile; the eager step's time over the fused step's, per "
                "round (timed in turns), with its interval.",
                _pivot(compiled, lambda r: interval_text(r.compiled_speedup, r.compiled_speedup_low,
                                                         r.compiled_speedup_high)),  # fmt: skip
            )
        )
    elif len(compiled):
        blocks.append(
            _table(
                "Compiled against eager: the eager call's time over the compiled call's, per round (timed in turns), "
                "with its interval; then the first call's extra seconds (compilation) and the graphs dynamo cut the "
                "call into.",
                _pivot(
                    compiled,
                    lambda r: f"{interval_text(r.compiled_speedup, r.compiled_speedup_low, r.compiled_speedup_high)}, "
                    f"{r.compile_s:.1f} s, {r.compiled_graphs:.0f} graph(s)",
                ),
            )
        )
    if timed:
        time_words = (
            "Time per generated token (one step at a context of N to N + decode_steps)"
            if mode.decode
            else "Time per call"
        )
        blocks.append(
            _table(
                f"{time_words}, ms: median ± IQR over the interleaved rounds (fastest per N in bold: every variant "
                "no other is faster than beyond noise, the verdict's rule).",
                _pivot(
                    cells,
                    lambda r: (
                        f"{ms_text(r.time_median_s)} ± {ms_text(r.time_iqr_s)}"  # a step: tens of µs to seconds
                        if mode.decode
                        else f"{r.time_median_s * 1e3:.2f} ± {r.time_iqr_s * 1e3:.2f}"
                    ),
                    lambda at_n: fastest_labels(at_n, samples),
                ),
            )
        )
        interval = interval_label(cells.speedup_coverage[cells.speedup.notna()])
        blocks.append(
            _table(
                f"Speedup{' per generated token' if mode.decode else ''} against `{baseline}`: the median over "
                f"rounds of its time / this time in the same round, with {interval_words(cells)}. Intervals: "
                f"{interval}.",
                _pivot(cells, lambda r: speedup_cell(r, interval),
                       lambda at_n: fastest_labels(at_n[at_n.speedup.notna()], samples)),
            )
        )
        if mode.decode:
            blocks += _decode_blocks(cells, baseline, to_base) + _read_blocks(cells, peaks)
        peak_words = (
            "Peak memory of one step beyond its state, MiB (ratio to `{baseline}`): the scratch a step allocates; "
            "the cache it keeps is in the table above"
            if mode.decode
            else "Peak memory of one call beyond the inputs, MiB (ratio to `{baseline}`); state a variant keeps "
            "between calls is not in it"
        )
        blocks.append(
            _table(
                peak_words.format(baseline=baseline) + " (smallest per N in bold).",
                _pivot(
                    cells,
                    lambda r: (
                        f"{mib_text(r.peak_mem_bytes)} ({ratio_text(to_base(r, 'peak_mem_bytes'))})"
                        if mode.decode  # a step's scratch is KiB: three digits, not one decimal of MiB
                        else f"{format_number(r.peak_mem_bytes / MIB, '.1f')} "
                        f"({ratio_text(to_base(r, 'peak_mem_bytes'))})"
                    ),
                    lowest(lambda r: _nan(r.peak_mem_bytes)),
                ),
            )
        )
        if not mode.decode:  # a decode variant's state is its cache, above
            blocks.append(
                _table(
                    "State kept between calls (cached patterns, projections, rotations), MiB: built by the first call.",
                    _pivot(cells, lambda r: format_number(r.state_mem_bytes / MIB, ".2f")),
                )
            )
    else:
        blocks.append(Block("text", "Error only: time and memory of this setting were measured on its first input."))
    approximate = (cells.family != "exact") & cells.approximates_softmax  # a different operator is never "most accurate"
    blocks.append(
        _table(
            "Error against exact softmax attention (float64): vs-uniform / relative Frobenius / mean row cosine. "
            "vs-uniform is ‖O−O*‖/‖U−O*‖: 0 exact, 1 no better than averaging V (most accurate approximation "
            "per N in bold; a different operator from softmax, such as gated linear attention, is shown, not ranked).",
            _pivot(
                cells,
                lambda r: " / ".join(
                    format_number(value, spec)
                    for value, spec in ((r.err_vs_uniform, ".3g"), (r.err_rel_fro, ".2e"), (r.err_row_cosine, ".3f"))
                ),
                lowest(lambda r: _nan(r.err_vs_uniform) if approximate[r.name] else float("nan")),
            ),
        )
    )
    stats = cells.dropna(subset=["input_entropy"]).groupby("seq_len").first()
    if len(stats):
        rows = [
            [
                str(n),
                f"{r.input_entropy:.3f}",
                f"{r.input_band_mass:.3f}",
                format_number(_nan(r.input_sink_mass), ".3f"),
                format_number(_nan(r.input_head_spread), ".3f"),
            ]
            for n, r in stats.iterrows()
        ]
        blocks.append(
            Block(
                "table",
                headers=[
                    "N",
                    "attention entropy",
                    f"mass within ±{LOCALITY_WINDOW}",
                    "mass on first token",
                    "head spread",
                ],
                rows=rows,
                caption="The input, seen through exact attention: normalized entropy (mean over rows of H(p) / "
                f"log(visible keys); 1 uniform, 0 one key), the share of mass within |i − j| ≤ {LOCALITY_WINDOW}, "
                "the share on the first token, and the spread of entropy across heads. Read the errors against these.",
            )
        )
    needles = cells[cells.needle_accuracy.notna() | (cells.status != "ok")] if cells.needle_accuracy.notna().any() else []
    if len(needles):
        blocks.append(
            _table(
                f"Needle recall: the share of the {needles.needle_probes.max():.0f} planted key → value needles (each "
                "head's query of each pair) whose output is nearest, by cosine, to its planted value among the visible "
                "values (exact attention: 100% by construction; chance ≈ 1 / N). Best per N in bold.",
                _pivot(needles, lambda r: format_percent(r.needle_accuracy), highest(lambda r: _nan(r.needle_accuracy))),
            )
        )
    exact_patterns = cells[cells.dropped_mass.notna()]
    if len(exact_patterns):
        blocks.append(
            _table(
                "Exact-pattern variants: the exact attention mass outside their support, the whole source of their "
                "error.",
                _pivot(exact_patterns, lambda r: format_number(r.dropped_mass, ".3g")),
            )
        )
    if timed and not mode.decode:  # a decode step counts bytes, not FLOPs: the roofline table says it
        with_efficiency = cells.assign(efficiency=efficiency(cells, peaks))
        blocks.append(
            _table(
                "Achieved FLOP/s from each variant's cost model, as a share of this run's dense-matmul peak (best "
                "of bursts at the run's threads at its start, between groups and at its end, raised to the highest "
                "rate a cell reached where that was higher: see 'measured peaks'; a sparse variant counts only the "
                "work its algorithm does).",
                _pivot(with_efficiency, lambda r: format_percent(r.efficiency)),
            )
        )
    if timed and "of_roofline" in cells:  # the view adds it (RunView.read), at the run's peaks
        blocks.append(
            _table(
                f"Share of the roofline: {mode.roofline_words}, from each variant's cost model and this run's "
                "measured peaks, over its median time (100% is as fast as the counted work allows here; far below, "
                "a speedup measures the implementation more than the method).",
                _pivot(cells, lambda r: format_percent(r.of_roofline)),
            )
        )
    if timed:
        blocks += _scaling_blocks(cells, baseline)
    failed = cells[cells.status != "ok"]
    if len(failed):
        order = {label: index for index, label in enumerate(label_order(cells))}
        failed = failed.sort_values(["label", "seq_len"], key=lambda c: c.map(order) if c.name == "label" else c)
        rows = [[r.label, str(r.seq_len), r.status, r.reason] for r in failed.itertuples()]
        blocks.append(
            Block(
                "table",
                headers=["variant", "N", "status", "reason"],
                rows=rows,
                caption="Cells that did not run to the end, with the reason.",
            )
        )
    return blocks


def _decode_blocks(cells: pd.DataFrame, baseline: str, to_base: Callable[[pd.Series, str], float]) -> list[Block]:
    """A decode group's cache (what each variant keeps at context N) and prefill (the prompt's one call) by N."""
    return [
        _table(
            f"Cache kept at context N, MiB (ratio to `{baseline}`): what a variant holds between steps (KV cache, "
            "window, RNN state, compressed cache and its metadata); smallest per N in bold.",
            _pivot(
                cells,
                lambda r: f"{mib_text(r.cache_bytes)} ({ratio_text(to_base(r, 'cache_bytes'))})",
                lowest(lambda r: _nan(r.cache_bytes)),
            ),
        ),
        _table(
            f"Prefill, ms (ratio to `{baseline}`): the prompt's one call, which builds the cache; timed once, so "
            "noisier than the step times, and apart from the verdict's per-token speedup.",
            _pivot(
                cells,
                lambda r: f"{ms_text(r.prefill_s)} ({ratio_text(to_base(r, 'prefill_s'))})",
                lowest(lambda r: _nan(r.prefill_s)),
            ),
        ),
    ] + _constant_state_blocks(cells, baseline)


def _read_blocks(cells: pd.DataFrame, peaks: dict) -> list[Block]:
    """A decode group's achieved read bandwidth by N (`analysis.read_bandwidth`, added by the view) and its share of
    the machine's measured read bandwidth ([] where the rows have none)."""
    if "step_read_bytes_per_s" not in cells or not cells.step_read_bytes_per_s.notna().any():
        return []
    first = cells.iloc[0]
    peak = peaks.get(f"{first['device']}/{first['dtype']}", {})
    stream = peak.get("read_bytes_per_s")
    measured = f"{stream / 1e9:.1f} GB/s, one read stream" if stream else "its copy bandwidth: no read stream measured"
    return [
        _table(
            f"Read bandwidth a step achieved, GB/s (share of this machine's measured read bandwidth, {measured}): what a "
            "step reads (its part of the cache, the token's q, k and v) over its median time. Far below 100%, its time "
            "goes to something other than reading its state (dispatch, compute, waiting); above it, it read from cache.",
            _pivot(cells, lambda r: read_rate_text(r.step_read_bytes_per_s, r.read_share),
                   highest(lambda r: _nan(r.read_share))),  # fmt: skip
        )
    ]


CONSTANT = 1.01  # a cache within 1% over every N is a constant state (an RNN's, a window's ring)


def _constant_state_blocks(cells: pd.DataFrame, baseline: str) -> list[Block]:
    """For each variant whose cache is the same at every N of the group (an RNN state, a window's ring): the N from
    which it keeps less than the baseline's KV cache, from that cache's bytes per token at the largest N."""
    ok = cells[(cells.status == "ok") & cells.cache_bytes.notna() & (cells.cache_bytes > 0)]
    base = ok[ok.label == baseline]
    if base.empty:
        return []
    largest = base.loc[base.seq_len.idxmax()]
    per_token = largest.cache_bytes / largest.seq_len  # (the cache's room for the decode steps included)
    rows = []
    for label, own in ok[ok.label != baseline].groupby("label", sort=False):
        if own.seq_len.nunique() < 2 or own.cache_bytes.max() > own.cache_bytes.min() * CONSTANT:
            continue
        state = float(own.cache_bytes.max())
        rows.append([label, f"{state / 1024:,.4g}", f"≈ {max(1, round(state / per_token)):,}"])
    if not rows:
        return []
    return [
        Block(
            "table",
            headers=["variant", "state, KiB (the same at every N)", f"smaller than {baseline}'s KV cache from N"],
            rows=rows,
            caption=(
                f"Constant states against a growing KV cache: {baseline}'s cache keeps "
                f"{per_token / 1024:.3g} KiB per token (at N={int(largest.seq_len):,}); a variant whose cache is the "
                "same at every N here keeps less than it from the N given (state / bytes per token)."
            ),
        )
    ]


def _scaling_blocks(cells: pd.DataFrame, baseline: str) -> list[Block]:
    order = label_order(cells)
    blocks = []
    memory = "cache" if mode_of_rows(cells).decode else "memory"  # the column its mode weighs (analysis)
    scaling = scaling_table(cells)
    if len(scaling):
        scaling = scaling.set_index("label").loc[[label for label in order if label in set(scaling.label)]]
        rows = [
            [
                label,
                r.n_range,
                format_number(r.time_slope, ".2f") + (" (noisy cells)" if r.noisy else ""),
                format_number(r.memory_slope, ".2f"),
            ]
            for label, r in scaling.iterrows()
        ]
        blocks.append(
            Block(
                "table",
                headers=["variant", "N range fitted", "time slope", f"{memory} slope"],
                rows=rows,
                caption="Fitted log-log slopes over the ok cells (1 = linear in N, 2 = quadratic).",
            )
        )
    crossings = crossover_table(cells, baseline)
    if len(crossings):
        crossings = crossings.set_index("label").loc[[label for label in order if label in set(crossings.label)]]
        rows = [[label, r.faster_from, r.smaller_from] for label, r in crossings.iterrows()]
        blocks.append(
            Block(
                "table",
                headers=["variant", "faster from", "smaller from" + (" (cache)" if memory == "cache" else "")],
                rows=rows,
                caption=f"Crossover against `{baseline}`, interpolated in log-log between swept points.",
            )
        )
    return blocks


def _timing_samples(rows: pd.DataFrame, samples: dict[str, list[float]]) -> pd.DataFrame:
    """One row per raw timing sample of `rows` (label, seq_len, time_median_s: that sample's seconds); a cell
    without samples (a folder written before samples.csv) stands for itself with its median."""
    return pd.DataFrame(
        [
            {"label": r.label, "seq_len": r.seq_len, "time_median_s": seconds}
            for r in rows.itertuples()
            for seconds in samples.get(r.cell_key) or [r.time_median_s]
        ]
    )


def plot_blocks(
    cells: pd.DataFrame,
    subtitle: str,
    plots_dir: Path,
    style: dict,
    baseline: str,
    judged: list[InputVerdict],
    samples: dict[str, list[float]] | None = None,
) -> list[Block]:
    """The plots of one setting (every input): speedup, Pareto per input and N (`judged`: the run's verdicts of
    this setting), time (median and quartiles of `samples`, cell key -> seconds per round), memory, error. Their
    titles name the verdict's choice at the largest N, or no variant (`attnbench.report.headlines`). A decode setting
    draws the same plots per generated token against the context N, its cache in place of the peak memory."""
    mode = mode_of_rows(cells)
    timed = cells[(cells.status == "ok") & cells.time_median_s.notna()]
    first = cells.iloc[0]  # a readable start, and a hash of every setting column: two settings never share a file
    setting = "-".join(f"{c}{first[c]}" for c in SETTING_COLUMNS)
    readable = f"{first['device']}-{first['dtype']}-{first['mode']}-causal{first['causal']}"
    slug = f"{_slug(readable)}-{zlib.crc32(setting.encode()):08x}"
    images: list[tuple[Path, str]] = []
    first = timed[timed["input"] == timed["input"].iloc[0]] if len(timed) else timed  # one input's times
    headline = headline_of(judged, str(first["input"].iloc[0])) if len(first) else None
    budget = judged[0].budget.max_error if judged else None
    if timed.speedup.notna().any():
        title = speedup_title(headline, baseline, mode)
        path = plot_speedup(
            timed, baseline, title, subtitle, plots_dir / f"{slug}-speedup.png", style, xlabel=mode.n_axis
        )
        per = " per generated token" if mode.decode else ""
        interval = interval_label(timed.speedup_coverage[timed.speedup.notna()])
        images.append((path, f"Speedup{per} against `{baseline}` by N, measured in turns; bars are its intervals "
                             f"({interval})."))  # fmt: skip
    for verdict in judged:  # one rule: the plot shows the verdict's own choices and its sentence
        for answer in verdict.answers:
            points = decision_points(answer)  # a point needs both axes: no error is measured with `error = false`
            if points.empty:
                continue
            front = [c.label for c in answer.choices]
            interval = interval_label(pd.Series([c.coverage for c in answer.choices + answer.left_out]))
            path = plot_pareto(
                points,
                front,
                mode.against(baseline),
                decision_title(answer),  # the choice; the verdict's sentence is the caption's
                f"on {verdict.input}; {subtitle}",
                plots_dir / f"{slug}-{_file_part(verdict.input)}-pareto-N{answer.n}.png",
                style,
                budget=verdict.budget.max_error,
                bubble="cache" if mode.decode else "peak memory",
            )
            images.append(
                (
                    path,
                    f"**N={answer.n} on `{verdict.input}`:** {answer.sentence} Speed"
                    f"{' per generated token' if mode.decode else ''} against error: up and to the left is worse; "
                    f"bubble area is {'the cache kept at N' if mode.decode else 'peak memory'}; the verdict's choices "
                    f"are named on the plot and joined by the step line; bars are the speedup's interval "
                    f"({interval}); above "
                    f"the dash-dotted line a variant is over the error budget ({verdict.budget.max_error:g})"
                    + ("" if points.judged.all() else "; a triangle at the top is not judged on error, off the axis")
                    + ".",
                )
            )
    if len(first):
        path = plot_versus_n(
            first,
            "time_median_s",
            f"time {mode.per} (ms)",
            time_title(headline, mode),
            subtitle,
            plots_dir / f"{slug}-time.png",
            style,
            scale=1e3,
            samples=_timing_samples(first, samples or {}),
            xlabel=mode.n_axis,
        )
        spread = "; the band spans the quartiles of the timing samples" if samples else ""
        images.append((path, f"Time {mode.per} by N (log-log): the median{spread}."))
    with_roofline = first[first.of_roofline > 0]
    if len(with_roofline):
        path = plot_roofline(
            with_roofline,
            roofline_title(headline, mode),
            subtitle,
            plots_dir / f"{slug}-roofline.png",
            style,
            xlabel=mode.n_axis,
        )
        images.append(
            (
                path,
                f"Time over roofline by N: each median time over its roofline, {mode.roofline_words}, of the work "
                f"{'one step' if mode.decode else 'its cost model'} counts (1× is the limit; far above, the "
                "implementation sets the speed).",
            )
        )
    with_cache = first[first.cache_bytes.notna()] if mode.decode else first[:0]
    if len(with_cache):
        path = plot_versus_n(
            with_cache,
            "cache_bytes",
            "cache (MiB)",
            memory_title(with_cache, headline, mode),
            subtitle,
            plots_dir / f"{slug}-cache.png",
            style,
            scale=1 / MIB,
            xlabel=mode.n_axis,
        )
        images.append((path, f"Cache kept at context N by N (log-log): the {mode.memory_words}."))
    with_memory = first[first.peak_mem_bytes.notna()] if not mode.decode else first[:0]
    if len(with_memory):
        bounds = frozenset(with_memory[memory_lower_bound(with_memory)].label)
        path = plot_versus_n(
            with_memory,
            "peak_mem_bytes",
            "peak memory (MiB)",
            memory_title(with_memory, headline),
            subtitle,
            plots_dir / f"{slug}-memory.png",
            style,
            scale=1 / MIB,
            lower_bounds=bounds,
        )
        unseen = (
            f" On the CPU the tracker cannot see the scratch a fused kernel allocates inside itself: "
            f"{', '.join(f'`{label}`' for label in sorted(bounds))} shows a lower bound."
            if bounds
            else ""
        )
        images.append((path, f"Peak memory of one call beyond the inputs by N (log-log).{unseen}"))
    errors = cells[(cells.status == "ok") & cells.err_vs_uniform.notna() & (cells.family != "exact")]
    if len(errors):
        path = plot_error(
            cells,
            error_title(headline_of(judged, str(errors["input"].iloc[0]))),
            subtitle,
            plots_dir / f"{slug}-error.png",
            style,
            budget=budget,
            xlabel=mode.n_axis,
            unjudged=not_judged_on_error(judged),
        )
        over = f"; above the dash-dotted line a variant is over the error budget ({budget:g})" if budget else ""
        whose = "the approximate variants' steps" if mode.decode else "the approximate variants"
        top = "; triangles at the top are off the axis (not judged on error, or beyond it)"
        images.append(
            (
                path,
                f"Error of {whose} relative to uniform averaging by N, one panel per input: below the dashed line "
                f"a variant beats averaging V{over}{top if not_judged_on_error(judged) else ''}.",
            )
        )
    recalls = cells[(cells.status == "ok") & cells.needle_accuracy.notna()]
    if len(recalls):
        path = plot_recall(cells, recall_title(recalls), subtitle, plots_dir / f"{slug}-recall.png", style, mode.n_axis)
        images.append(
            (
                path,
                "Needle recall by N, one panel per number of planted key → value pairs: the share of needles whose "
                "query's output is nearest to the planted value (exact attention retrieves them all).",
            )
        )
    return [Block("image", str(path.relative_to(plots_dir.parent)), caption=caption) for path, caption in images]


def header_blocks(run_dir: Path, meta: RunMeta, frame: pd.DataFrame) -> list[Block]:
    """How to reproduce the run, the machine in words, the noise (under the verdict: the answer comes first)."""
    command = shlex.join(meta.command) or "not recorded"
    config, overrides = meta.config, meta.overrides
    config_line = f"`{config.get('name', '')}`" + (f" with {overrides_text(overrides)}" if overrides else "")
    threads = {int(t) for t in frame.threads.dropna()} if "threads" in frame else set()
    loads = pd.concat([frame.load_before, frame.load_after]).dropna() if len(frame) else pd.Series(dtype=float)
    load = (float(loads.min()), float(loads.max())) if len(loads) else None
    lines = [
        f"Reproduce: `{command}` — or, with every override applied, "
        f"`attnbench run {shlex.quote(str(run_dir / 'config.toml'))}`. "
        f"Config: {config_line}.",
        f"Machine: {machine_words(meta.machine, threads, load)}.",
        threads_sentence(meta.raw.get("threads"), frame),
        f"Measured {meta.started} to {meta.finished}. {noise_line(frame)} {reach_sentence(frame)}",
    ]
    return [Block("heading", "This run", level=2)] + [Block("text", line) for line in lines if line]


def about_blocks(run_dir: Path, meta: RunMeta, frame: pd.DataFrame) -> list[Block]:
    machine = meta.machine
    versions = machine.get("versions", {})
    peaks = "; ".join(
        f"{key}: {value.get('matmul_flops_per_s', float('nan')) / 1e9:.0f} GFLOP/s matmul, "
        f"{value.get('copy_bytes_per_s', float('nan')) / 1e9:.1f} GB/s copy"
        + (f", {value['read_bytes_per_s'] / 1e9:.1f} GB/s read ({value.get('read_mib', 0)} MiB), "
           f"{value['write_bytes_per_s'] / 1e9:.1f} GB/s write"
           if value.get("read_bytes_per_s") and value.get("write_bytes_per_s") else "")
        for key, value in meta.peaks.items()
        if "error" not in value
    )
    _, raises = raised_peaks(frame, meta.peaks)
    peaks += "".join(f"; {note}" for note in raises)
    facts = [
        ["run", run_dir.name],
        ["devices", ", ".join(f"{k}: {v}" for k, v in machine.get("devices", {}).items())],
        ["versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v)],
        ["platform", str(machine.get("platform", ""))],
        ["git commit", str(machine.get("git_commit"))],
        ["measured peaks", peaks],
        ["CPU allocator", meta.cpu_allocator],
    ]
    notes = (
        "Time: median and IQR of warmed-up, device-synchronized calls, each group's variants timed in interleaved "
        "rounds (speedups paired per round). Memory on CPU: the peak of the bytes the CPU allocator hands out during "
        "the call, a fused kernel's scratch included (the profiler's memory events; never below the live tensors' "
        "peak, taken where higher; compiled code: the allocator's alone); results.csv keeps the live "
        "tensors' peak alone beside it (`tensor_mem_bytes`: without the kernels' scratch). On CUDA: the "
        "allocator's peak minus the baseline. Error: against exact attention in float64 on the same inputs."
    )
    blocks = [
        Block("heading", "How these numbers were taken", level=2),
        Block("text", notes),
        Block("table", headers=["", ""], rows=facts),
    ]
    config_file = run_dir / "config.toml"
    if config_file.is_file():
        blocks += [
            Block("text", "The resolved config (`config.toml` in the run folder): `attnbench run` runs it again."),
            Block("code", config_file.read_text()),
        ]
    return blocks


def verdict_section(view: RunView, baseline: str, lacking: Unfinished | None = None) -> list[Block]:
    """The answer, first on the page: the accuracy budget it holds to, then per setting and input every N's answer
    in a sentence (with the cells missing under it, where the run is unfinished: `lacking`), what the input's error
    figures can tell, and per N the table of choices and the left-out; how to read them comes last. It opens with
    what it rests on: real heads or synthetic inputs, and what an unfinished run lacks."""
    blocks = [Block("heading", "Verdict", level=2), Block("text", opening_markdown(view.frame, lacking))]
    if said := evidence_markdown(view.evidence):  # per causal setting, N by N: real heads or a stand-in
        blocks.append(Block("text", said))
    blocks.append(Block("text", budget_line(view.budget, baseline)))
    explained: set[str] = set()  # each 'faster from N' mark is said once, under the first table showing it
    for verdict_block in view.blocks:
        blocks.append(Block("heading", block_title(verdict_block), level=3))
        missing = [f"{title}: {lacking.missing[title]}" if len(verdict_block.titles) > 1 else lacking.missing[title]
                   for title in verdict_block.titles if lacking and title in lacking.missing]  # fmt: skip
        if missing:
            blocks.append(Block("text", f"**Unfinished here, not measured:** {'; '.join(missing)}."))
        for answer in verdict_block.verdict.answers:
            asked = f" {answer.asked}" if answer.asked else ""
            blocks.append(Block("text", f"**N={answer.n}:** {answer.sentence}{asked}"))
        blocks.append(Block("text", verdict_block.sentence))
        for answer in verdict_block.verdict.answers:
            headers, rows = verdict_rows(verdict_block.verdict, answer)
            blocks.append(Block("table", headers=headers, rows=rows, caption=f"N={answer.n}: the choices."))
            if legend := crossover_legend(rows, explained):
                blocks.append(Block("text", legend))
            if answer.left_out:
                blocks.append(Block("text", left_out_text(answer)))
    intro = verdict_intro(view.verdicts, f"`{baseline}`")
    return blocks + [Block("text", "How to read it: " + intro)]


def tuning_blocks(view: RunView, baseline: str) -> list[Block]:
    """`--tune`'s answer per N, the knob's curve and every probe ([] when the run was not tuned)."""
    if view.tuning.empty:
        return []
    blocks = [Block("heading", "Tuned: each family's key knob", level=2)]
    blocks += [Block("text", said) for said in tuning_sentences(view.tuning, baseline, view.budget.max_error,
                                                                view.budget.min_recall)]
    if path := tuning_plot(view.tuning, view.run_dir / "plots" / "tuning.png"):
        blocks.append(Block("image", str(path.relative_to(view.run_dir)), caption="Error by knob value at each N "
                            "(bisection: the values probed); ringed, the smallest within the budget, with its speedup."))  # fmt: skip
    headers, rows = tuning_table(view.tuning)
    blocks.append(Block("table", headers=headers, rows=rows, caption="Every knob value probed (tuning.csv)."))
    return blocks


def report_blocks(view: RunView) -> list[Block]:
    run_dir, meta = view.run_dir, view.meta
    frame = with_machine(view.frame)
    baseline = baseline_of(frame)
    style = styles(label_order(frame))
    peaks = view.peaks
    varying = {c for c in SETTING_COLUMNS if frame[c].nunique(dropna=False) > 1}
    samples = view.samples
    lacking = unfinished(run_dir, meta, view.frame)
    blocks = [Block("heading", f"attnbench report: {run_dir.name}", level=1)]
    blocks += verdict_section(view, baseline, lacking)
    blocks += tuning_blocks(view, baseline)
    if compiled := compile_sentence(frame):
        blocks.append(Block("text", compiled))
    blocks += [Block("toc")] + header_blocks(run_dir, meta, frame)
    blocks.append(Block("heading", "Plots", level=2))
    for setting, cells in frame.groupby(SETTING_COLUMNS, sort=False, dropna=False):
        subtitle = setting_words(cells.iloc[0], varying)
        blocks += [Block("heading", subtitle, level=3)]
        judged = [v for v in view.verdicts if v.setting_key == setting_key(setting)]
        blocks += plot_blocks(cells, subtitle, run_dir / "plots", style, baseline, judged, samples)
    blocks.append(Block("heading", "Detail by comparison group", level=2))
    for _, cells in frame.groupby(GROUP_COLUMNS + [MACHINE], sort=False, dropna=False):
        heading = f"{cells.iloc[0]['input']} — {setting_words(cells.iloc[0], varying)}"
        blocks += detail_blocks(cells, heading, peaks, samples)
    return blocks + about_blocks(run_dir, meta, frame)


def write_report(run_dir: Path, view: RunView | None = None) -> Path:
    """Build report.md, report.html and plots/ for a run folder (from `view` where the caller has read it);
    returns the path of report.html."""
    blocks = report_blocks(view or RunView.read(run_dir))
    write_text_atomic(run_dir / "report.md", render_markdown(blocks))  # a full disk leaves the old one, not 0 bytes
    write_text_atomic(run_dir / "report.html", render_html(blocks, run_dir))
    return run_dir / "report.html"
