"""The report of a run: report.md, a self-contained report.html (images embedded) and plots/*.png.

The first screen answers the question (the verdict: per setting, input and N, the fastest exact variant and
the speed-error Pareto set); then the plots; then the detail tables per comparison group (time, speedup,
memory, state, error, the input's statistics, dropped mass, efficiency, slopes, crossovers, failures);
then how the numbers were taken, the machine and the resolved config. Every table has one row order.
"""

from __future__ import annotations

import base64
import html
import re
import shlex
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
from attnbench.analysis import crossover_table, efficiency, raised_peaks, scaling_table
from attnbench.config import overrides_text
from attnbench.machine import machine_words, run_peaks
from attnbench.memory import CPU_METHOD
from attnbench.plots import plot_error, plot_pareto, plot_speedup, plot_versus_n, styles
from attnbench.reference import LOCALITY_WINDOW
from attnbench.results import read_results
from attnbench.atomic import write_text_atomic
from attnbench.rundir import read_meta, read_samples
from attnbench.summary import (
    GROUP_COLUMNS,
    MACHINE,
    baseline_of,
    format_number,
    interval_words,
    label_order,
    markdown_table,
    noise_line,
    speedup_text,
    with_machine,
)
from attnbench.verdict import (
    SETTING_COLUMNS,
    VERDICT_INTRO,
    block_title,
    left_out_text,
    setting_words,
    verdict_blocks,
    verdict_rows,
    verdicts,
)

MIB = 2**20
# Variants whose call is one fused kernel (SDPA's, for `full`): on the CPU the live-tensor tracker sees their output
# but none of the kernel's private scratch (attnbench.memory), so their CPU peak is a lower bound, never a winner.
ONE_FUSED_KERNEL = frozenset({"full"})


@dataclass
class Block:
    """One piece of the report, rendered to both Markdown and HTML."""

    kind: str  # "heading" | "text" | "table" | "image" | "code" | "toc"
    text: str = ""
    level: int = 2
    headers: list[str] | None = None
    rows: list[list[str]] | None = None
    best: set[tuple[int, int]] = field(default_factory=set)  # (row, column) of highlighted cells
    caption: str = ""  # under an image, above a table


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-").lower()


FILE_PART_CHARS = 48  # a plot file name piece made from free text (an input label holds a captured file's path)


def _file_part(text: str) -> str:
    """`text` as a piece of a file name: its slug, cut to FILE_PART_CHARS with a hash of the whole when longer
    (two long labels never share a file; the name stays far under the file system's 255 bytes)."""
    slug = _slug(text)
    if len(slug) <= FILE_PART_CHARS:
        return slug
    return f"{slug[:FILE_PART_CHARS].rstrip('-')}-{zlib.crc32(text.encode()):08x}"


def _pivot(
    cells: pd.DataFrame,
    formatter: Callable[[pd.Series], str],
    score: Callable[[pd.Series], float] | None = None,
    higher_is_better: bool = False,
) -> tuple[list[str], list[list[str]], set[tuple[int, int]]]:
    """label × N table of formatter(row) over ok cells (failed cells read as their status), rows in
    `label_order`; with `score`, the best cell of each N column is marked."""
    ns = sorted(cells.seq_len.unique())
    labels = label_order(cells)
    rows, best = [], set()
    for column, n in enumerate(ns, start=1):
        at_n = cells[(cells.seq_len == n) & (cells.status == "ok")]
        if score is None or at_n.empty:
            continue
        scores = at_n.apply(score, axis=1).dropna()
        if len(scores):
            winner = at_n.loc[scores.idxmax() if higher_is_better else scores.idxmin()].label
            best.add((labels.index(winner), column))
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


