"""The report of a run: report.md, a self-contained report.html (images embedded) and plots/*.png.

Per configuration group (device, dtype, mode, causal, shape, input): tables of time, speedup, memory,
error and efficiency by N, failed or skipped cells with reasons, the fitted scaling slopes, the
crossover N against `full`, and the plots.
"""

from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from attnbench.analysis import crossover_table, efficiency, scaling_table
from attnbench.machine import best_peaks
from attnbench.plots import plot_error, plot_pareto, plot_versus_n, variant_palette
from attnbench.reference import LOCALITY_WINDOW
from attnbench.results import read_results
from attnbench.summary import GROUP_COLUMNS, baseline_of, format_number, markdown_table, noise_line, speedup_text

MIB = 2**20


@dataclass
class Block:
    """One piece of the report, rendered to both Markdown and HTML."""

    kind: str  # "heading" | "text" | "table" | "image"
    text: str = ""
    level: int = 2
    headers: list[str] | None = None
    rows: list[list[str]] | None = None


def _pivot(cells: pd.DataFrame, formatter) -> tuple[list[str], list[list[str]]]:
    """label x N table of formatter(row) over ok cells (failed cells read as their status)."""
    ns = sorted(cells.seq_len.unique())
    labels = list(dict.fromkeys(cells.sort_values(["variant", "label"]).label))
    rows = []
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
    return ["variant"] + [f"N={n}" for n in ns], rows


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-").lower()


