"""The report of an MQAR grid (`attnbench recall`): the verdict first (per N, which mixers recall at least R of the
queries at every number of pairs tried, smallest state first), the two sanity checks, the accuracy and training-time
tables (mean over seeds with a 95% Student-t interval), and the plots. Reads trainings.csv only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnbench.report.document import Block, render_html, render_markdown
from attnbench.report.mqar_plots import plot_accuracy_versus, plot_accuracy_versus_state
from attnbench.report.plots import styles
from attnbench.report.text import aligned_table, format_percent, recall_text
from attnbench.stats import mean_interval

DEFAULT_MIN_RECALL = 0.9  # the verdict's bar: "recall >= 90% at my N"
SOLVED = 0.99  # full attention must reach this on the easy setting, every seed (Zoology: attention solves MQAR)
CHANCE_SLACK = 0.02  # the blind mixer must stay within chance (a guess + what its convolutions reach) + this
BASELINE = "full"
BLIND = "blind"


def summarize(trainings: pd.DataFrame) -> pd.DataFrame:
    """One row per (label, N, pairs): seeds, mean accuracy with its interval, min, median train seconds, state."""
    ok = trainings[trainings.status == "ok"]
    rows = []
    for (label, n, pairs), at in ok.groupby(["label", "seq_len", "pairs"], sort=False):
        interval = mean_interval(list(at.accuracy), 0.0, 1.0)
        rows.append(
            dict(
                label=label, seq_len=int(n), pairs=int(pairs), seeds=len(at), mean_accuracy=interval.estimate,
                low=interval.low if interval.low == interval.low else interval.estimate,
                high=interval.high if interval.high == interval.high else interval.estimate,
                least=at.accuracy.min(), train_seconds=at.train_seconds.median(), steps=at.steps.median(),
                state_bytes=at.state_bytes.iloc[0] if at.state_bytes.notna().any() else float("nan"),
            )
        )  # fmt: skip
    return pd.DataFrame(rows)


def accuracy_text(row: pd.Series) -> str:
    """'97% [93–100]' (mean over seeds, 95% interval), or '97%' from one seed."""
    if row.seeds < 2:
        return recall_text(row.mean_accuracy)
    return f"{recall_text(row.mean_accuracy)} [{_points(row.low)}–{_points(row.high)}]"


def _points(share: float) -> str:
    """An interval end in percent, as precise as the mean beside it (recall_text without its sign)."""
    return recall_text(share).removesuffix("%")


@dataclass(frozen=True)
class Sanity:
    """A built-in check of the grid: what it asks, whether it holds, and the figures."""

    what: str
    holds: bool | None  # None: the grid has nothing to check it on
    figures: str


def sanity(trainings: pd.DataFrame) -> list[Sanity]:
    """Full attention solves the easy setting (the smallest N and fewest pairs) on every seed; the blind mixer stays
    near chance (each training's `chance`: 1 / the number of value tokens of its task)."""
    ok = trainings[trainings.status == "ok"]
    out = []
    if len(ok):
        n, pairs = ok.seq_len.min(), ok[ok.seq_len == ok.seq_len.min()].pairs.min()
        easy = ok[(ok.seq_len == n) & (ok.pairs == pairs) & (ok.label == BASELINE)]
        what = f"{BASELINE} reaches ≥ {SOLVED:.0%} on the easy setting (N={n}, {pairs} pairs) on every seed"
        if easy.empty:
            out.append(Sanity(what, None, f"no {BASELINE} training at that setting"))
        else:
            seeds = ", ".join(recall_text(a) for a in easy.accuracy)
            out.append(Sanity(what, bool((easy.accuracy >= SOLVED).all()), f"seeds: {seeds}"))
    blind = ok[ok.label == BLIND]
    what = (f"{BLIND} (sees no other position) stays within {100 * CHANCE_SLACK:.0f} points of chance (a guess "
            "among the values, plus the queries its convolutions reach)")  # fmt: skip
    if blind.empty:
        out.append(Sanity(what, None, f"no {BLIND} training in this grid"))
    else:
        worst = blind.loc[(blind.accuracy - blind.chance).idxmax()]
        figures = f"worst {recall_text(worst.accuracy)} against chance {recall_text(worst.chance)} over {len(blind)} trainings"
        out.append(Sanity(what, bool((blind.accuracy <= blind.chance + CHANCE_SLACK).all()), figures))
    return out


def verdict_lines(summary: pd.DataFrame, min_recall: float) -> list[str]:
    """Per N: the mixers whose mean accuracy is at least `min_recall` at every number of pairs tried, smallest state
    first, and the rest with their worst setting."""
    lines = []
    for n, at_n in summary.groupby("seq_len"):
        tried = set(at_n.pairs)
        incomplete = {label for label, rows in at_n.groupby("label") if set(rows.pairs) != tried}  # a setting failed
        worst = at_n.loc[at_n.groupby("label").mean_accuracy.idxmin()].set_index("label")
        worst = worst.assign(mean_accuracy=[-1.0 if label in incomplete else v for label, v in worst.mean_accuracy.items()])
        passing = worst[(worst.mean_accuracy >= min_recall) & (worst.index != BLIND)]
        failing = worst[(worst.mean_accuracy < min_recall) & (worst.index != BLIND)]
        pairs = f"{at_n.pairs.min()}–{at_n.pairs.max()}" if at_n.pairs.nunique() > 1 else f"{at_n.pairs.iloc[0]}"
        order = passing.assign(state=passing.state_bytes.fillna(float("inf"))).sort_values("state")
        named = ", ".join(f"{label} ({_state(row.state_bytes)})" for label, row in order.iterrows()) or "none"
        text = f"**N={n}** ({pairs} pairs): recall ≥ {format_percent(min_recall)} at every number of pairs: {named}."
        if len(failing):
            text += " Below: " + "; ".join(
                f"{label} (not every number of pairs ran ok)" if label in incomplete else
                f"{label} ({recall_text(row.mean_accuracy)} at {row.pairs:.0f} pairs)"
                for label, row in failing.sort_values("mean_accuracy", ascending=False).iterrows()
            ) + "."  # fmt: skip
        lines.append(text)
    return lines


def _state(nbytes: float) -> str:
    """'state 16 KiB' (what the mixers keep to decode a prompt of N), or 'no decode state' when unknown."""
    return "no decode state" if nbytes != nbytes else f"state {nbytes / 1024:,.3g} KiB"


def pivot_text(summary: pd.DataFrame, value: str) -> tuple[list[str], list[list[str]]]:
    """label × (N, pairs) table of `value` ('accuracy' or 'seconds')."""
    columns = sorted({(r.seq_len, r.pairs) for r in summary.itertuples()})
    labels = list(dict.fromkeys(summary.label))
    by = summary.set_index(["label", "seq_len", "pairs"])
    rows = []
    for label in labels:
        row = [label]
        for n, p in columns:
            if (label, n, p) not in by.index:
                row.append("")
                continue
            r = by.loc[(label, n, p)]
            row.append(accuracy_text(r) if value == "accuracy" else f"{r.train_seconds:.1f} s ({r.steps:.0f})")
        rows.append(row)
    return ["variant"] + [f"N={n}, P={p}" for n, p in columns], rows


def mqar_blocks(folder: Path, trainings: pd.DataFrame, meta: dict, min_recall: float) -> list[Block]:
    """The report's blocks; its plots written to folder/plots."""
    grid = meta.get("grid", {})
    summary = summarize(trainings)
    blocks = [Block("heading", f"MQAR grid: {grid.get('name', folder.name)}", level=1)]
    command = " ".join(meta.get("command", []))
    settings = ", ".join(f"{k} {v}" for k, v in grid.items() if k != "name") or "the training defaults"
    blocks.append(Block("text", f"Made by `{command}` on {meta.get('host', '?')}; {len(trainings)} trainings; "
                                f"{settings} (the rest as `TrainSpec`'s defaults: d_model 64, vocab 4 N, up to 800 "
                                "steps, 1000 test examples)."))  # fmt: skip
    if meta.get("left_out"):
        blocks.append(Block("text", "Left out (the task cannot hold them): " + "; ".join(meta["left_out"]) + "."))
    blocks.append(Block("heading", "Verdict", level=2))
    blocks.append(Block("text", (
        "Multi-query associative recall (Zoology's MQAR): each model (2 layers, a short convolution and the variant as "
        "its sequence mixer) is trained on the task, then scored on held-out examples: the share of queries whose value "
        f"it predicts. Per N, the mixers at or above {format_percent(min_recall)} mean accuracy at every number of "
        f"pairs tried (`--min-recall {min_recall:g}`), the smallest decode state first."
    )))  # fmt: skip
    blocks += [Block("text", line) for line in verdict_lines(summary, min_recall)] if len(summary) else []
    blocks.append(Block("heading", "Sanity checks", level=2))
    rows = [[s.what, {True: "holds", False: "FAILS", None: "not checked"}[s.holds], s.figures]
            for s in sanity(trainings)]  # fmt: skip
    blocks.append(Block("table", headers=["check", "outcome", "figures"], rows=rows))
    if len(summary):
        headers, rows = pivot_text(summary, "accuracy")
        blocks.append(Block("table", headers=headers, rows=rows, caption=(
            "Test accuracy: mean over seeds [95% Student-t interval], by N and pairs P."
        )))  # fmt: skip
        headers, rows = pivot_text(summary, "seconds")
        blocks.append(Block("table", headers=headers, rows=rows, caption=(
            "Training time per model (median over seeds) and the optimiser steps taken (training stops early once "
            "the last batches are recalled)."
        )))  # fmt: skip
        blocks += plot_blocks(folder, summary, grid)
    failed = trainings[trainings.status != "ok"]
    if len(failed):
        rows = [[r.label, str(r.seq_len), str(r.pairs), str(r.seed), r.reason] for r in failed.itertuples()]
        blocks.append(Block("table", headers=["variant", "N", "pairs", "seed", "reason"], rows=rows,
                            caption="Trainings that failed (the rest of the grid went on)."))  # fmt: skip
    return blocks


def plot_blocks(folder: Path, summary: pd.DataFrame, grid: dict) -> list[Block]:
    style = styles(list(dict.fromkeys(summary.label)))
    subtitle = f"MQAR, d_model {grid.get('d_model', 64)}, vocab {grid.get('vocab', '4 N')}; mean over seeds, 95% interval"
    plots = folder / "plots"
    made = []
    if summary.pairs.nunique() > 1:
        path = plot_accuracy_versus(summary, "pairs", "Recall as the pairs to remember grow", subtitle,
                                    plots / "mqar-accuracy-vs-pairs.png", style)  # fmt: skip
        made.append((path, "Accuracy against the number of key–value pairs, one panel per N."))
    if summary.seq_len.nunique() > 1:
        path = plot_accuracy_versus(summary, "seq_len", "Recall as the sequence grows", subtitle,
                                    plots / "mqar-accuracy-vs-n.png", style)  # fmt: skip
        made.append((path, "Accuracy against N, one panel per number of pairs."))
    if (summary.state_bytes > 0).any():
        path = plot_accuracy_versus_state(summary, "Recall against the state a mixer keeps (Zoology's figure)",
                                          subtitle, plots / "mqar-accuracy-vs-state.png", style)  # fmt: skip
        made.append((path, "Accuracy against the bytes the mixers keep to decode (a KV cache grows with N; a "
                           "recurrent state does not), one panel per number of pairs."))  # fmt: skip
    return [Block("image", str(path.relative_to(folder)), caption=caption) for path, caption in made]


def write_mqar_report(folder: Path, trainings: pd.DataFrame, meta: dict, min_recall: float) -> Path:
    """report.md and report.html of the grid's folder (written whole each time: a resumed grid rewrites them)."""
    from attnbench.atomic import write_text_atomic

    blocks = mqar_blocks(folder, trainings, meta, min_recall)
    write_text_atomic(folder / "report.md", render_markdown(blocks))
    write_text_atomic(folder / "report.html", render_html(blocks, folder))
    return folder / "report.md"


def terminal_summary(trainings: pd.DataFrame, min_recall: float, width: int) -> str:
    """What the command prints at the end: the verdict lines and the accuracy table, cut to the terminal."""
    summary = summarize(trainings)
    if summary.empty:
        return "no training finished"
    lines = [line.replace("**", "") for line in verdict_lines(summary, min_recall)]
    headers, rows = pivot_text(summary, "accuracy")
    return "\n".join(lines) + "\n\n" + aligned_table(headers, rows, width=width)
