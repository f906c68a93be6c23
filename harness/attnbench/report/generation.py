"""The report of a generation grid (`attnbench generate`): what the real model answers while generating with each
method, placed at what the method costs (the bytes it holds per token of context, the share of the exact cache a step
reads and the share it holds), its continuation quality, and what each method holds, reads and costs per token inside
the model.

The parts: `generation_summary` (rows -> a cell per N, task, protocol, method and budget: accuracy with its Wilson 95%
interval), `generation_verdict` (the tasks within the model, the ranking by separated intervals, what the run can
resolve), `generation_cost` (held, read, attention time from the timed rows only), `generation_bytes` (the one axis
of bytes per token, each row's family), `generation_plots`, `cross_model` (beside another model's run). This module
lays them out: the header, the verdict, the plots (the headline first: accuracy against bytes held per token), the
tables; and what the command prints at the end.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnbench.report.document import Block, render_html, render_markdown
from attnbench.report.generation_bytes import bytes_caption, bytes_frame, bytes_lines, bytes_table
from attnbench.report.generation_cost import cost_caption, cost_table, costs
from attnbench.report.generation_summary import (
    EXACT, budget_rules, exact_accuracy, flagged_replies, interval_of, n_text, summarize,
)  # fmt: skip
from attnbench.report.kvpress_order import COMPACTOR_PR, LEADERBOARD, order_table
from attnbench.report.cross_model import Side, model_name
from attnbench.report.cross_model_text import cross_model_blocks
from attnbench.report.generation_verdict import (
    ABLE, BEYOND, EXACT_FLOOR, UNDECIDED, accuracy_text, and_list, pooled, ranking_text, resolution_text, standing,
    verdict_lines, within_model,
)  # fmt: skip
from attnbench.report.text import aligned_table, share_text

__all__ = [  # the names other modules import from here (the verdict's and the summary's re-exported)
    "BUDGET_RULES", "EXACT", "EXACT_FLOOR", "accuracy_table", "accuracy_text", "interval_of", "pooled", "ranking_text",
    "summarize", "terminal_summary", "verdict_lines", "write_generation_report",
]  # fmt: skip

BUDGET_RULES = {  # the grid's `budget_rule` -> what it does, said in the report's header
    "kvpress": "the context is compressed once when it ends; the question and answer are appended for every method",
    "fixed-total": "every method stays at its share throughout",
}


FLAG_ADVICE = {  # a reply flag -> what it means and what to do
    "empty": "it ended before writing anything; end each row's question with an answer_prefix, the words its "
             "answer follows (e.g. `\\nAnswer:`), so that it completes an answer",
    "cut at stop": "its answer lay past its first newline, where the stop rule ends a reply; end the question with an "
                   "answer_prefix the answer follows on the same line, or give the grid stop = \"end-of-text\"",
    "cut at budget": "it ran out of tokens short of a reference; raise max_new_tokens (the row's, or the file's "
                     "defaults line; a grid's answer_tokens caps it)",
}  # fmt: skip


def flag_lines(rows: pd.DataFrame) -> list[str]:
    """A line per task and flag: how many of the exact model's replies could not hold the answer, why, and what to
    do, so a task at zero is never silently zero."""
    return [f"**Flagged replies**: {task}: the exact model's reply is {flag} in {count} of its {total} answers "
            f"(`reply_flag` in generations.csv): {FLAG_ADVICE[flag]}." for task, flag, count, total in flagged_replies(rows)]  # fmt: skip


def accuracy_table(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Rows: method and share; columns: (N, task, protocol) accuracies; the exact model first."""
    scored = summary[summary.accuracy.notna()]
    columns = list(dict.fromkeys(zip(scored.seq_len, scored.task, scored.protocol)))
    exact = exact_accuracy(summary)
    marks = {ABLE: "", UNDECIDED: " ‡", BEYOND: " †"}
    headers = ["method", "kept"] + [f"{task} {n_text(n).replace(' = ', '=')}" + ("" if p == "question-agnostic" else " (aware)")
                                     + marks[standing(exact.get((n, task, p)))] for n, task, p in columns]  # fmt: skip
    rows = []
    for (method, share), at in scored.groupby(["method", scored.share.fillna(-1.0)], sort=False):
        cells = {(r.seq_len, r.task, r.protocol): accuracy_text(interval_of(r)) for r in at.itertuples()}
        rows.append([method, share_text(None if share < 0 else share)] + [cells.get(c, "–") for c in columns])
    return headers, rows


