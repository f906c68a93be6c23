"""The checks of claims measured by the real model generating (`attnbench generate`'s rows, generations.csv): what
StreamingLLM, SnapKV and Quest report about the answers a model gives with each method's cache.

Each reads the rows and the claim's parameters; `method` names are the grid's labels (`streamingllm`, `quest`).
Accuracies are means over samples of RULER's string match, with the exact model's (`full`) beside them.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnbench.reproduce.outcome import CANNOT, FAILS, HOLDS, MIN_EFFECT, TREND, Outcome

INSIDE_SLACK = 0.2  # StreamingLLM: measured accuracy within this of the share of needles inside its window


def _usable(rows: pd.DataFrame, methods: list[str]) -> Outcome | None:
    """CANNOT when a method the check needs has no ok row, or a row failed (with the reasons)."""
    ok = rows[rows.status == "ok"]
    missing = [m for m in ["full", *methods] if not (ok.method == m).any()]
    failed = rows[rows.status != "ok"]
    if not missing and failed.empty:
        return None
    why = [f"{m}: no generation ran ok" for m in missing]
    why += [f"{r.method} {r.task} sample {r.sample}: {r.reason}" for r in failed.head(5).itertuples()]
    return Outcome(CANNOT, "–", "not every generation it needs ran ok: " + "; ".join(why))


def _accuracy(rows: pd.DataFrame, method: str, share: float | None = None, protocol: str | None = None) -> float:
    at = rows[(rows.status == "ok") & (rows.method == method)]
    if share is not None:
        at = at[(at.share - share).abs() < 1e-9]
    if protocol is not None:
        at = at[at.protocol == protocol]
    return float(at.score.mean())


def window_retrieves_what_it_keeps(rows: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """`method` (sinks + a window) at each share s answers about the needles that lie in the last s of the context
    and the exact model answers: measured within INSIDE_SLACK of that share at every s, and never well above it."""
    method = params["method"]
    if (blocked := _usable(rows, [method])) is not None:
        return blocked
    exact = rows[(rows.method == "full") & (rows.status == "ok")].set_index(["task", "sample"]).score
    figures, close = [], []
    for share in sorted(rows[rows.method == method].share.dropna().unique(), reverse=True):
        at = rows[(rows.method == method) & ((rows.share - share).abs() < 1e-9) & (rows.status == "ok")]
        inside = [(row.depth >= 1 - share) * exact.get((row.task, row.sample), 0.0) for row in at.itertuples()]
        predicted, measured = sum(inside) / len(inside), float(at.score.mean())
        close.append(abs(measured - predicted) <= INSIDE_SLACK)
        figures.append(f"{share:g}: {measured:.0%} (inside the window: {predicted:.0%})")
    ours = "; ".join(figures)
    if all(close):
        return Outcome(HOLDS, ours, f"at every share within {INSIDE_SLACK:.0%} of the needles its window keeps")
    return Outcome(FAILS, ours, "its accuracy is not the share of needles inside its window")


def question_aware_keeps_retrieval(rows: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """`method` with the question inside its observation window (question-aware) keeps the exact model's accuracy
    (within MIN_EFFECT) at `shares`, where question-agnostic compression loses at least MIN_EFFECT at one of them."""
    method, shares = params["method"], params["shares"]
    if (blocked := _usable(rows, [method])) is not None:
        return blocked
    aware, agnostic = "question-aware", "question-agnostic"
    exact = _accuracy(rows, "full", protocol=aware)
    figures, keeps, loses = [], [], []
    for share in shares:
        with_q, without_q = _accuracy(rows, method, share, aware), _accuracy(rows, method, share, agnostic)
        keeps.append(with_q >= exact - MIN_EFFECT)
        loses.append(without_q <= with_q - MIN_EFFECT)
        figures.append(f"{share:g}: aware {with_q:.0%}, agnostic {without_q:.0%}")
    ours = f"exact {exact:.0%}; " + "; ".join(figures)
    if all(keeps) and any(loses):
        return Outcome(HOLDS, ours, "question-aware keeps the exact model's answers, question-agnostic loses part")
    if all(keeps):
        return Outcome(TREND, ours, "question-aware keeps the answers, but question-agnostic loses none here")
    return Outcome(FAILS, ours, "question-aware compression does not keep the exact model's answers")


def quest_keeps_where_others_fail(rows: pd.DataFrame, params: dict[str, Any]) -> Outcome:
    """At every share in `shares`, `method` keeps the exact model's accuracy within `keeps_within`, and each of
    `others` lies at least `gap` below it; in trend when it leads each of them by MIN_EFFECT but misses one figure."""
    method, others, shares = params["method"], params["others"], params["shares"]
    if (blocked := _usable(rows, [method, *others])) is not None:
        return blocked
    exact = _accuracy(rows, "full")
    figures, holds, leads = [], [], []
    for share in shares:
        mine = _accuracy(rows, method, share)
        theirs = {other: _accuracy(rows, other, share) for other in others}
        holds.append(mine >= exact - params["keeps_within"] and all(mine - t >= params["gap"] for t in theirs.values()))
        leads.append(all(mine - t >= MIN_EFFECT for t in theirs.values()))
        figures.append(f"{share:g}: {method} {mine:.0%}, " + ", ".join(f"{o} {t:.0%}" for o, t in theirs.items()))
    ours = f"exact {exact:.0%}; " + "; ".join(figures)
    if all(holds):
        return Outcome(HOLDS, ours, f"{method} keeps the answers at every small budget, the others fall {params['gap']:.0%} or more behind")
    if all(leads):
        return Outcome(TREND, ours, f"{method} leads at every budget, but not by the published margin")
    return Outcome(FAILS, ours, f"{method} does not keep the answers where the others lose them")


GENERATION_CHECKS = {
    "window_retrieves_what_it_keeps": window_retrieves_what_it_keeps,
    "question_aware_keeps_retrieval": question_aware_keeps_retrieval,
    "quest_keeps_where_others_fail": quest_keeps_where_others_fail,
}
