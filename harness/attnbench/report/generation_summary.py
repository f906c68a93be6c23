"""A generation grid's rows (generations.csv) as the report's frame: one row per cell (N, task, protocol, method,
share) with the mean RULER score and its Wilson 95% interval (n = samples; a multi-answer row's fractional score
enters the mean), the continuation's perplexity ratio (geometric mean over samples) and the shares of the exact cache
held and read. A grid mixing budget rules names a method under a rule other than kvpress's with it, so two rules are
never pooled as one method. The exact model's flagged replies (`reply_flag`) are counted per task.
"""

from __future__ import annotations

import math

import pandas as pd

from attnbench.runfolder.generations import REPLY_FLAGS
from attnbench.stats import Interval, wilson_interval

EXACT = "full"  # the exact model's label: full attention with its KV cache, every layer
QUANTIZE = "quantize"  # generations.csv's column of a method's quantized storage ("" none)


def budget_rules(rows: pd.DataFrame) -> list[str]:
    """The budget rules the rows were generated under (none named in runs from before the column)."""
    if "budget_rule" not in rows:
        return []
    return sorted(set(rows.budget_rule.dropna().astype(str)) - {""})


def labelled(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows, a method under a rule other than kvpress's named with it ('snapkv (fixed-total)') where a grid mixes
    rules, so two rules are never pooled as one method; the exact model is the same under both."""
    if len(budget_rules(rows)) < 2:
        return rows
    other = rows.budget_rule.notna() & ~rows.budget_rule.isin(["", "kvpress"]) & (rows.method != EXACT)
    return rows.assign(method=rows.method.where(~other, rows.method + " (" + rows.budget_rule.astype(str) + ")"))


def accuracy_interval(scores: list[float]) -> Interval:
    """The mean score with its Wilson 95% interval, n = samples (NaN without a score)."""
    if not scores:
        return Interval(math.nan, math.nan, math.nan)
    return wilson_interval(sum(scores) / len(scores), len(scores))


def geometric_mean(ratios: list[float]) -> float:
    """The geometric mean of perplexity ratios (NaN without any)."""
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else math.nan


def quantize_of(rows: pd.DataFrame) -> pd.Series:
    """Per row, its cache's quantized storage (`quantize`: "kivi-4", ...; "" for none, and in runs from before the
    column)."""
    if QUANTIZE not in rows:
        return pd.Series("", index=rows.index, dtype=object)
    return rows[QUANTIZE].map(lambda value: value if isinstance(value, str) else "")  # NaN: a row without one


def is_exact(rows: pd.DataFrame) -> pd.Series:
    """Which rows are the exact model's: full with its cache, every layer, in full precision, under its own label."""
    plain = quantize_of(rows).eq("")
    return (rows.variant == EXACT) & rows.dense_layers.fillna(0).eq(0) & rows.method.eq(EXACT) & plain


SUMMARY_COLUMNS = ["seq_len", "task", "protocol", "method", "share", "samples", "accuracy", "low", "high", "ppl_ratio",
                   "cache_share", "read_share", "exact_method"]  # fmt: skip


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (N, task, protocol, method, share): samples, mean score with its Wilson interval, continuation
    ratio, the shares of the exact cache held (after the prompt) and read (by its first step)."""
    ok = labelled(rows[rows.status == "ok"])
    ok = ok.assign(share_key=ok.share.fillna(-1.0), exact_row=is_exact(ok))
    out = []
    keys = ["seq_len", "task", "protocol", "method", "share_key"]
    for (n, task, protocol, method, share), at in ok.groupby(keys, sort=False):
        interval = accuracy_interval(at.score.dropna().tolist())
        out.append(dict(
            seq_len=int(n), task=task, protocol=protocol, method=method, share=None if share < 0 else float(share),
            samples=len(at), accuracy=interval.estimate, low=interval.low, high=interval.high,
            ppl_ratio=geometric_mean(at.ppl_ratio.dropna().tolist()), cache_share=at.cache_share.mean(),
            read_share=at.read_share.mean(), exact_method=bool(at.exact_row.all()),
        ))  # fmt: skip
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def n_text(n: int) -> str:
    """'N = 2,048', or the rows' own lengths of a user's task (N 0)."""
    return f"N = {n:,}" if n else "the rows' own lengths"


def interval_of(row: object) -> Interval:
    """A summary's or pooled frame's row as an Interval."""
    return Interval(row.accuracy, row.low, row.high)  # type: ignore[attr-defined]


def exact_accuracy(summary: pd.DataFrame) -> dict[tuple[int, str, str], Interval]:
    """(N, task, protocol) -> the exact model's mean score with its interval."""
    exact = summary[summary.exact_method & summary.accuracy.notna()]
    return {(r.seq_len, r.task, r.protocol): interval_of(r) for r in exact.itertuples()}


def flagged_replies(rows: pd.DataFrame) -> list[tuple[str, str, int, int]]:
    """(task, flag, the exact model's answers with that `reply_flag`, all its answers on the task), in REPLY_FLAGS'
    order: where the exact model's reply could not hold the answer (none in runs from before the column)."""
    if "reply_flag" not in rows:
        return []
    exact = rows[(rows.status == "ok") & is_exact(rows) & rows.score.notna()]
    return [(task, flag, int((at.reply_flag == flag).sum()), len(at))
            for task, at in exact.groupby("task", sort=False) for flag in REPLY_FLAGS if (at.reply_flag == flag).any()]  # fmt: skip
