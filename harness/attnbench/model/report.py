"""The report of an `attnbench model` run: a summary table per variant and length (perplexity against the exact
model's), perplexity against sequence length, error by layer, and loss change vs speedup when timed."""

from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd

from attnbench.atomic import write_text_atomic
from attnbench.report.document import Block, render_html, render_markdown
from attnbench.report.plots import plot_layer_errors, plot_loss_vs_speedup, plot_versus_n, styles
from attnbench.report.text import format_number, ratio_text, speedup_text
from attnbench.runfolder.meta import RunMeta

RATIO_RESOLUTION = 1e-4  # perplexity ratios within this of 1 are float rounding (an exact variant)


def read_model_rows(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "model.csv", dtype={"label": str, "layer": str, "reason": str}).fillna({"reason": ""})


def final_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the whole model (every layer swapped, its final output), one per variant setting and length,
    ordered by setting (as run) then length."""
    finals = frame[(frame.swap == "all") & (frame.layer == "final")]
    order = {label: i for i, label in enumerate(dict.fromkeys(frame.label))}
    return finals.sort_values(["label", "seq_len"], key=lambda c: c.map(order) if c.name == "label" else c)


def summary_rows(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """One row per variant setting and length: perplexity against the exact model's, the logits' error, and the
    end-to-end speedup and the worst single layer when those were measured. The last column is the notes."""
    timed = bool(frame.speedup.notna().any())
    single = frame[(frame.swap == "single") & frame.rel_error.notna()]
    headers = ["variant", "N", "status", "perplexity", "exact", "ratio", "final rel. error", "final cosine"]
    headers += (["forward speedup [95% CI]"] if timed else []) + (["worst single layer"] if len(single) else [])
    headers.append("notes")
    rows = []
    for final in final_rows(frame).itertuples():
        row = [final.label, str(final.seq_len), final.status]
        if final.status != "ok":
            rows.append(row + [""] * (len(headers) - 4) + [final.reason])
            continue
        row += [
            format_number(final.perplexity, ".4g"),
            format_number(final.perplexity_exact, ".4g"),
            format_number(final.perplexity_ratio, ".3f") + ("×" if pd.notna(final.perplexity_ratio) else ""),
            format_number(final.rel_error, ".3g"),
            format_number(final.cosine, ".4f"),
        ]
        if timed:
            row.append(speedup_text(pd.Series(final._asdict())))
        if len(single):
            layers = single[(single.label == final.label) & (single.seq_len == final.seq_len)]
            worst = layers.loc[layers.rel_error.idxmax()] if len(layers) else None
            row.append(f"layer {worst.layer}: {worst.rel_error:.3g}" if worst is not None else "–")
        rows.append(row + [""])
    return headers, rows


def excess_cells(finals: pd.DataFrame) -> pd.DataFrame:
    """The ok final rows whose perplexity differs from the exact model's by more than float rounding, with their
    excess `perplexity_ratio - 1` (0.03: 3% higher; what a log axis can show across 1.001× to 200×)."""
    ok = finals[(finals.status == "ok") & finals.perplexity_ratio.notna()]
    return ok.assign(excess=ok.perplexity_ratio - 1)[lambda f: f.excess >= RATIO_RESOLUTION]


def excess_title(cells: pd.DataFrame) -> str:
    """The headline of the perplexity plot: at the longest length, the variant adding least to the exact model's
    perplexity and the one adding most."""
    longest = cells[cells.seq_len == cells.seq_len.max()].sort_values("excess")
    best, worst = longest.iloc[0], longest.iloc[-1]
    title = f"At {best.seq_len} tokens, {best.label} adds least to the exact model's perplexity ({_excess(best)})"
    if len(longest) > 1:
        title += f"; {worst.label} adds most ({_excess(worst)})"
    return title


def _excess(row: pd.Series) -> str:
    """'+3.1%' under double, '224×' from there on."""
    return f"+{100 * row.excess:.2g}%" if row.perplexity_ratio < 2 else f"{row.perplexity_ratio:.3g}×"


def exact_trend(finals: pd.DataFrame) -> str:
    """The exact model's perplexity at the shortest and the longest length, in words."""
    exact = finals.dropna(subset=["perplexity_exact"]).drop_duplicates("seq_len").sort_values("seq_len")
    if len(exact) < 2:
        return ""
    first, last = exact.iloc[0], exact.iloc[-1]
    return (f" The exact model's own perplexity goes from {first.perplexity_exact:.4g} at {first.seq_len} tokens to "
            f"{last.perplexity_exact:.4g} at {last.seq_len}.")  # fmt: skip