def rule_text(rows: pd.DataFrame) -> str:
    """The header's words on the budget rule the rows carry ('' for runs from before the column)."""
    rules = budget_rules(rows)
    if not rules:
        return ""
    words = and_list([f"`{rule}` ({BUDGET_RULES.get(rule, 'a rule this report does not know')})" for rule in rules])
    mixed = "; a method under a rule other than kvpress's is named with it" if len(rules) > 1 else ""
    return f"**Budget rule{'s' if len(rules) > 1 else ''}**: {words}{mixed}."


def metric_words(rows: pd.DataFrame) -> str:
    """The needle tasks' metric: the rows' own `metric` column where they carry it, else RULER's string match."""
    metrics = sorted(set(rows.metric.dropna().astype(str)) - {""}) if "metric" in rows else []  # "": a continuation
    return ", ".join(metrics) if metrics else "RULER's string match"


def placed(meta: dict) -> str:
    """Where the rows were generated, as meta.json records it: " (cuda, bfloat16)", or "" (a grid from before)."""
    return f" ({meta['device']}, {meta['dtype']})" if meta.get("device") and meta.get("dtype") else ""


def header_text(folder: Path, rows: pd.DataFrame, meta: dict, reads: bool) -> str:
    """The report's opening paragraph: what made the rows, and how the model generates with each method."""
    protocol = " (kvpress's protocol)" if budget_rules(rows) in ([], ["kvpress"]) else ""
    quest = " (Quest keeps every key and reads its budget)" if reads else ""
    return (
        f"Made by `{' '.join(meta.get('command', []))}` on {meta.get('host', '?')}{placed(meta)} with the model in "
        f"`{meta.get('model_dir', '?')}`; {len(rows)} generations. The model generates greedily with each method inside "
        f"every {'global ' if meta.get('layers') else ''}self-attention layer (its own post-rotary q/k/v, its key/value heads); a KV-cache method builds its "
        f"cache from the exact prompt{protocol}, a method with its own prefill runs it. Question-agnostic: "
        "the context is compressed, then the question follows; question-aware: the question is inside the prompt. "
        f"A budget is the share of the cache a method keeps{quest}; the headline figure places each at the bytes its "
        "states hold per token of context (every layer), its family named (eviction, head-wise budgets, quantized, "
        "page selection, a recurrent state), and the other plots and tables at the share of the exact cache a step "
        "reads and the share it holds."
        + (f" The model is hybrid: {meta['layers']}; shares and bytes are of what it holds, windows included."
           if meta.get("layers") else "")
    )  # fmt: skip


def table_blocks(rows: pd.DataFrame, summary: pd.DataFrame) -> list[Block]:
    """The accuracy table (the exact model's standing marked) and the cost table, each with its caption."""
    headers, table = accuracy_table(summary)
    accuracy = Block("table", headers=headers, rows=table, caption=(
        f"Accuracy ({metric_words(rows)}): mean over samples [Wilson 95% interval, whole percents rounded "
        f"outward]. † the exact model's interval lies wholly below {EXACT_FLOOR:.0%} there: beyond the model, left "
        f"out of the verdict. ‡ the exact model answers below {EXACT_FLOOR:.0%} but its interval reaches it: kept, "
        "too few samples to say the model fails."
    ))  # fmt: skip
    frame = costs(rows)
    headers, table = cost_table(frame)
    blocks = [accuracy, Block("table", headers=headers, rows=table, caption=cost_caption(frame))]
    held = bytes_frame(rows)
    if held.held_per_token.notna().any():  # a run from before the byte columns has none
        headers, table = bytes_table(held)
        blocks.append(Block("table", headers=headers, rows=table, caption=bytes_caption()))
    return blocks


