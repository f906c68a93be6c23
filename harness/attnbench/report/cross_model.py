"""Two generation runs side by side, each of one model (SmolLM2-135M beside Gemma-3-270M): do the methods rank alike in
both models, and where do they not?

Per (N, protocol) both runs ran: the needle tasks both ran that both exact models can do (the verdict's rule,
`generation_verdict.standing`: a task beyond either model at that N is left out, and said), and each method setting
(label and share) both ran on every one of those tasks, pooled over their samples with its Wilson 95% interval in each
model and its rank there. Pairs of settings at one N — two methods at one share, one method at two shares — are read
by the verdict's rule (`attnbench.stats.intervals_separate`) in each model: "agrees" (ordered the same way in both),
"reversed" (opposite ways), "<model> only" (ordered in one, overlapping in the other). Spearman's rank correlation of
the settings' accuracies reads the point estimates; the pairs say what the intervals can tell. The sentences
(`cross_model_text`) name where the models disagree: the reversed pairs, and the settings whose standing against
their own exact model differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench.report.generation_summary import accuracy_interval, exact_accuracy, is_exact, labelled, summarize
from attnbench.report.generation_verdict import BEYOND, below_exact, standing
from attnbench.report.text import share_text
from attnbench.runfolder.generations import read_generations
from attnbench.runfolder.meta import read_meta
from attnbench.runfolder.results import RunFolderUnreadable
from attnbench.stats import Interval, intervals_separate

AGREES, REVERSED = "agrees", "reversed"
ABOVE, BELOW, LEVEL = "clearly above", "clearly below", "not clearly below"  # a setting against its exact model


@dataclass(frozen=True)
class Side:
    """One run of the comparison: its model's name, its rows (generations.csv) and its folder's name."""

    name: str
    rows: pd.DataFrame
    run: str = ""


def model_name(meta: dict, folder: Path) -> str:
    """The model's name: the folder of meta.json's `model_dir` ('SmolLM2-135M'); the run folder's name without one."""
    model = meta.get("model_dir")
    return Path(model).name if model else folder.name


def load_side(folder: Path) -> Side:
    """A generation run folder as the other side of the comparison (`--beside`); RunFolderUnreadable, saying why,
    when it is not one. Its lock is not taken: a grid still being written is read as far as its rows go."""
    if not folder.is_dir():
        raise RunFolderUnreadable(f"--beside {folder}: not a folder; it takes a generation run folder (results/<id>/)")
    try:
        return Side(model_name(read_meta(folder), folder), read_generations(folder), folder.name)
    except RunFolderUnreadable as error:
        raise RunFolderUnreadable(f"--beside {folder}: {error}") from None


def distinct(a: Side, b: Side) -> tuple[Side, Side]:
    """The two sides, their run's folder named beside a model name they share (two runs of one model)."""
    if a.name != b.name:
        return a, b
    named_a = Side(f"{a.name} ({a.run or 'this run'})", a.rows, a.run)
    return named_a, Side(f"{b.name} ({b.run or 'the other run'})", b.rows, b.run)


@dataclass(frozen=True)
class Pair:
    """Two settings at one N, `first` the one above where a model orders them; `a`, `b`: +1 when `first` lies clearly
    above `second` in that model, -1 clearly below, 0 when their intervals overlap."""

    kind: str  # "at 1/8" (two methods at one share) | "snapkv" (one method at two shares)
    first: str
    second: str
    a: int
    b: int

    def outcome(self, name_a: str, name_b: str) -> str:
        if self.a and self.b:
            return AGREES if self.a == self.b else REVERSED
        return f"{name_a} only" if self.a else f"{name_b} only"


