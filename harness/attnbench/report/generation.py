"""The report of a generation grid (`attnbench generate`): what the real model answers while generating with each
method, against the share of the cache kept (kvpress's figure), its continuation quality, and what each method
keeps, reads and costs per token inside the model.

Per N, task and protocol: the exact model's own accuracy first; a task it answers below EXACT_FLOOR at that N is
marked beyond the model and left out of the verdict. A method's accuracy is the mean RULER score over the samples,
with its 95% Student-t interval (clipped to [0, 1]); continuation quality is the geometric mean over samples of the
perplexity ratio against the exact model's on the same tokens. The verdict, per N and share kept: the methods by
their needle accuracy over the tasks within the model, the exact model's beside them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from attnbench.report.document import Block, render_html, render_markdown
from attnbench.report.text import aligned_table, recall_text, share_text
from attnbench.stats import mean_interval

EXACT_FLOOR = 0.8  # below this the exact model itself fails the task at that N: beyond the model, no verdict on it
EXACT = "full"


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (N, task, protocol, method, share): samples, mean score with its interval, continuation ratio,
    the shares of the exact cache kept and read, attention time per token (median over samples)."""
    ok = rows[rows.status == "ok"].copy()
    ok["share_key"] = ok.share.fillna(-1.0)
    out = []
    keys = ["seq_len", "task", "protocol", "method", "share_key"]
    for (n, task, protocol, method, share), at in ok.groupby(keys, sort=False):
        scores = at.score.dropna().tolist()
        interval = mean_interval(scores, 0.0, 1.0) if scores else None
        ratios = at.ppl_ratio.dropna().tolist()
        out.append(dict(
            seq_len=int(n), task=task, protocol=protocol, method=method, share=None if share < 0 else float(share),
            samples=len(at), accuracy=interval.estimate if interval else math.nan,
            low=interval.low if interval and interval.low == interval.low else (interval.estimate if interval else math.nan),
            high=interval.high if interval and interval.high == interval.high else (interval.estimate if interval else math.nan),
            ppl_ratio=math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else math.nan,
            cache_share=at.cache_share.mean(), read_share=at.read_share.mean(), attention_s=at.attention_s.median(),
            exact_method=bool((at.variant == EXACT).all() and at.dense_layers.fillna(0).eq(0).all()
                              and at.method.eq(EXACT).all()),
        ))  # fmt: skip
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


SUMMARY_COLUMNS = ["seq_len", "task", "protocol", "method", "share", "samples", "accuracy", "low", "high", "ppl_ratio",
                   "cache_share", "read_share", "attention_s", "exact_method"]  # fmt: skip


def n_text(n: int) -> str:
    """'N = 2,048', or the rows' own lengths of a user's task (N 0)."""
    return f"N = {n:,}" if n else "the rows' own lengths"


def exact_accuracy(summary: pd.DataFrame) -> dict[tuple[int, str, str], float]:
    """(N, task, protocol) -> the exact model's mean score."""
    exact = summary[summary.exact_method & summary.accuracy.notna()]
    return {(r.seq_len, r.task, r.protocol): r.accuracy for r in exact.itertuples()}


def within_model(summary: pd.DataFrame) -> pd.DataFrame:
    """The needle rows whose task the exact model answers at EXACT_FLOOR or above at that N (the verdict's rows)."""
    exact = exact_accuracy(summary)
    keep = [exact.get((r.seq_len, r.task, r.protocol), 0.0) >= EXACT_FLOOR for r in summary.itertuples()]
    return summary[pd.Series(keep, index=summary.index, dtype=bool) & summary.accuracy.notna()]