def kvpress_order_blocks(overall: pd.DataFrame) -> list[Block]:
    """kvpress's published order of presses beside the grid's (`kvpress_order`), when the grid ran a published pair."""
    headers, table = order_table(overall)
    table = [row for row in table if row[-1] != "not in the grid"]
    if not table:
        return []
    caption = (f"Beside kvpress's published order: each pair of presses its published RULER-4K figures order at one "
               f"compression ratio ({LEADERBOARD}; {COMPACTOR_PR}), and ours at the share kept 1 − ratio, pooled over "
               "the tasks within the model: *agrees* or *reversed* where our Wilson intervals separate, *not separated* "
               "otherwise. The figures are for 8B models and are not comparable with ours: the order is the question.")
    return [Block("heading", "Beside kvpress's published order", level=2),
            Block("table", headers=headers, rows=table, caption=caption)]  # fmt: skip


def generation_blocks(folder: Path, rows: pd.DataFrame, meta: dict, missing: int = 0, reads: bool = False,
                      beside: tuple[Side, ...] = ()) -> list[Block]:
    """The report's blocks: the header, the budget rule and what the run can resolve, the flagged replies, the
    verdict, the plots, the tables, a section beside each other model's run in `beside`, and the generations that
    failed."""
    from attnbench.report.generation_plots import plot_accuracy_vs_bytes, plot_accuracy_vs_cost

    summary = summarize(rows)
    overall = pooled(rows, summary)
    blocks = [Block("heading", f"Generation grid: {meta.get('grid', folder.name)}", level=1),
              Block("text", header_text(folder, rows, meta, reads))]  # fmt: skip
    blocks += [Block("text", text) for text in (rule_text(rows), resolution_text(summary, overall)) if text]
    blocks += [Block("text", line) for line in flag_lines(rows)]
    if missing:
        blocks.append(Block("text", f"**Unfinished**: {missing} unit(s) of the grid have no rows yet; "
                                    f"`attnbench generate --resume {folder}` runs them."))  # fmt: skip
    blocks.append(Block("heading", "Verdict", level=2))
    blocks += [Block("text", line) for line in verdict_lines(rows, summary)] or [Block("text", "No needle task finished.")]
    if len(summary):
        tasks = sorted(set(within_model(summary).task))
        plots = plot_accuracy_vs_bytes(bytes_lines(overall), tasks, folder / "plots")  # the headline, first
        plots += plot_accuracy_vs_cost(overall, summary, tasks, folder / "plots", reads)
        blocks += [Block("image", str(path.relative_to(folder)), caption=caption) for path, caption in plots]
        blocks += table_blocks(rows, summary)
        blocks += kvpress_order_blocks(overall)
    for other in beside:  # `attnbench generate --report DIR --beside OTHER`
        blocks += cross_model_blocks(Side(model_name(meta, folder), rows, folder.name), other)
    failed = rows[rows.status != "ok"]
    if len(failed):
        table = [[r.task, str(r.seq_len), str(r.sample), r.method, share_text(r.share), r.reason] for r in failed.itertuples()]
        blocks.append(Block("table", headers=["task", "N", "sample", "method", "kept", "reason"], rows=table,
                            caption="Generations that failed (the rest of the grid went on)."))  # fmt: skip
    return blocks


def write_generation_report(folder: Path, rows: pd.DataFrame, meta: dict, missing: int = 0,
                            reads: bool = False, beside: tuple[Side, ...] = ()) -> Path:  # fmt: skip
    """report.md and report.html of the grid's folder (written whole each time: a resumed grid rewrites them);
    `missing`: units of the grid not run yet, said at the top; `reads`: a method whose knob sets what a step reads,
    not what it keeps (Quest), is among the rows; `beside`: other models' runs, a section each (`cross_model`)."""
    from attnbench.atomic import write_text_atomic

    blocks = generation_blocks(folder, rows, meta, missing, reads, beside)
    write_text_atomic(folder / "report.md", render_markdown(blocks))
    write_text_atomic(folder / "report.html", render_html(blocks, folder))
    return folder / "report.md"


def terminal_summary(rows: pd.DataFrame, width: int) -> str:
    """What the command prints at the end: what the run can resolve, the flagged replies, the verdict lines and the
    accuracy table, cut to the terminal."""
    summary = summarize(rows)
    if summary.empty:
        return "no generation finished"
    top = [text for text in (rule_text(rows), resolution_text(summary, pooled(rows, summary))) if text]
    lines = [line.replace("**", "") for line in top + flag_lines(rows) + verdict_lines(rows, summary)]
    headers, table = accuracy_table(summary)
    return "\n".join(lines) + "\n\n" + aligned_table(headers, table, width=width)
