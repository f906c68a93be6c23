"""The generation report's verdict and the sentences it is told in: which tasks are within the model, each method's
accuracy pooled over them, methods ordered only where their Wilson intervals separate, and what the run can resolve.

Per N, task and protocol the exact model's own accuracy comes first; a task whose exact interval lies wholly below
EXACT_FLOOR at that N is beyond the model and left out of the verdict, and one kept only because its interval is too
wide to decide is said to be. The verdict, per N and budget: the methods' accuracy over the tasks within the model,
two of them put in order only when their intervals do not overlap (`clearly_above`: stricter than a 5% test on the
difference, so it errs toward "no clear difference"), the exact model's beside them and each method set against it by
the same rule; then the setting that holds the fewest bytes per token (`generation_bytes`) without lying clearly
below the exact model (`below_exact`, the same rule), with its family. A method whose measured read share is off its
nominal budget (Quest ranks pages per query head: at 1/2 it reads more than the whole cache) says what it reads, so a
line never compares unequal costs unsaid. Near the top, what the run can resolve: the smallest difference whose
intervals separate at its number of samples.
"""

from __future__ import annotations

import math

import pandas as pd

from attnbench.report.generation_bytes import per_token_text, with_bytes
from attnbench.report.generation_summary import (
    EXACT, accuracy_interval, exact_accuracy, interval_of, is_exact, labelled, n_text,
)  # fmt: skip
from attnbench.report.text import format_percent, recall_text, share_text
from attnbench.stats import Interval, clearly_above, separable_difference

EXACT_FLOOR = 0.8  # an exact model whose interval lies wholly below this fails the task at that N: beyond the model
BYTES_TIE = 1e-6  # two settings whose bytes held per token differ by less than this (relative) are tied
READ_TOLERANCE = 0.1  # a read share within 10% of the budget (a page or sink tokens rounding it) is at the budget
ABLE, UNDECIDED, BEYOND = "able", "undecided", "beyond"  # the exact model's standing on a task at an N


def standing(exact: Interval | None) -> str:
    """The exact model on a task at an N: ABLE (its accuracy at EXACT_FLOOR or above), UNDECIDED (below it, but its
    interval reaches it: kept, too few samples to say it fails), BEYOND (its interval wholly below, or no exact row)."""
    if exact is None or exact.high < EXACT_FLOOR:
        return BEYOND
    return ABLE if exact.estimate >= EXACT_FLOOR else UNDECIDED


def within_model(summary: pd.DataFrame) -> pd.DataFrame:
    """The needle rows of the tasks not beyond the exact model at that N (the verdict's rows)."""
    exact = exact_accuracy(summary)
    keep = [standing(exact.get((r.seq_len, r.task, r.protocol))) != BEYOND for r in summary.itertuples()]
    return summary[pd.Series(keep, index=summary.index, dtype=bool) & summary.accuracy.notna()]


POOLED_COLUMNS = ["seq_len", "protocol", "method", "share", "samples", "accuracy", "low", "high", "cache_share",
                  "read_share", "exact_method", "exact_decoding", "family", "held_per_token",
                  "read_per_token"]  # fmt: skip