def check_text(raw: dict) -> str:
    """What the native and head checks found, in a sentence."""
    native = raw.get("native_check") or {}
    parts = [
        f"at {n} tokens, {format_number(c.get('output_difference'), '.1e')} in its logits and "
        f"{format_number(c.get('perplexity_difference'), '.1e')} in its perplexity"
        for n, c in native.items()
    ]
    layers = ("every global layer (its own window, exact, in each sliding-window layer)"
              if (raw.get("model") or {}).get("layout") else "every layer")
    text = (
        f"The exact model runs PyTorch SDPA in {layers} through the same attention implementation; against the "
        f"model's own SDPA attention it differs (relative) {'; '.join(parts) or 'by –'}."
    )
    head = raw.get("head_check")
    if head:
        text += (
            f" Logits are projected a slice of positions at a time, never whole; on the first {head['tokens']} "
            "tokens they differ from transformers' complete forward pass by "
            f"{format_number(head['logits_difference'], '.1e')} and the loss from transformers' own by "
            f"{format_number(head.get('loss_difference'), '.1e')} (relative)."
        )
    return text


def swapped_layers(model: dict) -> str:
    """Where the run put each variant, as the report says it: every self-attention layer, or (a hybrid model: its
    layout in meta.json) every global one, the sliding-window layers keeping their own window."""
    return "every global self-attention layer" if model.get("layout") else "every self-attention layer"