@dataclass
class Comparison:
    """One (N, protocol) of the two runs: the tasks pooled, those left out (words), and per setting both ran its
    pooled accuracy in each model (`settings`: label, method, share, exact, samples/accuracy/low/high/rank _a and _b),
    the exact model's interval in each, and the pairs some model orders."""

    seq_len: int
    protocol: str
    tasks: list[str]
    left_out: list[str] = field(default_factory=list)
    settings: pd.DataFrame = field(default_factory=pd.DataFrame)
    exact: tuple[Interval | None, Interval | None] = (None, None)
    pairs: list[Pair] = field(default_factory=list)
    candidates: int = 0  # the pairs read (`candidate_pairs`), ordered or not
    untried: list[str] = field(default_factory=list)  # settings one model ran on only some of the tasks

    @property
    def compared(self) -> bool:
        """Whether some method setting besides the exact model is in both runs here."""
        return len(self.settings) > 0 and bool((~self.settings.exact.astype(bool)).any())


def setting_label(method: str, share: float | None) -> str:
    """'snapkv at 1/8', or the method alone where it has no budget."""
    return method if share is None else f"{method} at {share_text(share)}"


def task_split(a: Side, b: Side, n: int, protocol: str,
               summaries: tuple[pd.DataFrame, pd.DataFrame]) -> tuple[list[str], list[str]]:  # fmt: skip
    """The needle tasks both ran at (N, protocol) and both exact models can do, and words on those left out: beyond
    one model or both, or run by one only."""
    ran = []
    for summary in summaries:
        here = summary[(summary.seq_len == n) & (summary.protocol == protocol) & summary.accuracy.notna()]
        ran.append(set(here.task))
    exact = [exact_accuracy(summary) for summary in summaries]
    kept, left = [], {}  # why -> the tasks left out for it
    for task in sorted(ran[0] | ran[1]):
        beyond = [side.name for side, e in zip((a, b), exact) if standing(e.get((n, task, protocol))) == BEYOND]
        if task not in ran[0] or task not in ran[1]:
            left.setdefault(f"run in {(a if task in ran[0] else b).name} only", []).append(task)
        elif beyond:
            left.setdefault(f"beyond {' and '.join(beyond)}", []).append(task)
        else:
            kept.append(task)
    return kept, [f"{', '.join(tasks)} ({why})" for why, tasks in left.items()]


def pooled_settings(rows: pd.DataFrame, n: int, protocol: str, tasks: list[str]) -> pd.DataFrame:
    """Per (method, share) at (N, protocol): the mean score over the samples of `tasks`, its Wilson interval, whether
    it is the exact model, and the tasks it ran (a setting missing one is not compared)."""
    ok = labelled(rows[(rows.status == "ok") & rows.score.notna()])
    ok = ok[(ok.seq_len == n) & (ok.protocol == protocol) & ok.task.isin(tasks)]
    ok = ok.assign(share_key=ok.share.fillna(-1.0).round(9), exact_row=is_exact(ok))
    out = []
    for (method, share), at in ok.groupby(["method", "share_key"], sort=False):
        interval = accuracy_interval(at.score.tolist())
        out.append(dict(method=method, share=math.nan if share < 0 else float(share), samples=len(at),
                        accuracy=interval.estimate, low=interval.low, high=interval.high,
                        exact=bool(at.exact_row.all()), every_task=set(at.task) >= set(tasks)))  # fmt: skip
    columns = ["method", "share", "samples", "accuracy", "low", "high", "exact", "every_task"]
    return pd.DataFrame(out, columns=columns).astype({"share": float, "exact": bool})  # NaN share: no budget


def ranks(accuracy: pd.Series) -> pd.Series:
    """1 for the highest accuracy; tied settings share the lowest rank of their tie ('2=' in the table)."""
    return accuracy.rank(method="min", ascending=False).astype(int)


def spearman(x: pd.Series, y: pd.Series) -> float:
    """Spearman's rank correlation (ties at their mean rank; Pearson's of the ranks): NaN with fewer than three
    settings or where one model gives every setting one accuracy."""
    if len(x) < 3:
        return math.nan
    rx, ry = x.rank().to_numpy(float), y.rank().to_numpy(float)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def _order(a: Interval, b: Interval) -> int:
    return 0 if not intervals_separate(a, b) else (1 if a.low > b.high else -1)


