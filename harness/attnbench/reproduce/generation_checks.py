"""The checks of claims measured by the real model generating (`attnbench generate`'s rows, generations.csv): what
StreamingLLM, SnapKV and Quest report about the answers a model gives with each method's cache.

Each reads the rows and the claim's parameters; `method` names are the grid's labels (`streamingllm`, `quest`).
An accuracy is the mean of RULER's string match over the samples with its Wilson 95% interval (n = samples), and
two accuracies differ only where their intervals do not overlap (`attnbench.stats.intervals_separate`, the rule the
generation report ranks by): a difference the samples cannot resolve is never read as a loss or a lead.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.reproduce import needle_window
from attnbench.reproduce.needle_window import CUT, INSIDE, OUTSIDE, WindowError
from attnbench.reproduce.outcome import CANNOT, FAILS, HOLDS, TREND, Outcome
from attnbench.stats import Interval, intervals_separate, wilson_interval

EXACT = "full"
NO_ROWS = Interval(math.nan, math.nan, math.nan)


def _usable(rows: pd.DataFrame, methods: list[str]) -> Outcome | None:
    """CANNOT when a method the check needs has no ok row, or a row failed (with the reasons)."""
    ok = rows[rows.status == "ok"]
    missing = [m for m in [EXACT, *methods] if not (ok.method == m).any()]
    failed = rows[rows.status != "ok"]
    if not missing and failed.empty:
        return None
    why = [f"{m}: no generation ran ok" for m in missing]
    why += [f"{r.method} {r.task} sample {r.sample}: {r.reason}" for r in failed.head(5).itertuples()]
    return Outcome(CANNOT, "–", "not every generation it needs ran ok: " + "; ".join(why))


def _cell(rows: pd.DataFrame, method: str, share: float | None = None, protocol: str | None = None) -> pd.DataFrame:
    at = rows[(rows.status == "ok") & (rows.method == method)]
    if share is not None:
        at = at[(at.share - share).abs() < 1e-9]
    if protocol is not None:
        at = at[at.protocol == protocol]
    return at


def _interval(scores: pd.Series) -> Interval:
    """The mean score with its Wilson 95% interval (NO_ROWS without a score)."""
    scores = scores.dropna()
    return wilson_interval(float(scores.mean()), len(scores)) if len(scores) else NO_ROWS


def _accuracy(rows: pd.DataFrame, method: str, share: float | None = None, protocol: str | None = None) -> Interval:
    return _interval(_cell(rows, method, share, protocol).score)


def _text(interval: Interval) -> str:
    """'70% [40–89]': the mean and its interval in whole percents, the ends rounded outward."""
    low, high = math.floor(round(100 * interval.low, 9)), math.ceil(round(100 * interval.high, 9))
    return f"{interval.estimate:.0%} [{low}–{high}]"


def _below(a: Interval, b: Interval) -> bool:
    """`a` lies clearly below `b`: their intervals separate, `a` under."""
    return intervals_separate(a, b) and a.estimate < b.estimate


def _empty(cells: dict[str, Interval]) -> Outcome | None:
    """CANNOT naming the cells (by their words) that have no scored row."""
    missing = [name for name, interval in cells.items() if interval.estimate != interval.estimate]
    return Outcome(CANNOT, "–", f"no scored rows for {', '.join(missing)}") if missing else None


def window_retrieves_what_it_keeps(rows: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """`method` (sinks + a window) answers the needles inside its window at the first answer token, counted in tokens
    (`needle_window`), and not the others: pooled over its shares, its accuracy on the needles outside the window
    lies clearly below its accuracy on those inside that the exact model answers; and at each share its accuracy's
    interval reaches the share of needles inside its window that the exact model answers (a range where the window's
    edge cuts a needle). Both: holds; one: in trend; neither: does not hold."""
    method = params["method"]
    if (blocked := _usable(rows, [method])) is not None:
        return blocked
    mine = _cell(rows, method)
    try:
        from attnbench.generation import preflight
        from attnbench.generation.grid import GenerationGrid

        codec = needle_window.model_codec(Path(params.get("model_dir") or preflight.DEFAULT_MODEL))
        placed = needle_window.placements(mine, params.get("seed", GenerationGrid.seed), codec)  # the grid's seed
    except (WindowError, OSError, ValueError) as error:
        return Outcome(CANNOT, "–", f"its needles cannot be placed against its window: {error}")
    key = ["task", "seq_len", "protocol", "sample"]
    exact = _cell(rows, EXACT).set_index(key).score
    answered = pd.Series(exact.reindex(pd.MultiIndex.from_frame(mine[key])).fillna(0.0).to_numpy(), index=mine.index)
    figures, fits = [], []
    for share in sorted(mine.share.dropna().unique(), reverse=True):
        at = (mine.share - share).abs() < 1e-9
        measured, n = _interval(mine[at].score), int(at.sum())
        least = float(answered[at & (placed == INSIDE)].sum()) / n
        most = least + float(answered[at & (placed == CUT)].sum()) / n
        fits.append(measured.low <= most + 1e-9 and measured.high >= least - 1e-9)
        expected = f"{least:.0%}" if most == least else f"{least:.0%}–{most:.0%}"
        figures.append(f"{share:g}: {_text(measured)} (inside its window, answered by the exact model: {expected})")
    kept, evicted = mine[(placed == INSIDE) & (answered >= 1.0)], mine[placed == OUTSIDE]
    inside, outside = _interval(kept.score), _interval(evicted.score)
    split = f"needles outside its window {_text(outside) if len(evicted) else '–'} of {len(evicted)}, inside and "
    split += f"answered by the exact model {_text(inside) if len(kept) else '–'} of {len(kept)}"
    ours = "; ".join(figures) + "; " + split
    edge = len(kept) > 0 and len(evicted) > 0 and _below(outside, inside)
    if edge and all(fits):
        return Outcome(HOLDS, ours, "it answers the needles its window holds at the answer and not the others: at "
                                    "every share its interval reaches the share inside its window")  # fmt: skip
    if edge:
        return Outcome(TREND, ours, "the needles outside its window are lost and those inside kept, but at a share its "
                                    "accuracy's interval misses the share inside its window")  # fmt: skip
    if all(fits):
        why = "no needle lay on one side of its window" if not (len(kept) and len(evicted)) else "the intervals overlap"
        return Outcome(TREND, ours, "at every share its accuracy fits the share inside its window, but its needles "
                                    f"outside do not lie clearly below those inside ({why})")  # fmt: skip
    return Outcome(FAILS, ours, "its accuracy is not the share of needles inside its window")


def question_aware_keeps_retrieval(rows: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """`method` with the question inside its observation window (question-aware) keeps the exact model's accuracy
    at every share in `shares` (its interval not clearly below the exact model's), where question-agnostic
    compression lies clearly below question-aware at one of them."""
    method, shares = params["method"], params["shares"]
    if (blocked := _usable(rows, [method])) is not None:
        return blocked
    aware, agnostic = "question-aware", "question-agnostic"
    exact = _accuracy(rows, EXACT, protocol=aware)
    cells = {f"{EXACT} {aware}": exact}
    cells |= {f"{method} {p} at {s:g}": _accuracy(rows, method, s, p) for s in shares for p in (aware, agnostic)}
    if (blocked := _empty(cells)) is not None:
        return blocked
    figures, keeps, loses, lower = [], [], [], []
    for share in shares:
        with_q, without_q = cells[f"{method} {aware} at {share:g}"], cells[f"{method} {agnostic} at {share:g}"]
        keeps.append(not _below(with_q, exact))
        loses.append(_below(without_q, with_q))
        lower.append(without_q.estimate < with_q.estimate)
        figures.append(f"{share:g}: aware {_text(with_q)}, agnostic {_text(without_q)}")
    ours = f"exact {_text(exact)}; " + "; ".join(figures)
    if all(keeps) and any(loses):
        return Outcome(HOLDS, ours, "question-aware keeps the exact model's answers, question-agnostic lies clearly "
                                    "below it at a share")  # fmt: skip
    if all(keeps):
        why = "answers fewer, but their intervals overlap" if any(lower) else "loses none here"
        return Outcome(TREND, ours, f"question-aware keeps the answers; question-agnostic {why}")
    return Outcome(FAILS, ours, "question-aware compression lies clearly below the exact model's answers")


def quest_keeps_where_others_fail(rows: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """At every share in `shares`, `method` keeps the exact model's accuracy (its interval not clearly below the
    exact model's) and each of `others` lies clearly below it; in trend when its accuracy is above each of theirs at
    every share, but not every difference is clear."""
    method, others, shares = params["method"], params["others"], params["shares"]
    if (blocked := _usable(rows, [method, *others])) is not None:
        return blocked
    exact = _accuracy(rows, EXACT)
    cells = {EXACT: exact} | {f"{m} at {s:g}": _accuracy(rows, m, s) for s in shares for m in (method, *others)}
    if (blocked := _empty(cells)) is not None:
        return blocked
    figures, holds, leads = [], [], []
    for share in shares:
        mine = cells[f"{method} at {share:g}"]
        theirs = {other: cells[f"{other} at {share:g}"] for other in others}
        holds.append(not _below(mine, exact) and all(_below(t, mine) for t in theirs.values()))
        leads.append(all(t.estimate < mine.estimate for t in theirs.values()))
        figures.append(f"{share:g}: {method} {_text(mine)}, " + ", ".join(f"{o} {_text(t)}" for o, t in theirs.items()))
    ours = f"exact {_text(exact)}; " + "; ".join(figures)
    if all(holds):
        return Outcome(HOLDS, ours, f"{method} keeps the answers at every small budget, the others lie clearly "
                                    "below it")  # fmt: skip
    if all(leads):
        return Outcome(TREND, ours, f"{method} leads at every budget, but not every difference is clear (intervals "
                                    "overlap, or it lies clearly below the exact model)")  # fmt: skip
    return Outcome(FAILS, ours, f"{method} does not keep the answers where the others lose them")


GENERATION_CHECKS = {
    "window_retrieves_what_it_keeps": window_retrieves_what_it_keeps,
    "question_aware_keeps_retrieval": question_aware_keeps_retrieval,
    "quest_keeps_where_others_fail": quest_keeps_where_others_fail,
}