def pooled(rows: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Per (N, protocol, method, share): the mean score over every sample of the needle tasks within the model, its
    Wilson interval over those samples, the mean shares of the exact cache held and read by a step (what the verdict,
    the plot and the cost table show, one figure each), its family and its mean bytes held and read per token
    (`generation_bytes.with_bytes`)."""
    judged = within_model(summary)
    tasks = set(zip(judged.seq_len, judged.task, judged.protocol))
    ok = with_bytes(labelled(rows[(rows.status == "ok") & rows.score.notna()]))
    judged_rows = pd.Series([key in tasks for key in zip(ok.seq_len, ok.task, ok.protocol)], index=ok.index, dtype=bool)
    ok = ok[judged_rows].assign(share_key=lambda f: f.share.fillna(-1.0))
    out = []
    for (n, protocol, method, share), at in ok.groupby(["seq_len", "protocol", "method", "share_key"], sort=False):
        interval = accuracy_interval(at.score.tolist())
        out.append(dict(seq_len=int(n), protocol=protocol, method=method, share=None if share < 0 else float(share),
                        samples=len(at), accuracy=interval.estimate, low=interval.low, high=interval.high,
                        cache_share=at.cache_share.mean(), read_share=at.read_share.mean(),
                        exact_method=bool(is_exact(at).all()), exact_decoding=bool((at.decode == "exact").any()),
                        family=at.family.iloc[0], held_per_token=at.held_per_token.mean(),
                        read_per_token=at.read_per_token.mean()))  # fmt: skip
    return pd.DataFrame(out, columns=POOLED_COLUMNS)


def interval_ends_text(low: float, high: float) -> str:
    """'[23–77]': the ends in whole percents, rounded outward, so the interval shown holds the one computed."""
    return f"[{math.floor(round(100 * low, 9))}–{math.ceil(round(100 * high, 9))}]"


def accuracy_text(interval: Interval) -> str:
    """'70% [40–89]': the mean and its Wilson 95% interval; '70%' where there is none."""
    if interval.low != interval.low or interval.high != interval.high:
        return recall_text(interval.estimate)
    return f"{recall_text(interval.estimate)} {interval_ends_text(interval.low, interval.high)}"


def and_list(words: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def ranking_text(figures: dict[str, str], intervals: dict[str, Interval]) -> str:
    """The methods' figures, ordered only where their intervals separate (`clearly_above`): the leaders (none lies
    clearly above them) with 'no clear difference' between them, then the others by the leaders they lie clearly
    below, 'no clear difference' said of a group whose intervals all overlap; nothing orders two methods whose
    intervals overlap. Names in alphabetical order within each part (no rank implied)."""
    above = clearly_above(intervals)
    leaders = sorted(name for name, over in above.items() if not over)
    below: dict[tuple[str, ...], list[str]] = {}
    for name in sorted(above):
        if above[name]:
            below.setdefault(tuple(m for m in above[name] if m in leaders), []).append(name)
    if len(leaders) == 1:
        rest = [m for m in sorted(above) if m != leaders[0]]
        return figures[leaders[0]] + (f" lies clearly above {_group_text(rest, figures, above)}" if rest else "")
    overlap = f"no clear difference between {and_list([figures[m] for m in leaders])} (their intervals overlap)"
    if not below:
        return overlap

    def whom(over: tuple[str, ...]) -> str:
        return ("all of them" if len(leaders) > 2 else "both") if len(over) == len(leaders) else and_list(list(over))

    parts = [f"{_group_text(names, figures, above)} {'lies' if len(names) == 1 else 'lie'} clearly below {whom(over)}"
             for over, names in sorted(below.items(), key=lambda item: (-len(item[0]), item[0]))]  # fmt: skip
    return f"at the top, {overlap}; " + "; ".join(parts)


def below_exact(interval: Interval, exact: Interval) -> bool:
    """Whether a method lies clearly below the exact model: its interval wholly under the exact model's (the ranking's
    rule, `clearly_above`). The one test of "within the exact model's accuracy": a method not clearly below it is."""
    return EXACT in clearly_above({"method": interval, EXACT: exact})["method"]


def exact_comparison_text(intervals: dict[str, Interval], exact: Interval) -> str:
    """Each method set against the exact model by the ranking's rule (`clearly_above`): 'every method lies clearly
    below it', or which are not clearly below it (their intervals overlap), clearly above it, and clearly below it.
    Names in alphabetical order within each part."""
    above = clearly_above({**intervals, EXACT: exact})[EXACT]
    below = sorted(m for m in intervals if below_exact(intervals[m], exact))
    level = sorted(m for m in intervals if m not in above and m not in below)
    if len(below) == len(intervals) > 1:
        return "Against the exact model: every method lies clearly below it"
    parts = [f"{and_list(level)} {'is' if len(level) == 1 else 'are'} not clearly below it" if level else "",
             f"{and_list(above)} {'lies' if len(above) == 1 else 'lie'} clearly above it" if above else "",
             f"{and_list(below)} {'lies' if len(below) == 1 else 'lie'} clearly below it" if below else ""]  # fmt: skip
    return "Against the exact model: " + "; ".join(part for part in parts if part)


def reads_off_budget(read: float, share: float | None) -> bool:
    """Whether a method's measured read share is off its nominal budget by more than READ_TOLERANCE (relative): its
    budget line then compares unequal costs and must say so. A method without a budget is never off it."""
    return share is not None and share == share and read == read and abs(read / share - 1) > READ_TOLERANCE


def _group_text(names: list[str], figures: dict[str, str], above: dict[str, list[str]]) -> str:
    """The figures of `names`, with '(no clear difference between them)' where no one of them lies clearly above
    another."""
    text = and_list([figures[m] for m in names])
    if len(names) > 1 and not any(set(above[m]) & set(names) for m in names):
        text += f" (no clear difference {'between' if len(names) == 2 else 'among'} them)"
    return text


def resolution_text(summary: pd.DataFrame, overall: pd.DataFrame) -> str:
    """What the run can tell apart: the smallest difference of two accuracies near 50% whose intervals separate, at
    the samples of one cell and at the samples the verdict pools per method and budget, at each N."""
    cells = summary[summary.accuracy.notna() & ~summary.exact_method]
    if cells.empty:
        return ""
    fewest, most = int(cells.samples.min()), int(cells.samples.max())
    many = f"{fewest}" if fewest == most else f"{fewest}–{most}"
    text = f"**What this run can resolve**: with {many} sample{'s' if most > 1 else ''} a cell (one task, N, method "
    text += f"and budget), {_difference_words(fewest, most)}"
    judged = overall[~overall.exact_method] if len(overall) else overall
    if len(judged):
        per_n = judged.groupby("seq_len").samples.min().to_dict()
        text += "; the verdict pools the tasks within the model, " + ", ".join(
            f"{count} sample{'s' if count > 1 else ''} a method and budget at {n_text(n)} ({_about(count)})"
            for n, count in sorted(per_n.items()))  # fmt: skip
    return text + ". A smaller difference reads as \"no clear difference\"; four times the samples (`--samples`) " \
                  "halve it."  # fmt: skip


def _points(samples: int) -> str:
    """'62 points': the separable difference at `samples` in whole points, rounded up; 'no difference' where not
    even 0% and 100% separate."""
    difference = separable_difference(samples)
    return "no difference" if math.isinf(difference) else f"{math.ceil(round(100 * difference, 9))} points"


def _about(samples: int) -> str:
    """'about 36 points', or that nothing can be told apart at so few samples."""
    if math.isinf(separable_difference(samples)):
        return "no difference can be told apart"
    return f"about {_points(samples)}"


def _difference_words(fewest: int, most: int) -> str:
    """What cells of `fewest` to `most` samples tell apart, in words."""
    if math.isinf(separable_difference(most)):
        return "no two accuracies can be told apart (not even 0% and 100%: their 95% intervals overlap)"
    points = _points(most)
    if fewest != most:
        points += f" ({_points(fewest)} at {fewest} samples)"
    return (f"two accuracies near 50% must differ by about {points} before their 95% intervals separate (a little "
            "less near 0% or 100%)")  # fmt: skip


def verdict_lines(rows: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """Per N and protocol: the exact model's accuracy per task, the tasks beyond it or kept undecided, and per budget
    the methods' accuracy over the samples of the tasks within the model, ordered only where their intervals
    separate (`ranking_text`), the exact model's beside them (fixed states at their own share)."""
    lines = []
    exact = exact_accuracy(summary)
    overall = pooled(rows, summary)
    for (n, protocol), at_n in summary[summary.accuracy.notna()].groupby(["seq_len", "protocol"], sort=True):
        tasks = sorted(set(at_n.task))
        standings = {t: standing(exact.get((n, t, protocol))) for t in tasks}
        exact_words = ", ".join(f"{t} {accuracy_text(exact[(n, t, protocol)])}"
                                for t in tasks if (n, t, protocol) in exact)  # fmt: skip
        line = f"**At {n_text(n)} ({protocol})**: the exact model answers {exact_words}."
        if beyond := [t for t in tasks if standings[t] == BEYOND]:
            line += (f" Beyond the model at this N (the exact model's interval wholly below {EXACT_FLOOR:.0%}, or no "
                     f"exact row: no verdict on them): {', '.join(beyond)}.")  # fmt: skip
        if undecided := [t for t in tasks if standings[t] == UNDECIDED]:
            line += (f" Kept only because the exact model's interval is too wide to decide (below {EXACT_FLOOR:.0%}, "
                     f"but its interval reaches it): {', '.join(undecided)}.")  # fmt: skip
        lines.append(line)
        here = overall[(overall.seq_len == n) & (overall.protocol == protocol)] if len(overall) else overall
        chosen = here[~here.exact_method] if len(here) else here
        if chosen.empty:
            lines.append("No task within the model at this N: nothing to judge.")
            continue
        reference = here[here.exact_method]
        exact_here = interval_of(reference.iloc[0]) if len(reference) else None
        beside = "" if exact_here is None else f" (the exact model {accuracy_text(exact_here)})"
        for share in sorted(set(chosen.share.dropna()), reverse=True):
            at = chosen[chosen.share == share]
            lines.append(f"- at a budget of {share_text(share)} of the cache{beside}: {_ranked(at, exact_here)}.")
        fixed = chosen[chosen.share.isna()]
        kinds = (("at a setting of its own (not swept over the budgets: a fixed window, an RNN's state)",
                  ~fixed.exact_decoding),
                 ("its own prefill, then exact decoding of the whole cache", fixed.exact_decoding))  # fmt: skip
        for words_for, which in kinds:
            if which.any():
                lines.append(f"- {words_for}{beside}: {_ranked(fixed[which], exact_here)}.")
        if cheapest := cheapest_text(here, exact_here):
            lines.append(cheapest)
    return lines