def group_blocks(cells: pd.DataFrame, heading: str, plots_dir: Path, palette: dict, peaks: dict) -> list[Block]:
    """Tables, analysis and plots for one configuration group."""
    blocks = [Block("heading", heading, level=2)]
    baseline = baseline_of(cells)
    base = cells[(cells.label == baseline) & (cells.status == "ok")].set_index("seq_len")

    def to_base(row: pd.Series, column: str) -> float:
        """This cell's `column` over the baseline's at the same N (NaN without a baseline)."""
        if row.seq_len not in base.index or not base.loc[row.seq_len, column]:
            return float("nan")
        return row[column] / base.loc[row.seq_len, column]

    def speedup(row: pd.Series) -> float:
        return row.speedup  # paired: measured in turns with the baseline, round by round

    headers, rows = _pivot(cells, lambda r: f"{r.time_median_s * 1e3:.2f} ± {r.time_iqr_s * 1e3:.2f}")
    blocks += [
        Block("text", "Time per call, ms (median ± IQR over repeats)."),
        Block("table", headers=headers, rows=rows),
    ]
    headers, rows = _pivot(cells, speedup_text)
    blocks += [
        Block(
            "text",
            f"Speedup against `{baseline}`: the median over interleaved rounds of its time / this time in the "
            "same round, with a bootstrap 95% interval.",
        ),
        Block("table", headers=headers, rows=rows),
    ]
    headers, rows = _pivot(
        cells,
        lambda r: (
            f"{format_number(r.peak_mem_bytes / MIB, '.1f')} ({format_number(to_base(r, 'peak_mem_bytes'), '.2f')}×)"
        ),
    )
    blocks += [
        Block(
            "text",
            f"Peak memory of one call beyond the inputs, MiB (ratio to `{baseline}`); state a variant keeps "
            "between calls is not in it.",
        ),
        Block("table", headers=headers, rows=rows),
    ]
    headers, rows = _pivot(cells, lambda r: format_number(r.state_mem_bytes / MIB, ".2f"))
    blocks += [
        Block(
            "text", "State kept between calls (cached patterns, projections, rotations), MiB: built by the first call."
        ),
        Block("table", headers=headers, rows=rows),
    ]
    headers, rows = _pivot(
        cells,
        lambda r: " / ".join(
            format_number(value, spec)
            for value, spec in ((r.err_vs_uniform, ".3g"), (r.err_rel_fro, ".2e"), (r.err_row_cosine, ".3f"))
        ),
    )
    blocks += [
        Block(
            "text",
            "Error against exact softmax attention (float64): vs-uniform / relative Frobenius / "
            "mean row cosine. vs-uniform is ‖O−O*‖/‖U−O*‖: 0 exact, 1 no better than averaging V.",
        ),
        Block("table", headers=headers, rows=rows),
    ]
    stats = cells.dropna(subset=["input_entropy"]).groupby("seq_len")[["input_entropy", "input_band_mass"]].first()
    if len(stats):
        rows = [[str(n), f"{r.input_entropy:.3f}", f"{r.input_band_mass:.3f}"] for n, r in stats.iterrows()]
        blocks += [
            Block(
                "text",
                "The input, seen through exact attention: normalized entropy (mean over rows of "
                "H(p) / log(visible keys); 1 = uniform, 0 = one key) and the share of attention "
                f"mass within |i − j| ≤ {LOCALITY_WINDOW}. Read the errors above against these.",
            ),
            Block("table", headers=["N", "attention entropy", f"mass within ±{LOCALITY_WINDOW}"], rows=rows),
        ]
    exact_patterns = cells[cells.dropped_mass.notna()]
    if len(exact_patterns):
        headers, rows = _pivot(exact_patterns, lambda r: format_number(r.dropped_mass, ".3g"))
        blocks += [
            Block(
                "text",
                "Exact-pattern variants: the exact attention mass outside their support, "
                "the whole source of their error.",
            ),
            Block("table", headers=headers, rows=rows),
        ]
    with_efficiency = cells.assign(efficiency=efficiency(cells, peaks))
    headers, rows = _pivot(
        with_efficiency,
        lambda r: format_number(100 * r.efficiency, ".1f") + ("% (above peak)" if r.efficiency > 1 else "%"),
    )
    blocks += [
        Block(
            "text",
            "Achieved FLOP/s from each variant's cost model, as a share of this run's measured "
            "dense-matmul peak (best of several bursts at the start and the end of the run; a sparse variant "
            "counts only the work its algorithm does). A figure above 100% means the peak was measured in a "
            "slow stretch of the machine or the cell's time in a fast one: read it as noise, not as a result.",
        ),
        Block("table", headers=headers, rows=rows),
    ]

    scaling = scaling_table(cells)
    if len(scaling):
        rows = [
            [r.label, r.n_range, format_number(r.time_slope, ".2f"), format_number(r.memory_slope, ".2f")]
            for r in scaling.itertuples()
        ]
        blocks += [
            Block("text", "Fitted log-log slopes over the ok cells (1 = linear in N, 2 = quadratic)."),
            Block("table", headers=["variant", "N range fitted", "time slope", "memory slope"], rows=rows),
        ]
    crossings = crossover_table(cells, baseline)
    if len(crossings):
        rows = [[r.label, r.faster_from, r.smaller_from] for r in crossings.itertuples()]
        blocks += [
            Block("text", f"Crossover against `{baseline}`, interpolated in log-log between swept points."),
            Block("table", headers=["variant", "faster from", "smaller from"], rows=rows),
        ]
    failed = cells[cells.status != "ok"]
    if len(failed):
        rows = [[r.label, str(r.seq_len), r.status, r.reason] for r in failed.itertuples()]
        blocks += [
            Block("text", "Cells that did not run to the end."),
            Block("table", headers=["variant", "N", "status", "reason"], rows=rows),
        ]

    first = cells.iloc[0]  # every group column in the name: two settings never share a plot file
    slug = _slug("-".join(f"{column}{first[column]}" for column in GROUP_COLUMNS))[:100]
    images = [
        plot_versus_n(
            cells,
            "time_median_s",
            "time per call (ms)",
            f"Time — {heading}",
            plots_dir / f"{slug}-time.png",
            palette,
            scale=1e3,
            band="time_iqr_s",
        ),
        plot_versus_n(
            cells,
            "peak_mem_bytes",
            "peak memory beyond inputs (MiB)",
            f"Memory — {heading}",
            plots_dir / f"{slug}-memory.png",
            palette,
            scale=1 / MIB,
        ),
        plot_error(cells, f"Error — {heading}", plots_dir / f"{slug}-error.png", palette),
    ]
    for n, at_n in cells[cells.status == "ok"].groupby("seq_len"):
        points = at_n.assign(speedup=at_n.apply(speedup, axis=1), error=at_n.err_vs_uniform)[
            ["label", "speedup", "error"]
        ].dropna()
        if len(points):
            images.append(
                plot_pareto(
                    points, f"Speed vs error at N={n} — {heading}", plots_dir / f"{slug}-pareto-N{n}.png", palette
                )
            )
    blocks += [Block("image", str(path.relative_to(plots_dir.parent))) for path in images]
    return blocks