def candidate_pairs(settings: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(kind, label, label) for every pair of non-exact settings at one share (two methods; the settings without a
    budget together, "fixed") or of one method (two shares): the pairs the comparison reads."""
    judged = settings[~settings.exact].assign(share_key=settings.share.fillna(-1.0))
    groups = [("fixed" if s < 0 else f"at {share_text(s)}", at) for s, at in judged.groupby("share_key", sort=False)]
    groups += [(method, at) for method, at in judged.groupby("method", sort=False) if at.share.notna().sum() > 1]
    return [(kind, x, y) for kind, at in groups for x, y in combinations(list(at.label), 2)]


def side_intervals(settings: pd.DataFrame, side: str) -> dict[str, Interval]:
    """label -> the setting's pooled accuracy with its interval in model `side` ("a" or "b")."""
    return {r.label: Interval(getattr(r, f"accuracy_{side}"), getattr(r, f"low_{side}"), getattr(r, f"high_{side}"))
            for r in settings.itertuples()}  # fmt: skip


def ordered_pairs(settings: pd.DataFrame) -> list[Pair]:
    """The candidate pairs (`candidate_pairs`) that some model orders (`intervals_separate`), `first` the higher in
    the first model that orders them."""
    a, b = side_intervals(settings, "a"), side_intervals(settings, "b")
    pairs = []
    for kind, x, y in candidate_pairs(settings):
        in_a, in_b = _order(a[x], a[y]), _order(b[x], b[y])
        if in_a or in_b:
            flip = (in_a or in_b) < 0
            pairs.append(Pair(kind, y if flip else x, x if flip else y, -in_a if flip else in_a,
                              -in_b if flip else in_b))  # fmt: skip
    return pairs


def standing_against_exact(interval: Interval, exact: Interval) -> str:
    """A setting against its model's exact one by the verdict's rule (`below_exact`)."""
    if below_exact(interval, exact):
        return BELOW
    return ABOVE if interval.low > exact.high else LEVEL


def compare(a: Side, b: Side) -> list[Comparison]:
    """The comparison at every (N, protocol) both runs ran needle tasks at."""
    summaries = (summarize(a.rows), summarize(b.rows))
    keys = [set(zip(s.seq_len[s.accuracy.notna()], s.protocol[s.accuracy.notna()])) for s in summaries]
    out = []
    for n, protocol in sorted(keys[0] & keys[1]):
        tasks, left = task_split(a, b, n, protocol, summaries)
        here = Comparison(int(n), protocol, tasks, left)
        if tasks:
            pools = [pooled_settings(side.rows, n, protocol, tasks) for side in (a, b)]
            both = pools[0].merge(pools[1], on=["method", "share", "exact"], how="outer", suffixes=("_a", "_b"),
                                  indicator=True)  # fmt: skip
            both = both.assign(label=[setting_label(m, s if s == s else None) for m, s in zip(both.method, both.share)])
            whole = (both._merge == "both") & both.every_task_a.eq(True) & both.every_task_b.eq(True)
            here.untried = sorted(both.label[(both._merge == "both") & ~whole])
            kept = both[whole].drop(columns=["_merge", "every_task_a", "every_task_b"])
            kept = kept.sort_values(["exact", "share", "method"], ascending=[False, False, True], na_position="first")
            kept = kept.assign(rank_a=ranks(kept.accuracy_a), rank_b=ranks(kept.accuracy_b)).reset_index(drop=True)
            here.settings = kept
            here.exact = tuple(next(iter(side_intervals(kept[kept.exact], s).values()), None) for s in "ab")
            here.pairs, here.candidates = ordered_pairs(kept), len(candidate_pairs(kept))
        out.append(here)
    return out