def pooled(rows: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Per (N, protocol, method, share): the mean score over every sample of the needle tasks within the model, its
    95% interval over those samples, and the state's share of the cache (what the verdict and the plot show)."""
    judged = within_model(summary)
    tasks = set(zip(judged.seq_len, judged.task, judged.protocol))
    ok = rows[(rows.status == "ok") & rows.score.notna()]
    judged_rows = pd.Series([key in tasks for key in zip(ok.seq_len, ok.task, ok.protocol)], index=ok.index, dtype=bool)
    ok = ok[judged_rows].assign(share_key=lambda f: f.share.fillna(-1.0))
    out = []
    for (n, protocol, method, share), at in ok.groupby(["seq_len", "protocol", "method", "share_key"], sort=False):
        interval = mean_interval(at.score.tolist(), 0.0, 1.0)
        ends = (interval.low, interval.high) if interval.low == interval.low else (interval.estimate,) * 2
        out.append(dict(seq_len=int(n), protocol=protocol, method=method, share=None if share < 0 else float(share),
                        samples=len(at), accuracy=interval.estimate, low=ends[0], high=ends[1],
                        cache_share=at.cache_share.mean(), exact_method=method == EXACT,
                        exact_decoding=bool((at.decode == "exact").any())))  # fmt: skip
    return pd.DataFrame(out, columns=POOLED_COLUMNS)


POOLED_COLUMNS = ["seq_len", "protocol", "method", "share", "samples", "accuracy", "low", "high", "cache_share",
                  "exact_method", "exact_decoding"]  # fmt: skip


def accuracy_text(row: object) -> str:
    """'70% [52–88]', or '70%' from one sample."""
    estimate, low, high = row.accuracy, row.low, row.high  # type: ignore[attr-defined]
    if row.samples < 2 or low == high:  # type: ignore[attr-defined]
        return recall_text(estimate)
    return f"{recall_text(estimate)} [{recall_text(low).removesuffix('%')}–{recall_text(high).removesuffix('%')}]"


def verdict_lines(rows: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """Per N and protocol: the exact model's accuracy, the tasks beyond it, and per share kept the methods by their mean
    accuracy over the samples of the tasks within the model, with its 95% interval (fixed states at their own share)."""
    lines = []
    exact = exact_accuracy(summary)
    overall = pooled(rows, summary)
    for (n, protocol), at_n in summary[summary.accuracy.notna()].groupby(["seq_len", "protocol"], sort=True):
        tasks = sorted(set(at_n.task))
        beyond = [t for t in tasks if exact.get((n, t, protocol), 0.0) < EXACT_FLOOR]
        exact_words = ", ".join(f"{t} {recall_text(exact[(n, t, protocol)])}" for t in tasks if (n, t, protocol) in exact)
        line = f"**At {n_text(n)} ({protocol})**: the exact model answers {exact_words}."
        if beyond:
            line += f" Beyond the model at this N (below {EXACT_FLOOR:.0%} exact, no verdict on them): {', '.join(beyond)}."
        lines.append(line)
        chosen = overall[(overall.seq_len == n) & (overall.protocol == protocol) & ~overall.exact_method] if len(overall) else overall
        if chosen.empty:
            lines.append("No task within the model at this N: nothing to judge.")
            continue
        for share in sorted(set(chosen.share.dropna()), reverse=True):
            ranked = chosen[chosen.share == share].sort_values("accuracy", ascending=False)
            words = ", ".join(f"{r.method} {accuracy_text(r)}" for r in ranked.itertuples())
            lines.append(f"- keeping {share_text(share)} of the cache: {words}")
        fixed = chosen[chosen.share.isna()].sort_values("accuracy", ascending=False)
        kinds = (("a fixed state (swapped untrained into a softmax model)", ~fixed.exact_decoding),
                 ("its own prefill, then exact decoding of the whole cache", fixed.exact_decoding))  # fmt: skip
        for words_for, which in kinds:
            if which.any():
                words = ", ".join(f"{r.method} {accuracy_text(r)} (its state {r.cache_share:.1%} of the cache)"
                                  for r in fixed[which].itertuples())  # fmt: skip
                lines.append(f"- {words_for}: {words}")
    return lines


def accuracy_table(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Rows: method and share; columns: (N, task, protocol) accuracies; the exact model first."""
    scored = summary[summary.accuracy.notna()]
    columns = list(dict.fromkeys(zip(scored.seq_len, scored.task, scored.protocol)))
    exact = exact_accuracy(summary)
    headers = ["method", "kept"] + [f"{task} {n_text(n).replace(' = ', '=')}" + ("" if p == "question-agnostic" else " (aware)")
                                     + ("" if exact.get((n, task, p), 0) >= EXACT_FLOOR else " †")
                                     for n, task, p in columns]  # fmt: skip
    rows = []
    for (method, share), at in scored.groupby(["method", scored.share.fillna(-1.0)], sort=False):
        cells = {(r.seq_len, r.task, r.protocol): accuracy_text(r) for r in at.itertuples()}
        rows.append([method, share_text(None if share < 0 else share)] + [cells.get(c, "–") for c in columns])
    return headers, rows


def cost_table(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Per method and share: cache held and read as shares of the exact model's, attention time per token, and the
    continuation's perplexity against the exact model's, at each N."""
    headers = ["method", "kept", "N", "cache held", "a step reads", "attention / token", "continuation ppl ×exact"]
    rows = []
    for (method, share, n), at in summary.groupby(["method", summary.share.fillna(-1.0), "seq_len"], sort=False):
        ratio = at.ppl_ratio.dropna()
        rows.append([
            method, share_text(None if share < 0 else share), f"{n:,}" if n else "own", f"{at.cache_share.mean():.1%}",
            f"{at.read_share.mean():.1%}", f"{1e3 * at.attention_s.median():.1f} ms",
            f"{ratio.iloc[0]:.3f}" if len(ratio) else "–",
        ])  # fmt: skip
    return headers, rows


def generation_blocks(folder: Path, rows: pd.DataFrame, meta: dict, missing: int = 0, reads: bool = False) -> list[Block]:
    from attnbench.report.generation_plots import plot_accuracy_vs_kept

    summary = summarize(rows)
    blocks = [Block("heading", f"Generation grid: {meta.get('grid', folder.name)}", level=1)]
    blocks.append(Block("text", (
        f"Made by `{' '.join(meta.get('command', []))}` on {meta.get('host', '?')} with the model in "
        f"`{meta.get('model_dir', '?')}`; {len(rows)} generations. The model generates greedily with each method inside "
        "every self-attention layer (its own post-rotary q/k/v, its key/value heads); a KV-cache method builds its "
        "cache from the exact prompt (kvpress's protocol), a method with its own prefill runs it. Question-agnostic: "
        "the context is compressed, then the question follows; question-aware: the question is inside the prompt."
    )))  # fmt: skip
    if missing:
        blocks.append(Block("text", f"**Unfinished**: {missing} unit(s) of the grid have no rows yet; "
                                    f"`attnbench generate --resume {folder}` runs them."))  # fmt: skip
    blocks.append(Block("heading", "Verdict", level=2))
    blocks += [Block("text", line) for line in verdict_lines(rows, summary)] or [Block("text", "No needle task finished.")]
    if len(summary):
        tasks = sorted(set(within_model(summary).task))
        plots = plot_accuracy_vs_kept(pooled(rows, summary), summary, tasks, folder / "plots", reads)
        blocks += [Block("image", str(path.relative_to(folder)), caption=caption) for path, caption in plots]
        headers, table = accuracy_table(summary)
        blocks.append(Block("table", headers=headers, rows=table, caption=(
            "Accuracy (RULER's string match): mean over samples [95% Student-t interval]. † the exact model answers "
            f"below {EXACT_FLOOR:.0%} there: beyond the model, left out of the verdict."
        )))  # fmt: skip
        headers, table = cost_table(summary)
        blocks.append(Block("table", headers=headers, rows=table, caption=(
            "What each method keeps and reads, as shares of the exact model's KV cache after the prompt (every layer; "
            "the cache's room for the generated tokens included), its median time inside attention per token (every "
            "layer, this machine), and the continuation's perplexity against the exact model's on the same tokens "
            "(geometric mean over samples)."
        )))  # fmt: skip
    failed = rows[rows.status != "ok"]
    if len(failed):
        table = [[r.task, str(r.seq_len), str(r.sample), r.method, share_text(r.share), r.reason] for r in failed.itertuples()]
        blocks.append(Block("table", headers=["task", "N", "sample", "method", "kept", "reason"], rows=table,
                            caption="Generations that failed (the rest of the grid went on)."))  # fmt: skip
    return blocks


def write_generation_report(folder: Path, rows: pd.DataFrame, meta: dict, missing: int = 0,
                            reads: bool = False) -> Path:  # fmt: skip
    """report.md and report.html of the grid's folder (written whole each time: a resumed grid rewrites them);
    `missing`: units of the grid not run yet, said at the top; `reads`: a method whose share is what a step reads,
    not what it keeps (Quest), is among the rows."""
    from attnbench.atomic import write_text_atomic

    blocks = generation_blocks(folder, rows, meta, missing, reads)
    write_text_atomic(folder / "report.md", render_markdown(blocks))
    write_text_atomic(folder / "report.html", render_html(blocks, folder))
    return folder / "report.md"


def terminal_summary(rows: pd.DataFrame, width: int) -> str:
    """What the command prints at the end: the verdict lines and the accuracy table, cut to the terminal."""
    summary = summarize(rows)
    if summary.empty:
        return "no generation finished"
    lines = [line.replace("**", "") for line in verdict_lines(rows, summary)]
    headers, table = accuracy_table(summary)
    return "\n".join(lines) + "\n\n" + aligned_table(headers, table, width=width)