def header_blocks(run_dir: Path, meta: dict) -> list[Block]:
    machine = meta.get("machine", {})
    versions = machine.get("versions", {})
    peaks = "; ".join(
        f"{key}: {value.get('matmul_flops_per_s', float('nan')) / 1e9:.0f} GFLOP/s matmul, "
        f"{value.get('copy_bytes_per_s', float('nan')) / 1e9:.1f} GB/s copy"
        for key, value in best_peaks(meta.get("peaks", {}), meta.get("peaks_at_end", {})).items()
        if "error" not in value
    )
    facts = [
        ["run", run_dir.name],
        ["config", str(meta.get("config", {}).get("name", ""))],
        ["command", " ".join(meta.get("command", [])) or "not recorded"],
        ["noise", noise_line(read_results(run_dir))],
        ["started / finished", f"{meta.get('started', '')} / {meta.get('finished', 'not finished')}"],
        ["devices", ", ".join(f"{k}: {v}" for k, v in machine.get("devices", {}).items())],
        ["torch threads", str(machine.get("torch_threads", ""))],
        ["versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v)],
        ["git commit", str(machine.get("git_commit"))],
        ["measured peaks", peaks],
        ["CPU allocator", str(meta.get("cpu_allocator", "not recorded"))],
    ]
    notes = (
        "Time: median and IQR of warmed-up, device-synchronized calls, each group's variants timed in interleaved "
        "rounds (speedups paired per round). "
        "Memory on CPU: peak bytes of live tensors created during the call (a TorchDispatchMode); it cannot "
        "see scratch that a fused kernel allocates inside itself (SDPA's flash kernel), so `full` is a lower "
        "bound there. On CUDA: the allocator's peak minus the baseline. Error: against exact attention in "
        "float64 on the same inputs."
    )
    return [
        Block("heading", f"attnbench report: {run_dir.name}", level=1),
        Block("table", headers=["", ""], rows=facts),
        Block("text", notes),
    ]


def render_markdown(blocks: list[Block]) -> str:
    parts = []
    for block in blocks:
        if block.kind == "heading":
            parts.append(f"{'#' * block.level} {block.text}")
        elif block.kind == "text":
            parts.append(block.text)
        elif block.kind == "table":
            parts.append(markdown_table(block.headers, block.rows))
        else:
            parts.append(f"![{Path(block.text).stem}]({block.text})")
    return "\n\n".join(parts) + "\n"


HTML_STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right}td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}img{max-width:100%;
display:block;margin:1em 0}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:2em}"""


def render_html(blocks: list[Block], run_dir: Path) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>attnbench report</title>"
        f"<style>{HTML_STYLE}</style></head><body>"
    ]
    for block in blocks:
        if block.kind == "heading":
            parts.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
        elif block.kind == "text":
            parts.append(f"<p>{html.escape(block.text)}</p>")
        elif block.kind == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in block.headers)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in block.rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        else:
            data = base64.b64encode((run_dir / block.text).read_bytes()).decode()
            parts.append(f"<img alt='{html.escape(Path(block.text).stem)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(run_dir: Path) -> Path:
    """Build report.md, report.html and plots/ for a run folder; returns the path of report.md."""
    cells = read_results(run_dir)
    meta_path = run_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    palette = variant_palette(list(cells.label))
    blocks = header_blocks(run_dir, meta)
    for group, group_cells in cells.groupby(GROUP_COLUMNS, sort=False, dropna=False):
        heading = ", ".join(f"{k}={v}" for k, v in zip(GROUP_COLUMNS, group))
        peaks = best_peaks(meta.get("peaks", {}), meta.get("peaks_at_end", {}))
        blocks += group_blocks(group_cells, heading, run_dir / "plots", palette, peaks)
    (run_dir / "report.md").write_text(render_markdown(blocks))
    (run_dir / "report.html").write_text(render_html(blocks, run_dir))
    return run_dir / "report.md"
