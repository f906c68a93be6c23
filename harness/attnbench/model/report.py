"""The report of an `attnbench model` run: a summary table per variant, error by layer, loss change vs speedup."""

from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd

from attnbench.atomic import write_text_atomic
from attnbench.report.document import Block, render_html, render_markdown
from attnbench.report.plots import plot_layer_errors, plot_loss_vs_speedup, styles
from attnbench.report.text import format_number, speedup_text
from attnbench.runfolder.meta import RunMeta


def read_model_rows(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "model.csv", dtype={"label": str, "layer": str, "reason": str}).fillna({"reason": ""})


def summary_rows(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """One row per variant setting: the final output's error, the loss change and the end-to-end speedup."""
    headers = [
        "variant",
        "status",
        "final rel. error",
        "final cosine",
        "loss change (ppl ×)",
        "forward speedup [95% CI]",
        "worst single layer",
        "notes",
    ]
    rows = []
    for label, rows_of in frame.groupby("label", sort=False):
        final = rows_of[(rows_of.swap == "all") & (rows_of.layer == "final")].iloc[0]
        if final.status != "ok":
            rows.append([label, final.status, "", "", "", "", "", final.reason])
            continue
        single = rows_of[(rows_of.swap == "single") & rows_of.rel_error.notna()]
        worst = single.loc[single.rel_error.idxmax()] if len(single) else None
        loss = f"{final.loss_change:+.4f} ({final.perplexity_ratio:.3f}×)" if pd.notna(final.loss_change) else "–"
        rows.append(
            [
                label,
                "ok",
                format_number(final.rel_error, ".3g"),
                format_number(final.cosine, ".4f"),
                loss,
                speedup_text(final),
                f"layer {worst.layer}: {worst.rel_error:.3g}" if worst is not None else "–",
                "",
            ]
        )
    return headers, rows


def write_model_report(run_dir: Path) -> Path:
    """report.md, report.html and plots/ of a model run folder; returns the path of report.html."""
    frame = read_model_rows(run_dir)
    meta = RunMeta.read(run_dir)
    style = styles(list(dict.fromkeys(frame.label)))
    model, raw = meta.model, meta.raw
    blocks = [
        Block("heading", f"attnbench model report: {run_dir.name}", level=1),
        Block("text", f"Reproduce: `{shlex.join(meta.command)}`."),
        Block(
            "text",
            f"Model: `{model.get('dir')}` ({model.get('type')}, {model.get('kind')}, {model.get('layers')} "
            f"self-attention layers, {'causal' if model.get('causal') else 'bidirectional'}); "
            f"{raw.get('tokens')} tokens from {raw.get('text_source')}. The exact model runs PyTorch SDPA in every "
            f"layer through the same attention implementation (its final output differs from the model's own "
            f"SDPA by {format_number(raw.get('native_check'), '.1e')}, relative).",
        ),
        Block("heading", "Verdict", level=2),
        Block(
            "text",
            "Every self-attention layer swapped: the final output's relative error and cosine against the exact "
            "model, the change in loss on the text (nats per token; the perplexity ratio), and the forward pass "
            "timed in turns with the exact one. 'Worst single layer': the largest attention-output error when "
            "that layer alone is swapped.",
        ),
    ]
    headers, rows = summary_rows(frame)
    blocks.append(Block("table", headers=headers, rows=rows))
    plots = run_dir / "plots"
    ok = frame[frame.status == "ok"]
    finals = ok[ok.layer == "final"].sort_values("rel_error")
    approximate = finals[finals.rel_error >= 1e-4]
    if len(approximate):
        best, worst = approximate.iloc[0], approximate.iloc[-1]
        title = f"{best.label} stays closest to the exact model (final error {best.rel_error:.2g})"
        if len(approximate) > 1:
            title += f"; {worst.label} drifts furthest ({worst.rel_error:.2g})"
        path = plot_layer_errors(
            ok, title, f"{model.get('dir', '')}, {raw.get('tokens')} tokens", plots / "layers.png", style
        )
        blocks.append(
            Block(
                "image",
                str(path.relative_to(run_dir)),
                caption="Left: the hidden state after each layer with every layer swapped. Right: each layer's "
                "attention output when only that layer is swapped (its input exact). Variants exact to float "
                "rounding are left out.",
            )
        )
        finals = approximate[approximate.loss_change.notna() & approximate.speedup.notna()]
        if len(finals):
            least = finals.loc[finals.loss_change.abs().idxmin()]
            path = plot_loss_vs_speedup(
                finals,
                f"{least.label} moves the loss least ({least.loss_change:+.3g} nats per token) at "
                f"{least.speedup:.2g}× the exact model's speed",
                model.get("dir", ""),
                plots / "loss-vs-speedup.png",
                style,
            )
            blocks.append(
                Block(
                    "image",
                    str(path.relative_to(run_dir)),
                    caption="Each variant swapped into every layer: forward speedup (95% interval) "
                    "and the loss change on the text.",
                )
            )
    blocks.append(Block("heading", "Every row", level=2))
    detail = frame[["label", "swap", "layer", "status", "rel_error", "cosine", "loss_change", "speedup"]]
    blocks.append(
        Block(
            "table",
            headers=list(detail.columns),
            rows=[[format_number(v, ".4g") if isinstance(v, float) else str(v) for v in r] for r in detail.values],
        )
    )
    blocks.append(
        Block(
            "text",
            "What this cannot see: one text and one sequence length; no training or fine-tuning (a variant a "
            "model was trained with may do far better than one swapped in afterwards); float32 on the CPU; "
            "cross-attention and cached decoding stay exact.",
        )
    )
    write_text_atomic(run_dir / "report.md", render_markdown(blocks))  # whole or the old one: a full disk
    write_text_atomic(run_dir / "report.html", render_html(blocks, run_dir))
    return run_dir / "report.html"