def write_model_report(run_dir: Path) -> Path:
    """report.md, report.html and plots/ of a model run folder; returns the path of report.html."""
    frame = read_model_rows(run_dir)
    meta = RunMeta.read(run_dir)
    style = styles(list(dict.fromkeys(frame.label)))
    model, raw = meta.model, meta.raw
    lengths = sorted(frame.seq_len.unique())
    longest = lengths[-1]
    subtitle = f"{model.get('dir', '')}, {raw.get('text_source')}"
    layout, where = model.get("layout"), swapped_layers(model)
    blocks = [
        Block("heading", f"attnbench model report: {run_dir.name}", level=1),
        Block("text", f"Reproduce: `{shlex.join(meta.command)}`."),
        Block(
            "text",
            f"Model: `{model.get('dir')}` ({model.get('type')}, {model.get('kind')}, "
            f"{'causal' if model.get('causal') else 'bidirectional'}; "
            f"{layout or str(model.get('layers')) + ' self-attention layers'}); the first "
            f"{', '.join(map(str, lengths))} tokens of {raw.get('text_source')}"
            f"{', each length with its own exact model' if len(lengths) > 1 else ''}. {check_text(raw)}",
        ),
        Block("heading", "Verdict", level=2),
        Block(
            "text",
            f"{where[0].upper()}{where[1:]} swapped"
            + (" (the sliding-window layers keep their own window, exact, as the model does)" if layout else "")
            + ": the perplexity on the text with the variant, the exact model's, and their ratio; the final "
            "output's (logits') relative error and cosine against the exact model."
            + (" The forward pass timed in turns with the exact one." if raw.get("timed") else "")
            + (f" 'Worst single layer': the largest attention-output error when that {'global ' if layout else ''}"
               "layer alone is swapped."
               if raw.get("per_layer") else "")  # fmt: skip
            + " Single-layer swaps (--per-layer) and timing (--time) are optional"
            + (": this run has neither." if not (raw.get("timed") or raw.get("per_layer")) else "."),
        ),
    ]
    headers, rows = summary_rows(frame)
    blocks.append(Block("table", headers=headers, rows=rows))
    plots = run_dir / "plots"
    finals = final_rows(frame)
    cells = excess_cells(finals)
    if len(lengths) > 1 and len(cells):
        path = plot_versus_n(cells, "excess", "perplexity ratio − 1 vs exact", excess_title(cells), subtitle,
                             plots / "perplexity-vs-n.png", style)  # fmt: skip
        blocks.append(
            Block(
                "image",
                str(path.relative_to(run_dir)),
                caption=f"How much each variant in {where} raises perplexity on the first N tokens of the text, "
                "over the exact model's at the same N: the ratio minus one (0.03: 3% higher; 100: 101×), against N, "
                "log-log. Variants within float rounding of the exact perplexity are left out."
                + exact_trend(finals),
            )
        )
    ok = frame[(frame.status == "ok") & (frame.seq_len == longest)]
    at_longest = ok[ok.layer == "final"].sort_values("rel_error")
    approximate = at_longest[at_longest.rel_error >= 1e-4]
    if len(approximate):
        best, worst = approximate.iloc[0], approximate.iloc[-1]
        title = f"{best.label} stays closest to the exact model (final error {best.rel_error:.2g})"
        if len(approximate) > 1:
            title += f"; {worst.label} drifts furthest ({worst.rel_error:.2g})"
        path = plot_layer_errors(ok, title, f"{subtitle}, {longest} tokens", plots / "layers.png", style)
        caption = f"The hidden state after each layer with {where} swapped"
        if raw.get("per_layer"):
            caption = (f"Left: {caption[0].lower()}{caption[1:]}. Right: each {'global ' if layout else ''}layer's "
                       "attention output when only that layer is swapped (its input exact)")  # fmt: skip
        caption += f", at {longest} tokens. Variants exact to float rounding are left out."
        blocks.append(Block("image", str(path.relative_to(run_dir)), caption=caption))
        timed = approximate[approximate.loss_change.notna() & approximate.speedup.notna()]
        if len(timed):
            least = timed.loc[timed.loss_change.abs().idxmin()]
            path = plot_loss_vs_speedup(
                timed,
                f"{least.label} moves the loss least ({least.loss_change:+.3g} nats per token) at "
                f"{ratio_text(least.speedup, '.2g')} the exact model's speed",
                f"{subtitle}, {longest} tokens",
                plots / "loss-vs-speedup.png",
                style,
            )
            blocks.append(
                Block(
                    "image",
                    str(path.relative_to(run_dir)),
                    caption=f"Each variant swapped into {where}, at {longest} tokens: forward speedup (95% "
                    "interval) and the loss change on the text.",
                )
            )
    blocks.append(Block("heading", "Every row", level=2))
    detail = frame[["label", "seq_len", "swap", "layer", "status", "rel_error", "cosine", "loss_change", "speedup"]]
    blocks.append(
        Block(
            "table",
            headers=["label", "N", *detail.columns[2:]],
            rows=[[format_number(v, ".4g") if isinstance(v, float) else str(v) for v in r] for r in detail.values],
        )
    )
    blocks.append(
        Block(
            "text",
            "What this cannot see: one text; no training or fine-tuning (a variant a model was trained with may do "
            "far better than one swapped in afterwards); float32 on the CPU; cross-attention and cached decoding "
            "stay exact.",
        )
    )
    write_text_atomic(run_dir / "report.md", render_markdown(blocks))  # whole or the old one: a full disk
    write_text_atomic(run_dir / "report.html", render_html(blocks, run_dir))
    return run_dir / "report.html"
