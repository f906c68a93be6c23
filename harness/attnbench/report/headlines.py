"""Plot titles that say the verdict's message: each names the variant the verdict recommends at the largest N
(its answer's `use`), or no variant at all, never one the verdict leaves out. The fastest, the smallest or the
most accurate variant may be one it rejects (over the error budget, no better than averaging V, slower): a title
crowning it would contradict the answer printed above the plot."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.report.text import ratio_text
from attnbench.report.modes import FORWARD, Mode, mib_text
from attnbench.report.verdict import Choice, InputVerdict
from attnbench.runfolder.rows import TENSOR_METHOD

MIB = 2**20
# Variants whose call is one fused kernel (SDPA's, for `full`): in runs whose CPU memory is the live-tensor tracker's
# (before the allocator's figure, attnbench.measure.memory) their peak misses the kernel's scratch: a lower bound.
ONE_FUSED_KERNEL = frozenset({"full"})


@dataclass(frozen=True)
class Headline:
    """What a setting's plot titles may say: the verdict on one input at its largest N, and its choice (None when
    it recommends none)."""

    n: int
    input: str
    baseline: str
    max_error: float
    choice: Choice | None

    @property
    def none_words(self) -> str:
        """': at N=4096 the verdict recommends no variant over full'."""
        return f": at N={self.n} the verdict recommends no variant over {self.baseline}"


def headline_of(judged: list[InputVerdict], source: str) -> Headline | None:
    """The headline from the verdict on input `source` (None when it has no answer)."""
    verdict = next((v for v in judged if v.input == source and v.answers), None)
    if verdict is None:
        return None
    answer = max(verdict.answers, key=lambda a: a.n)
    choice = next((c for c in answer.choices if c.label == answer.use), None) if answer.use else None
    return Headline(answer.n, verdict.input, verdict.baseline, verdict.budget.max_error, choice)


def _choice(headline: Headline | None) -> Choice | None:
    return headline.choice if headline is not None else None


def speedup_title(headline: Headline | None, baseline: str, mode: Mode = FORWARD) -> str:
    choice = _choice(headline)
    if choice is None or choice.speedup != choice.speedup:
        return f"Speedup against {mode.against(baseline)}" + (headline.none_words if headline else "")
    per = " per generated token" if mode.decode else ""
    return (
        f"At N={headline.n}, {choice.label} (the verdict's choice) runs {ratio_text(choice.speedup, '.1f')} as fast{per} as "
        f"{mode.against(baseline)}"
    )


def time_title(headline: Headline | None, mode: Mode = FORWARD) -> str:
    choice = _choice(headline)
    if choice is None:
        return f"Time {mode.per} by N" + (headline.none_words if headline else "")
    against = mode.against(headline.baseline)
    paired = f", {ratio_text(choice.speedup, '.2g')} as fast as {against}" if choice.speedup == choice.speedup else ""
    return (
        f"At N={headline.n}, {choice.label} (the verdict's choice) takes {choice.time_s * 1e3:.3g} ms {mode.per}"
        + paired
    )


def roofline_title(headline: Headline | None, mode: Mode = FORWARD) -> str:
    choice = _choice(headline)
    roofline = "bandwidth roofline" if mode.decode else "roofline"
    if choice is None or not choice.of_roofline > 0:
        return f"Time over {roofline} by N" + (headline.none_words if headline else "")
    times = 1 / choice.of_roofline
    return f"At N={headline.n}, {choice.label} (the verdict's choice) runs at {times:.2g}× its {roofline}"


def memory_lower_bound(rows: pd.DataFrame) -> pd.Series:
    """Per row: is its peak memory a lower bound? (taken by the CPU tracker on a variant run as one fused kernel)"""
    return (rows.mem_method == TENSOR_METHOD) & rows.variant.isin(ONE_FUSED_KERNEL)


def memory_title(rows: pd.DataFrame, headline: Headline | None, mode: Mode = FORWARD) -> str:
    """The memory plot's title: the verdict's choice's peak at the headline's N and its ratio to the baseline's,
    a figure that is only a lower bound (a fused kernel on the CPU) named as one; no variant without a choice. In
    decode, the cache it keeps instead (`cache_title`)."""
    if mode.decode:
        return cache_title(rows, headline)
    choice = _choice(headline)
    at = rows[(rows.status == "ok") & (rows.seq_len == headline.n)] if headline else rows[:0]
    at = at.assign(lower_bound=memory_lower_bound(at)).drop_duplicates("label").set_index("label")
    if choice is None or choice.label not in at.index:
        return "Peak memory per call by N" + (headline.none_words if headline else "")
    own = at.loc[choice.label]
    mib = f"{own.peak_mem_bytes / MIB:.3g} MiB per call"
    text = f"At N={headline.n}, {choice.label} (the verdict's choice) needs " + (
        f"at least {mib} (its fused kernel's scratch unseen)" if own["lower_bound"] else mib
    )
    if headline.baseline in at.index:  # over a baseline figure that is a lower bound, the ratio is an upper one
        base = at.loc[headline.baseline]
        most = "at most " if base["lower_bound"] else ""
        text += f", {most}{ratio_text(own.peak_mem_bytes / base.peak_mem_bytes, '.2g')} {headline.baseline}'s"
        text += f" ({headline.baseline}'s CPU figure is a lower bound)" if base["lower_bound"] else ""
    return text


def cache_title(rows: pd.DataFrame, headline: Headline | None) -> str:
    """The decode cache plot's title: the cache the verdict's choice keeps at the headline's N, beside the
    baseline's; no variant without a choice."""
    choice = _choice(headline)
    at = rows[(rows.status == "ok") & (rows.seq_len == headline.n)] if headline else rows[:0]
    at = at.drop_duplicates("label").set_index("label")
    if choice is None or choice.label not in at.index:
        return "Cache kept by context N" + (headline.none_words if headline else "")
    text = (
        f"At N={headline.n}, {choice.label} (the verdict's choice) keeps a cache of "
        f"{mib_text(at.loc[choice.label, 'cache_bytes'])} MiB"
    )
    if headline.baseline in at.index:
        text += f", vs {mib_text(at.loc[headline.baseline, 'cache_bytes'])} MiB for {headline.baseline}"
    return text


def error_title(headline: Headline | None) -> str:
    choice = _choice(headline)
    if headline is None:
        return "Error vs uniform by N"
    if choice is None or choice.family == "exact" or choice.error != choice.error:
        return (
            f"Error vs uniform by N: at N={headline.n} on {headline.input} the verdict recommends no approximation "
            f"(budget {headline.max_error:g})"
        )
    return (
        f"At N={headline.n} on {headline.input}, {choice.label} (the verdict's choice) has error {choice.error:.2f} "
        f"vs uniform, within the budget {headline.max_error:g}"
    )


def recall_title(recalls: pd.DataFrame) -> str:
    """The recall plot's headline: at the largest N and number of pairs, which non-exact variant retrieves the most
    planted needles, and how many (`recalls`: ok rows with a needle recall)."""
    n, pairs = recalls.seq_len.max(), recalls[recalls.seq_len == recalls.seq_len.max()].needle_pairs.max()
    at = recalls[(recalls.seq_len == n) & (recalls.needle_pairs == pairs) & (recalls.family != "exact")]
    if at.empty:
        return "Needle recall by N"
    best = at.loc[at.needle_accuracy.idxmax()]
    return (
        f"At N={n} with {pairs:.0f} needles, {best.label} retrieves the most of the non-exact variants: "
        f"{100 * best.needle_accuracy:.0f}%"
    )