def cheapest_within(here: pd.DataFrame, exact: Interval, exact_bytes: float) -> pd.DataFrame:
    """The cheapest settings within the exact model's accuracy, from a pooled frame at one N: of the methods that hold
    fewer bytes per token than the exact model's `exact_bytes` (every one with its bytes, where that is unknown) and do
    not lie clearly below it (`below_exact`), those at the fewest bytes held per token (ties within BYTES_TIE, by
    name); empty when none qualifies."""
    cheaper = here[~here.exact_method & here.held_per_token.notna()]
    if exact_bytes == exact_bytes:
        cheaper = cheaper[cheaper.held_per_token < exact_bytes]
    within = cheaper[pd.Series([not below_exact(interval_of(r), exact) for r in cheaper.itertuples()],
                               index=cheaper.index, dtype=bool)]  # fmt: skip
    if within.empty:
        return within
    fewest = within.held_per_token.min()
    return within[within.held_per_token <= fewest * (1 + BYTES_TIE)].sort_values(["method", "share"])


def cheapest_text(here: pd.DataFrame, exact: Interval | None) -> str:
    """The verdict's line on bytes at one N: the setting(s) holding the fewest bytes per token within the exact model's
    accuracy (`cheapest_within`), with family and bytes beside the exact model's; that none qualifies, and why; ''
    without an exact row or without bytes (a run from before the columns)."""
    if exact is None or here.empty or here[~here.exact_method].held_per_token.isna().all():
        return ""
    reference = here[here.exact_method].held_per_token
    exact_bytes = float(reference.iloc[0]) if len(reference) else math.nan
    whole = f"the exact model's {per_token_text(exact_bytes)}"
    head = ("- fewest bytes held per token within the exact model's accuracy (not clearly below its "
            f"{accuracy_text(exact)})")
    best = cheapest_within(here, exact, exact_bytes)
    if best.empty:
        cheaper = here[~here.exact_method & (here.held_per_token < exact_bytes)]
        if cheaper.empty:
            return f"{head}: none; no setting holds fewer bytes per token than {whole}."
        return f"{head}: none; every setting holding fewer bytes per token than {whole} lies clearly below it."
    names = [f"{r.method}{'' if r.share is None or r.share != r.share else ' at ' + share_text(r.share)} ({r.family}) "
             f"{accuracy_text(interval_of(r))}" for r in best.itertuples()]  # fmt: skip
    held = float(best.held_per_token.iloc[0])
    beside = f"{held / exact_bytes:.1%} of {whole}" if exact_bytes == exact_bytes else "the exact model's unknown"
    tied = ", tied" if len(best) > 1 else ""
    return f"{head}: {and_list(names)}{tied}, holding {per_token_text(held)} per token ({beside})."


def _ranked(methods: pd.DataFrame, exact: Interval | None) -> str:
    """`ranking_text` of a pooled frame's methods, each with its cost where the budget does not say it
    (`_cost_note`), then each set against the `exact` model's interval (`exact_comparison_text`) where there is one."""
    figures = {r.method: f"{r.method} {accuracy_text(interval_of(r))}{_cost_note(r)}" for r in methods.itertuples()}
    intervals = {r.method: interval_of(r) for r in methods.itertuples()}
    text = ranking_text(figures, intervals)
    return text if exact is None else f"{text}. {exact_comparison_text(intervals, exact)}"


def _cost_note(row: object) -> str:
    """' (its state 9.0% of the cache)' for a method without a budget; ' (reads 150% of the cache a step)' for one
    whose measured read share is off its budget (`reads_off_budget`); '' for one that reads its budget."""
    share, read = row.share, row.read_share  # type: ignore[attr-defined]
    if share is None or share != share:
        return f" (its state {row.cache_share:.1%} of the cache)"  # type: ignore[attr-defined]
    return f" (reads {format_percent(read)} of the cache a step)" if reads_off_budget(read, share) else ""