def detail_blocks(cells: pd.DataFrame, heading: str, peaks: dict) -> list[Block]:
    """The detail tables of one comparison group (one setting and input), N as columns."""
    blocks = [Block("heading", heading, level=3)]
    baseline = baseline_of(cells)
    timed = cells.timed.fillna(True).astype(bool).any()
    base = cells[(cells.label == baseline) & (cells.status == "ok")].set_index("seq_len")

    def to_base(row: pd.Series, column: str) -> float:
        """This cell's `column` over the baseline's at the same N (NaN without a baseline)."""
        if row.seq_len not in base.index or not base.loc[row.seq_len, column]:
            return float("nan")
        return row[column] / base.loc[row.seq_len, column]

    if timed:
        blocks.append(
            _table(
                "Time per call, ms: median ± IQR over the interleaved rounds (fastest per N in bold).",
                _pivot(
                    cells,
                    lambda r: f"{r.time_median_s * 1e3:.2f} ± {r.time_iqr_s * 1e3:.2f}",
                    lambda r: _nan(r.time_median_s),
                ),
            )
        )
        blocks.append(
            _table(
                f"Speedup against `{baseline}`: the median over rounds of its time / this time in the same round, "
                f"with {interval_words(cells)}.",
                _pivot(cells, speedup_text, lambda r: _nan(r.speedup), higher_is_better=True),
            )
        )
        blocks.append(
            _table(
                f"Peak memory of one call beyond the inputs, MiB (ratio to `{baseline}`); state a variant keeps "
                "between calls is not in it (smallest per N in bold).",
                _pivot(
                    cells,
                    lambda r: (
                        f"{format_number(r.peak_mem_bytes / MIB, '.1f')} "
                        f"({format_number(to_base(r, 'peak_mem_bytes'), '.2f')}×)"
                    ),
                    lambda r: _nan(r.peak_mem_bytes),
                ),
            )
        )
        blocks.append(
            _table(
                "State kept between calls (cached patterns, projections, rotations), MiB: built by the first call.",
                _pivot(cells, lambda r: format_number(r.state_mem_bytes / MIB, ".2f")),
            )
        )
    else:
        blocks.append(Block("text", "Error only: time and memory of this setting were measured on its first input."))
    approximate = cells.family != "exact"
    blocks.append(
        _table(
            "Error against exact softmax attention (float64): vs-uniform / relative Frobenius / mean row cosine. "
            "vs-uniform is ‖O−O*‖/‖U−O*‖: 0 exact, 1 no better than averaging V (most accurate approximation "
            "per N in bold).",
            _pivot(
                cells,
                lambda r: " / ".join(
                    format_number(value, spec)
                    for value, spec in ((r.err_vs_uniform, ".3g"), (r.err_rel_fro, ".2e"), (r.err_row_cosine, ".3f"))
                ),
                lambda r: _nan(r.err_vs_uniform) if approximate[r.name] else float("nan"),
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
    exact_patterns = cells[cells.dropped_mass.notna()]
    if len(exact_patterns):
        blocks.append(
            _table(
                "Exact-pattern variants: the exact attention mass outside their support, the whole source of their "
                "error.",
                _pivot(exact_patterns, lambda r: format_number(r.dropped_mass, ".3g")),
            )
        )
    if timed:
        with_efficiency = cells.assign(efficiency=efficiency(cells, peaks))
        blocks.append(
            _table(
                "Achieved FLOP/s from each variant's cost model, as a share of this run's dense-matmul peak (best "
                "of bursts at the run's threads at its start, between groups and at its end, raised to the highest "
                "rate a cell reached where that was higher: see 'measured peaks'; a sparse variant counts only the "
                "work its algorithm does).",
                _pivot(with_efficiency, lambda r: format_number(100 * r.efficiency, ".1f") + "%"),
            )
        )
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


def _scaling_blocks(cells: pd.DataFrame, baseline: str) -> list[Block]:
    order = label_order(cells)
    blocks = []
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
                headers=["variant", "N range fitted", "time slope", "memory slope"],
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
                headers=["variant", "faster from", "smaller from"],
                rows=rows,
                caption=f"Crossover against `{baseline}`, interpolated in log-log between swept points.",
            )
        )
    return blocks


def _largest(frame: pd.DataFrame) -> pd.DataFrame:
    ok = frame[frame.status == "ok"]
    return ok[ok.seq_len == ok.seq_len.max()] if len(ok) else ok


def memory_lower_bound(rows: pd.DataFrame) -> pd.Series:
    """Per row: is its peak memory a lower bound? (taken by the CPU tracker on a variant run as one fused kernel)"""
    return (rows.mem_method == CPU_METHOD) & rows.variant.isin(ONE_FUSED_KERNEL)


def memory_title(rows: pd.DataFrame) -> str:
    """The memory plot's headline at the largest N: the variant that needs the least memory among those measured
    whole; a smaller figure that is only a lower bound is named as one, never crowned."""
    largest = _largest(rows).sort_values("peak_mem_bytes")
    bound = memory_lower_bound(largest)
    whole, partial = largest[~bound], largest[bound]
    n = largest.seq_len.iloc[0]
    if whole.empty:
        lead = partial.iloc[0]
        return (
            f"At N={n}, {lead.label} needs at least {lead.peak_mem_bytes / MIB:.3g} MiB per call "
            "(the CPU tracker cannot see its fused kernel's scratch)"
        )
    winner = whole.iloc[0]
    below = partial[partial.peak_mem_bytes < winner.peak_mem_bytes]
    if below.empty:
        return f"At N={n}, {winner.label} needs the least memory: {winner.peak_mem_bytes / MIB:.3g} MiB per call"
    bounds = "; ".join(f"{r.label}: ≥ {r.peak_mem_bytes / MIB:.3g} MiB" for r in below.itertuples())
    return (
        f"At N={n}, {winner.label} needs the least fully tracked memory: {winner.peak_mem_bytes / MIB:.3g} MiB "
        f"per call ({bounds}, kernel scratch unseen)"
    )


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
    samples: dict[str, list[float]] | None = None,
) -> list[Block]:
    """The plots of one setting (every input): speedup, Pareto per input and N, time (median and quartiles of
    `samples`, cell key -> seconds per round), memory, error."""
    timed = cells[(cells.status == "ok") & cells.time_median_s.notna()]
    first = cells.iloc[0]  # a readable start, and a hash of every setting column: two settings never share a file
    setting = "-".join(f"{c}{first[c]}" for c in SETTING_COLUMNS)
    readable = f"{first['device']}-{first['dtype']}-{first['mode']}-causal{first['causal']}"
    slug = f"{_slug(readable)}-{zlib.crc32(setting.encode()):08x}"
    images: list[tuple[Path, str]] = []
    if timed.speedup.notna().any():
        top = _largest(timed[timed.label != baseline]).sort_values("speedup", ascending=False)
        title = (
            f"At N={top.iloc[0].seq_len}, {top.iloc[0].label} runs {top.iloc[0].speedup:.1f}× as fast as {baseline}"
            if len(top)
            else f"Speedup against {baseline}"
        )
        path = plot_speedup(timed, baseline, title, subtitle, plots_dir / f"{slug}-speedup.png", style)
        images.append((path, f"Speedup against `{baseline}` by N, measured in turns; bars are 95% intervals."))
    for verdict in verdicts(cells, samples):  # one rule: the plot shows the verdict's own choices and its sentence
        for answer in verdict.answers:
            # a point needs both axes: no error is measured with `error = false`
            paired = [c for c in answer.choices + answer.left_out if c.speedup == c.speedup and c.error == c.error]
            if not paired:
                continue
            points = pd.DataFrame(
                [
                    {
                        "label": c.label,
                        "speedup": c.speedup,
                        "speedup_low": c.speedup_low,
                        "speedup_high": c.speedup_high,
                        "error": c.error,
                        "memory_ratio": c.memory_ratio,
                    }
                    for c in paired
                ]
            )
            front = [c.label for c in answer.choices]
            path = plot_pareto(
                points,
                front,
                baseline,
                f"At N={answer.n} on {verdict.input}: {answer.sentence}",
                subtitle,
                plots_dir / f"{slug}-{_file_part(verdict.input)}-pareto-N{answer.n}.png",
                style,
            )
            images.append(
                (
                    path,
                    f"Speed against error at N={answer.n} on `{verdict.input}`: up and to the left is worse; bubble "
                    "area is peak memory; the step line joins the verdict's choices; bars are the speedup's 95% "
                    "interval.",
                )
            )
    first = timed[timed["input"] == timed["input"].iloc[0]] if len(timed) else timed  # one input's times
    if len(first):
        largest = _largest(first)
        paired = largest.speedup.notna().any()  # the in-turn ratio decides who is fastest; medians alone may not
        fastest = largest.sort_values("speedup" if paired else "time_median_s", ascending=not paired).iloc[0]
        path = plot_versus_n(
            first,
            "time_median_s",
            "time per call (ms)",
            f"At N={fastest.seq_len}, {fastest.label} is fastest: {fastest.time_median_s * 1e3:.3g} ms per call"
            + (f", {fastest.speedup:.2g}× {baseline} in turns" if paired else ""),
            subtitle,
            plots_dir / f"{slug}-time.png",
            style,
            scale=1e3,
            samples=_timing_samples(first, samples or {}),
        )
        spread = "; the band spans the quartiles of the timing samples" if samples else ""
        images.append((path, f"Time per call by N (log-log): the median{spread}."))
    with_memory = first[first.peak_mem_bytes.notna()]
    if len(with_memory):
        bounds = frozenset(with_memory[memory_lower_bound(with_memory)].label)
        path = plot_versus_n(
            with_memory,
            "peak_mem_bytes",
            "peak memory (MiB)",
            memory_title(with_memory),
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
        first_input = str(errors["input"].iloc[0])
        best = _largest(errors[errors["input"] == first_input]).sort_values("err_vs_uniform").iloc[0]
        path = plot_error(
            cells,
            f"Most accurate approximation on {first_input} at N={best.seq_len}: {best.label}, with "
            f"{best.err_vs_uniform:.2f} of averaging's error"
            if best.err_vs_uniform < 0.95
            else f"At N={best.seq_len} on {first_input}, no approximation is much better than averaging V "
            f"(best: {best.label}, {best.err_vs_uniform:.2f})",
            subtitle,
            plots_dir / f"{slug}-error.png",
            style,
        )
        images.append(
            (
                path,
                "Error of the approximate variants relative to uniform averaging by N, one panel per "
                "input: below the dashed line a variant beats averaging V.",
            )
        )
    return [Block("image", str(path.relative_to(plots_dir.parent)), caption=caption) for path, caption in images]


def header_blocks(run_dir: Path, meta: dict, frame: pd.DataFrame) -> list[Block]:
    """Title, how to reproduce the run, the machine in words, the noise."""
    command = shlex.join(meta.get("command", [])) or "not recorded"
    config = meta.get("config", {})
    overrides = meta.get("overrides") or {}
    config_line = f"`{config.get('name', '')}`" + (f" with {overrides_text(overrides)}" if overrides else "")
    threads = {int(t) for t in frame.threads.dropna()} if "threads" in frame else set()
    loads = pd.concat([frame.load_before, frame.load_after]).dropna() if len(frame) else pd.Series(dtype=float)
    load = (float(loads.min()), float(loads.max())) if len(loads) else None
    lines = [
        f"Reproduce: `{command}` — or, with every override applied, "
        f"`attnbench run {shlex.quote(str(run_dir / 'config.toml'))}`. "
        f"Config: {config_line}.",
        f"Machine: {machine_words(meta.get('machine', {}), threads, load)}.",
        f"Measured {meta.get('started', '?')} to {meta.get('finished', 'not finished')}. {noise_line(frame)}",
    ]
    return [Block("heading", f"attnbench report: {run_dir.name}", level=1)] + [Block("text", line) for line in lines]


def about_blocks(run_dir: Path, meta: dict, frame: pd.DataFrame) -> list[Block]:
    machine = meta.get("machine", {})
    versions = machine.get("versions", {})
    peaks = "; ".join(
        f"{key}: {value.get('matmul_flops_per_s', float('nan')) / 1e9:.0f} GFLOP/s matmul, "
        f"{value.get('copy_bytes_per_s', float('nan')) / 1e9:.1f} GB/s copy"
        for key, value in run_peaks(meta).items()
        if "error" not in value
    )
    _, raises = raised_peaks(frame, run_peaks(meta))
    peaks += "".join(f"; {note}" for note in raises)
    facts = [
        ["run", run_dir.name],
        ["devices", ", ".join(f"{k}: {v}" for k, v in machine.get("devices", {}).items())],
        ["versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v)],
        ["platform", str(machine.get("platform", ""))],
        ["git commit", str(machine.get("git_commit"))],
        ["measured peaks", peaks],
        ["CPU allocator", str(meta.get("cpu_allocator", "not recorded"))],
    ]
    notes = (
        "Time: median and IQR of warmed-up, device-synchronized calls, each group's variants timed in interleaved "
        "rounds (speedups paired per round). Memory on CPU: peak bytes of live tensors created during the call (a "
        "TorchDispatchMode); it cannot see scratch that a fused kernel allocates inside itself (SDPA's flash "
        "kernel), so `full` is a lower bound there. On CUDA: the allocator's peak minus the baseline. Error: "
        "against exact attention in float64 on the same inputs."
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


def report_blocks(run_dir: Path) -> list[Block]:
    frame = with_machine(read_results(run_dir))
    meta = read_meta(run_dir)
    baseline = baseline_of(frame)
    style = styles(label_order(frame))
    peaks, _ = raised_peaks(frame, run_peaks(meta))
    varying = {c for c in SETTING_COLUMNS if frame[c].nunique(dropna=False) > 1}
    samples = read_samples(run_dir)
    blocks = header_blocks(run_dir, meta, frame) + [Block("toc")]
    blocks += [Block("heading", "Verdict", level=2), Block("text", VERDICT_INTRO.format(baseline=f"`{baseline}`"))]
    for verdict_block in verdict_blocks(frame, samples):
        blocks.append(Block("heading", block_title(verdict_block), level=3))
        blocks.append(Block("text", verdict_block.sentence))
        for answer in verdict_block.verdict.answers:
            blocks.append(Block("text", f"**N={answer.n}:** {answer.sentence}"))
            headers, rows = verdict_rows(verdict_block.verdict, answer)
            blocks.append(Block("table", headers=headers, rows=rows))
            if answer.left_out:
                blocks.append(Block("text", left_out_text(answer)))
    blocks.append(Block("heading", "Plots", level=2))
    for _, cells in frame.groupby(SETTING_COLUMNS, sort=False, dropna=False):
        subtitle = setting_words(cells.iloc[0], varying)
        blocks += [Block("heading", subtitle, level=3)]
        blocks += plot_blocks(cells, subtitle, run_dir / "plots", style, baseline, samples)
    blocks.append(Block("heading", "Detail by comparison group", level=2))
    for _, cells in frame.groupby(GROUP_COLUMNS + [MACHINE], sort=False, dropna=False):
        heading = f"{cells.iloc[0]['input']} — {setting_words(cells.iloc[0], varying)}"
        blocks += detail_blocks(cells, heading, peaks)
    return blocks + about_blocks(run_dir, meta, frame)


def _headings(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.kind == "heading" and b.level in (2, 3)]


def render_markdown(blocks: list[Block]) -> str:
    parts = []
    for block in blocks:
        if block.kind == "heading":
            parts.append(f"{'#' * block.level} {block.text}")
        elif block.kind == "text":
            parts.append(block.text)
        elif block.kind == "toc":
            parts.append(
                "\n".join(
                    f"{'  ' * (h.level - 2)}- [{h.text}](#{_slug(h.text)})" for h in _headings(blocks) if h.level == 2
                )
            )
        elif block.kind == "code":
            parts.append(f"```toml\n{block.text.rstrip()}\n```")
        elif block.kind == "table":
            rows = [
                [f"**{c}**" if (i, j) in block.best and c else c for j, c in enumerate(row)]
                for i, row in enumerate(block.rows)
            ]
            parts += ([block.caption] if block.caption else []) + [markdown_table(block.headers, rows)]
        else:
            alt = Path(block.text).stem.rsplit("-", 1)[-1]  # speedup, time, memory, error, N1024 (a Pareto chart)
            parts.append(f"![{alt}]({block.text})" + (f"\n\n*{block.caption}*" if block.caption else ""))
    return "\n\n".join(parts) + "\n"


# Phone first: text wraps to the screen, wide tables scroll sideways under a fixed first column, plots fill the
# width (their fonts are sized for that, see attnbench.plots) and open at full size on a tap; wide screens show
# plots two to a row.
HTML_STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:1.5em auto;padding:0 1em;color:#222;
line-height:1.45;overflow-wrap:break-word;-webkit-text-size-adjust:100%}h1{font-size:1.6em}
h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:2em}h3{margin-top:1.6em}
.scroll{overflow-x:auto;margin:0 0 1.4em;max-width:100%}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left;position:sticky;left:0;background:#fff}
th{background:#f3f3f3;position:sticky;top:0}th:first-child{background:#f3f3f3;z-index:1}
td.best{background:#e3f2e1;font-weight:600}
.caption{font-size:13px;color:#444;margin:0.8em 0 6px;max-width:60em}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,460px),1fr));gap:0 28px}
figure{margin:0.6em 0 1.8em;min-width:0}figure label{display:block;overflow-x:auto;cursor:zoom-in}
figure input{position:absolute;opacity:0;pointer-events:none}
figure img{width:100%;height:auto;display:block;border:1px solid #eee;box-sizing:border-box}
figure input:checked+img{width:auto;max-width:none;cursor:zoom-out}figure:has(input:checked){grid-column:1/-1}
figcaption{font-size:13px;color:#444;margin-top:4px}code{background:#f3f3f3;padding:0 3px;border-radius:3px;
overflow-wrap:anywhere}td.text,th.text{text-align:left}
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}nav{background:#fafafa;border:1px solid #eee;
padding:6px 12px;font-size:14px}nav ul{margin:4px 0;padding-left:1.2em}
@media (max-width:600px){body{padding:0 10px;margin:1em auto}h1{font-size:1.35em}h2{font-size:1.25em}
h3{font-size:1.05em}table{font-size:12px}td,th{padding:3px 6px}}"""


def inline_html(text: str) -> str:
    """Escaped text with `code spans` and **strong** runs rendered."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


def _is_text_column(cells: list[str]) -> bool:
    """A column of names or reasons (left-aligned), not of figures: some cell starts with a letter."""
    return any(cell[:1].isalpha() and not cell.startswith(("ok", "nan")) for cell in cells if cell)


def _toc_html(blocks: list[Block]) -> str:
    """Nested links: each level-2 heading with its level-3 headings under it."""
    out, started, in_sub = "<ul>", False, False
    for heading in _headings(blocks):
        link = f"<a href='#{_slug(heading.text)}'>{inline_html(heading.text)}</a>"
        if heading.level == 2:
            out += ("</ul>" if in_sub else "") + ("</li>" if started else "") + f"<li>{link}"
            started, in_sub = True, False
        else:
            out += ("" if in_sub else "<ul>") + f"<li>{link}</li>"
            in_sub = True
    return out + ("</ul>" if in_sub else "") + ("</li>" if started else "") + "</ul>"


def render_html(blocks: list[Block], run_dir: Path) -> str:
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>attnbench report: {html.escape(run_dir.name)}</title><style>{HTML_STYLE}</style></head><body>"
    ]
    in_plots = False  # inside a grid of consecutive plots
    for block in blocks:
        if in_plots and block.kind != "image":
            parts.append("</div>")
        if block.kind == "heading":
            level = block.level
            parts.append(f"<h{level} id='{_slug(block.text)}'>{inline_html(block.text)}</h{level}>")
        elif block.kind == "text":
            parts.append(f"<p>{inline_html(block.text)}</p>")
        elif block.kind == "toc":
            parts.append(f"<nav><strong>Contents</strong>{_toc_html(blocks)}</nav>")
        elif block.kind == "code":
            parts.append(f"<pre><code>{html.escape(block.text)}</code></pre>")
        elif block.kind == "table":
            caption = f"<p class='caption'>{inline_html(block.caption)}</p>" if block.caption else ""
            text = [_is_text_column([row[j] for row in block.rows]) for j in range(len(block.headers))]
            head = "".join(
                f"<th{' class=text' if text[j] else ''}>{inline_html(h)}</th>" for j, h in enumerate(block.headers)
            )
            body = "".join(
                "<tr>"
                + "".join(
                    f"<td class='{'best ' if (i, j) in block.best else ''}{'text' if text[j] else ''}'>"
                    f"{inline_html(c)}</td>"
                    for j, c in enumerate(row)
                )
                + "</tr>"
                for i, row in enumerate(block.rows)
            )
            parts.append(
                f"{caption}<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
            )
        else:
            if not in_plots:
                parts.append("<div class='plots'>")
            data = base64.b64encode((run_dir / block.text).read_bytes()).decode()
            caption = f"<figcaption>{inline_html(block.caption)}</figcaption>" if block.caption else ""
            parts.append(
                f"<figure><label title='tap for full size'><input type='checkbox'>"
                f"<img alt='{html.escape(block.caption or Path(block.text).stem)}' "
                f"src='data:image/png;base64,{data}'></label>{caption}</figure>"
            )
        in_plots = block.kind == "image"
    parts.append("</div></body></html>" if in_plots else "</body></html>")
    return "\n".join(parts)


def write_report(run_dir: Path) -> Path:
    """Build report.md, report.html and plots/ for a run folder; returns the path of report.html."""
    blocks = report_blocks(run_dir)
    write_text_atomic(run_dir / "report.md", render_markdown(blocks))  # a full disk leaves the old one, not 0 bytes
    write_text_atomic(run_dir / "report.html", render_html(blocks, run_dir))
    return run_dir / "report.html"
