"""The answer first: for each setting, input and N, which variant to use, how much faster and smaller it is
than the baseline, and what it costs in accuracy.

A setting is every group column but input and N. Its time and memory come from its timed rows (its first
input, unless every input was timed); each input's error from its own rows. Per N the verdict names the
fastest exact variant and the speed-error Pareto set of the approximations within the accuracy budget
(attnbench.plan.budget: error vs uniform on that input at most `max_error`; a variant leaves the set only when
another is at least as accurate and faster beyond the noise, paired in their own rounds),
each with its paired speedup interval, error vs uniform and peak memory, and when it starts to pay off
(the crossover N against the baseline). "Use X" names the fastest of them clearly faster than the baseline; with
`min_speedup` asked, the least error among those at least that much faster. One sentence per input says what its
error figures can tell.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, replace

import pandas as pd

from attnbench.inputs.catalogue import LOCALITY_WINDOW
from attnbench.plan.budget import UNIFORM_EQUIVALENT, AccuracyBudget
from attnbench.report.analysis import ERROR_RESOLUTION, crossover_table, implausible_timings
from attnbench.report.modes import DECODE_NOTE, FORWARD, Mode, mib_text, mode_of, ms_text
from attnbench.report.unusable import unusable_mask, unusable_sentence, usable
from attnbench.report.text import (
    GROUP_COLUMNS,
    MACHINE,
    aligned_table,
    baseline_of,
    format_number,
    format_percent,
    interval_kind,
    interval_text,
    markdown_table,
    ratio_text,
    recall_text,
    speedup_text,
    with_machine,
)
from attnbench.stats import CONFIDENCE, beyond_noise, paired_speedup, trusted

MIB = 2**20
SETTING_COLUMNS = [c for c in GROUP_COLUMNS if c != "input"] + [MACHINE]  # what a timing is shared across inputs by
NEAR_UNIFORM_ENTROPY = 0.88  # above this, averaging V is already close to exact attention
PEAKED_ENTROPY = 0.45


@dataclass
class Choice:
    """One variant setting in a verdict: its speed and memory (from the timed rows) and its error on the input."""

    label: str
    family: str
    speedup: float
    speedup_low: float
    speedup_high: float
    error: float  # err_vs_uniform on this input (NaN when error was not measured)
    memory_bytes: float  # the memory its mode weighs (attnbench.report.modes): peak per call; decode: the cache at N
    memory_ratio: float  # to the baseline's at the same N
    pays_off: str  # N from which it is faster than the baseline, e.g. "≈ 700", "≤ 256", "> 4096"
    time_s: float = float("nan")  # median time per call
    of_roofline: float = float("nan")  # its share of the roofline of the work it counts (report.analysis.of_roofline)
    noisy: bool = False  # its timing is flagged noisy
    rounds: tuple[float, ...] = ()  # its per-call time in each round of its group (samples.csv), round order
    coverage: float = float("nan")  # its speedup interval's coverage (NaN: a bootstrap's nominal 95%)
    prefill_s: float = float("nan")  # decode: the prompt's one call, timed once (NaN in other modes)
    fastest_exact: bool = False
    left_out: str = ""  # why it is not offered as a choice ("" when it is)
    ties: list[str] = field(default_factory=list)  # more accurate choices it is not faster than beyond noise
    approximates: bool = True  # False: a different operator from softmax (its error is no reason to use it)
    recall: float = float("nan")  # needle recall at this N: the least over the setting's `needles` inputs (NaN: none)

    @property
    def speed(self) -> float:
        """The paired speedup, or 1 / time where the baseline did not run."""
        return self.speedup if self.speedup == self.speedup else 1 / self.time_s

    @property
    def trusted_interval(self) -> bool:
        """Whether its interval is a 95% one (fewer than 6 rounds give min–max at a lower coverage)."""
        return trusted(self.coverage)

    @property
    def clearly_faster(self) -> bool:
        """Faster than the baseline beyond its 95% interval (an interval of lower coverage names no winner)."""
        return beyond_noise(self.speedup_low, self.speedup_high, self.coverage) == "faster"

    @property
    def no_better_than_uniform(self) -> bool:
        """An approximation whose error buys nothing over averaging V (error vs uniform ≈ 1 or above)."""
        return self.family != "exact" and self.error == self.error and self.error >= UNIFORM_EQUIVALENT

    @property
    def error_rank(self) -> float:
        """Error for ranking: exact attention and unmeasured error count as 0, float rounding ties."""
        if self.family == "exact" or self.error != self.error:
            return 0.0
        return max(self.error, ERROR_RESOLUTION)


@dataclass
class Answer:
    """The verdict at one N: what to use, in one sentence, the offered choices and the rest with their reasons."""

    n: int
    choices: list[Choice]  # offered: the fastest exact variant first, then the rest of the Pareto set by speed
    left_out: list[Choice] = field(default_factory=list)  # each with its `left_out` reason
    sentence: str = ""  # "Use X, the fastest within the error budget …" or "Nothing beats <baseline> here: ..."
    use: str = ""  # the label the sentence recommends ("" when it recommends none): what plot titles may headline
    asked: str = ""  # the answer to `min_speedup` ("" when not asked)
    retrieval_use: str | None = None  # with a retrieval answer (`with_retrieval`): the label it recommends, or ""


@dataclass
class InputVerdict:
    """The verdict for one setting and input, N by N."""

    setting: str  # the setting in words
    input: str
    baseline: str
    sentence: str  # what this input's error figures can tell
    timed_on: str  # the input whose timing the speedups come from
    answers: list[Answer] = field(default_factory=list)
    setting_key: tuple[str, ...] = ()  # the setting's values (SETTING_COLUMNS), as text: which rows it judged
    budget: AccuracyBudget = field(default_factory=AccuracyBudget)  # what it was judged with
    mode: Mode = FORWARD  # its setting's mode: what its times are per and which memory it weighs


def setting_words(values: pd.Series, varying: set[str]) -> str:
    """'cpu, float32, forward, non-causal, batch 1 × 8 heads × head_dim 64' (+ the axes a run varies); the mode in
    its words (attnbench.report.modes): 'decode (per generated token, after a prompt of N)'."""
    parts = [
        str(values["device"]),
        str(values["dtype"]),
        mode_of(values["mode"]).words,
        "causal" if str(values["causal"]) == "True" else "non-causal",
        f"batch {values['batch']} × {values['heads']} heads × head_dim {values['head_dim']}",
    ]
    if values.get("value_dim"):
        parts.append(f"value_dim {values['value_dim']}")
    if values.get("kv_len"):
        parts.append(f"{values['kv_len']} keys")
    if values.get("padding") or "padding" in varying:
        parts.append(f"padding {float(values['padding']):g}")
    if "seed" in varying:
        parts.append(f"seed {values['seed']}")
    if MACHINE in varying:  # a run over several kinds of machine: each verdict names its own
        parts.append(f"on {values[MACHINE]}")
    return ", ".join(parts)


def input_sentence(rows: pd.DataFrame) -> str:
    """What the input's error figures can tell, from the exact attention's statistics on it."""
    if not (rows.status == "ok").any():
        reasons: dict[str, list[str]] = {}
        for row in rows.itertuples():
            reasons.setdefault(f"{row.status}: {row.reason}", []).append(row.label)
        listed = "; ".join(f"{', '.join(dict.fromkeys(labels))} {why}" for why, labels in reasons.items())
        return f"No cell ran ok on this input. {listed}."
    stats = rows.dropna(subset=["input_entropy"])
    if stats.empty:
        return "Error was not measured on this input."
    if str(rows.input.iloc[0]).startswith("needles") and (rows["mode"] == "decode").all():
        return (
            "This input's decode steps are its needles' probes (all of them when pairs = decode_steps), each attending "
            "its needle by construction: error and attention statistics here describe them more than the context; "
            "read this input's needle recall."
        )
    entropy = stats.input_entropy.mean()

    def figures_of(at: pd.DataFrame) -> str:
        local, sink, spread = at.input_band_mass.mean(), at.input_sink_mass.mean(), at.input_head_spread.mean()
        return (
            f"entropy {at.input_entropy.mean():.2f} of uniform, {format_number(100 * local, '.0f')}% of the mass "
            f"within ±{LOCALITY_WINDOW} positions, {format_number(100 * sink, '.0f')}% on the first token"
            + (f", heads differing by {spread:.2f}" if spread == spread and spread >= 0.05 else "")
        )

    by_n = list(stats.groupby("seq_len"))
    if len(by_n) == 1:
        figures = figures_of(stats)
    else:  # the statistics move with N (locality falls as N grows): each N its own, never one average
        figures = "; ".join(f"at N={n}: {figures_of(at)}" for n, at in by_n)
    if entropy >= NEAR_UNIFORM_ENTROPY:
        return (
            f"Attention on this input is near-uniform ({figures}): averaging V is already close to exact, so "
            "accuracy barely separates the variants; judge accuracy on a structured input (heads, realistic, captured)."
        )
    shape = "peaked" if entropy < PEAKED_ENTROPY else "structured"
    return (
        f"Attention on this input is {shape} ({figures}): error separates the variants; below 1 a variant "
        "beats averaging V, above 1 it does worse."
    )


def _short_crossover(text: str) -> str:
    """'N ≈ 1,234 (between …)' -> '≈ 1,234'; 'already at N=256 …' -> '≤ 256'; 'not within … (N ≤ 4096)' -> '> 4096';
    'not monotone: …' -> 'not monotone'; an interpolated N with a dip before it -> '≈ 1,234 (not monotone)'; what
    the intervals add: '≈ 1,234, clear ≥ 4,096' (beyond noise only from there) or '≈ 1,234, within noise'."""
    if "beyond noise from N=" in text:
        clear = f", clear ≥ {int(float(text.split('beyond noise from N=')[1].split()[0].rstrip(';)'))):,}"
    elif "not faster beyond noise" in text:
        clear = ", within noise"
    else:
        clear = ""
    if text.startswith("N ≈"):
        return "≈ " + text.split()[2] + (" (not monotone)" if "not monotone" in text else "") + clear
    if text.startswith("already at N="):
        return "≤ " + text.split("N=")[1].split()[0] + clear
    if text.startswith("not within"):
        return "> " + text.rsplit("≤ ", 1)[1].rstrip(")")
    if text.startswith("not monotone"):
        return "not monotone"
    return "–"


def _speed_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The timed ok rows whose times may be read (not the scheduler's: `report.unusable`): the speed and memory of
    each setting, input, variant and N."""
    timed = usable(frame[(frame.status == "ok") & frame.time_median_s.notna()])
    return timed.drop_duplicates(SETTING_COLUMNS + ["input", "label", "seq_len"])


def timed_input(timed: pd.DataFrame, source: str) -> str:
    """The input whose timed rows judge `source`: itself if it was timed, else its setting's first timed input."""
    if (timed["input"] == source).any():
        return source
    return str(timed["input"].iloc[0]) if len(timed) else ""


def setting_key(values: tuple) -> tuple[str, ...]:
    """A setting's group key (values of SETTING_COLUMNS) as text, so that a missing value equals itself."""
    return tuple(str(v) for v in values)


def verdicts(
    frame: pd.DataFrame, samples: dict[str, list[float]] | None = None, budget: AccuracyBudget | None = None
) -> list[InputVerdict]:
    """Every setting × input of a run's rows, N by N, in the order the run measured them. An input that was
    timed itself is judged on its own speed; one whose error alone was measured, on its setting's first
    timed input's. Each input's verdict holds the accuracy `budget` to that input's own error. `samples` (cell
    key -> per-round seconds, `read_samples`) lets two variants be compared in their own rounds; without it, by
    their intervals against the baseline."""
    budget = budget or AccuracyBudget()
    if frame.empty:
        return []
    samples = samples or {}
    frame = with_machine(frame)
    baseline = baseline_of(frame)
    varying = {c for c in SETTING_COLUMNS if frame[c].nunique(dropna=False) > 1}
    speed = _speed_rows(frame)
    scheduler_bound = frame[unusable_mask(frame)]  # timed rows whose times were the scheduler's: no verdict from them
    out = []
    for setting, rows in frame.groupby(SETTING_COLUMNS, sort=False, dropna=False):
        key = setting_key(setting)
        timed = _of_setting(speed, setting)
        bound = _of_setting(scheduler_bound, setting)
        words = setting_words(rows.iloc[0], varying)
        mode = mode_of(rows.iloc[0]["mode"])
        recalls = needle_recalls(rows)
        for source, on_input in rows.groupby("input", sort=False):
            timed_on = timed_input(timed, source)
            own = timed[timed["input"] == timed_on]
            crossings = crossover_table(own, baseline) if len(own) else pd.DataFrame()
            pays_off = (
                {r.label: _short_crossover(r.faster_from) for r in crossings.itertuples()} if len(crossings) else {}
            )
            sentence = input_sentence(on_input)
            if said := unusable_sentence(bound[bound["input"] == timed_input(bound, source)]):
                sentence += " " + said
            contradicted = contradicted_lengths(own)
            verdict = InputVerdict(
                words, str(source), baseline, sentence, str(timed_on), setting_key=key, budget=budget, mode=mode
            )
            for n, at_n in on_input[on_input.status == "ok"].groupby("seq_len"):
                candidates = _candidates(at_n, own[own.seq_len == n], baseline, pays_off, samples, mode.memory)
                for c in candidates:
                    c.recall = recalls.get((c.label, int(n)), float("nan"))
                answer = judge(int(n), candidates, baseline, budget, str(source), mode)
                if answer is not None and weighs_retrieval(candidates, budget):
                    answer = with_retrieval(answer, candidates, baseline, budget, str(source), mode)
                if answer is not None and int(n) in contradicted:
                    answer = withheld(answer, contradicted[int(n)])
                if answer is not None:
                    verdict.answers.append(answer)
            out.append(verdict)
    return out


def _of_setting(rows: pd.DataFrame, setting: tuple) -> pd.DataFrame:
    """The rows of one setting (its values of SETTING_COLUMNS; a missing value matches a missing one)."""
    for column, value in zip(SETTING_COLUMNS, setting):
        rows = rows[rows[column] == value] if value == value else rows[rows[column].isna()]
    return rows


def contradicted_lengths(timed: pd.DataFrame) -> dict[int, list[str]]:
    """N -> the phrases of the implausible timings that implicate it (report.analysis.implausible_timings). Of a
    pair, the N that contradicts more of its neighbours is the odd one (a slow N=1024 between agreeing 512 and
    2048); where both contradict as many, both: nothing says which group ran on the changed machine."""
    pairs = implausible_timings(timed) if len(timed) else []
    counts: dict[int, int] = {}
    for odd in pairs:
        for n in (odd.short, odd.long):
            counts[n] = counts.get(n, 0) + 1
    found: dict[int, list[str]] = {}
    for odd in pairs:
        most = max(counts[odd.short], counts[odd.long])
        for n in (odd.short, odd.long):
            if counts[n] == most:
                found.setdefault(n, []).append(odd.phrase)
    return found


def withheld(answer: Answer, phrases: list[str]) -> Answer:
    """The answer at an N whose timings contradict another N's: its figures stay in the table, its sentence says
    why nothing is concluded from them and what to do, and it recommends nothing (no plot headlines it)."""
    named = "; ".join(dict.fromkeys(phrases))
    sentence = (
        f"No conclusion at this N: its timings are implausible ({named}), so the machine changed between those "
        f"groups; measure N={answer.n} again in one run (the figures below are as timed)."
    )
    return replace(answer, sentence=sentence, use="", asked="")


def needle_recalls(rows: pd.DataFrame) -> dict[tuple[str, int], float]:
    """(label, N) -> the variant's needle recall in one setting's rows: the least over its `needles` inputs (a user
    asking "recall >= 90% at my N" means at every number of pairs tried)."""
    measured = rows[(rows.status == "ok") & rows.needle_accuracy.notna()]
    least = measured.groupby(["label", "seq_len"]).needle_accuracy.min()
    return {(str(label), int(n)): float(value) for (label, n), value in least.items()}


MIN_PAIRED_ROUNDS = 6  # rounds two variants need in common: from 6 the order-statistic interval covers >= 95%


def faster_beyond_noise(a: Choice, b: Choice) -> bool:
    """Whether `a` is faster than `b` beyond the noise: the interval of b's time over a's, round by round (the
    same rounds, so a slow stretch of the machine cancels), lies above 1. Without both variants' rounds, a's
    speedup interval against the baseline must lie wholly above b's; with neither, nothing is beyond noise."""
    common = min(len(a.rounds), len(b.rounds))
    if common >= MIN_PAIRED_ROUNDS:
        return paired_speedup(list(b.rounds[:common]), list(a.rounds[:common])).low > 1
    if a.speedup == a.speedup and b.speedup == b.speedup and a.trusted_interval and b.trusted_interval:
        return a.speedup_low > b.speedup_high
    return False


def _dominates(a: Choice, b: Choice) -> bool:
    """The README's rule: `a` is at least as accurate as `b` and faster beyond the noise. A third variant's
    noise plays no part: only a and b's own rounds decide. An approximation never dominates exact attention
    (its unmeasured error is not "at least as accurate")."""
    if b.family == "exact" and a.family != "exact":
        return False
    return a.error_rank <= b.error_rank and faster_beyond_noise(a, b)


def pareto_set(candidates: list[Choice]) -> list[Choice]:
    """The candidates no other candidate dominates, fastest first: the one rule behind the verdict, its plots'
    frontiers and their titles. A member that a more accurate member is not slower than beyond noise is a tie
    (`ties` names them): the two differ in accuracy, and their speeds cannot be told apart."""
    front = [c for c in candidates if not any(_dominates(other, c) for other in candidates if other is not c)]
    for c in front:
        more_accurate = [o for o in front if o is not c and o.error_rank < c.error_rank]
        c.ties = [o.label for o in more_accurate if not faster_beyond_noise(c, o)]
    return sorted(front, key=lambda c: -c.speed)


def fastest(candidates: list[Choice]) -> list[Choice]:
    """The candidates no other candidate is faster than beyond noise (`faster_beyond_noise`), fastest first: what
    "fastest" means wherever a report says it (bold times, plot titles), by the verdict's own rule."""
    leaders = [c for c in candidates if not any(faster_beyond_noise(o, c) for o in candidates if o is not c)]
    return sorted(leaders, key=lambda c: -c.speed)


def fastest_labels(rows: pd.DataFrame, samples: dict[str, list[float]] | None = None) -> list[str]:
    """`fastest` among the timed rows of one comparison group at one N (one row per label), fastest first; none
    from times marked unusable."""
    timed = usable(rows[(rows.status == "ok") & rows.time_median_s.notna()]).drop_duplicates("label")
    if timed.empty:
        return []
    return [c.label for c in fastest(_candidates(timed, timed, baseline_of(timed), {}, samples or {}))]


def _candidates(
    errors: pd.DataFrame,
    timed: pd.DataFrame,
    baseline: str,
    pays_off: dict[str, str],
    samples: dict[str, list[float]],
    memory: str = "peak_mem_bytes",
) -> list[Choice]:
    """Every variant with an ok row at one N, its speed and `memory` (the column its mode weighs) from `timed` and
    its error from `errors`. Speed is the paired speedup (or, where the baseline did not run, 1 / time); its rounds
    from `samples`."""
    speed = timed.set_index("label")
    base_memory = speed[memory].get(baseline, float("nan")) if len(speed) else float("nan")
    candidates = []
    for row in errors.itertuples():
        if row.label not in speed.index:
            continue
        s = speed.loc[row.label]
        held = float(s[memory]) if pd.notna(s[memory]) else float("nan")
        paired = pd.notna(s.speedup)
        candidates.append(
            Choice(
                label=row.label,
                family=str(s.family),
                approximates=bool(s.get("approximates_softmax", True)),
                speedup=float(s.speedup) if paired else float("nan"),
                speedup_low=float(s.speedup_low) if paired else float("nan"),
                speedup_high=float(s.speedup_high) if paired else float("nan"),
                error=float(row.err_vs_uniform) if pd.notna(row.err_vs_uniform) else float("nan"),
                memory_bytes=held,
                memory_ratio=held / base_memory if base_memory and base_memory == base_memory else float("nan"),
                pays_off="–" if row.label == baseline else pays_off.get(row.label, "–"),
                time_s=float(s.time_median_s),
                of_roofline=float(s.of_roofline) if pd.notna(s.get("of_roofline")) else float("nan"),
                noisy=bool(s.noisy),
                # a cell timed in several processes has no rounds shared with the others: compared by interval
                rounds=tuple(samples.get(str(s.cell_key), ())) if not (s.get("processes") or 1) > 1 else (),
                coverage=float(s.speedup_coverage) if pd.notna(s.get("speedup_coverage")) else float("nan"),
                prefill_s=float(s.prefill_s) if pd.notna(s.get("prefill_s")) else float("nan"),
            )
        )
    return candidates


def _fastest_exact(exact: list[Choice], baseline: str) -> Choice | None:
    """The exact variant to offer: the baseline, unless another exact variant is faster beyond its interval
    (a speedup whose interval spans 1 names no winner); with no baseline here, the fastest."""
    base = next((c for c in exact if c.label == baseline), None)
    faster = [c for c in exact if c is not base and c.clearly_faster]
    if base is not None and not faster:
        return base
    return fastest(faster or exact)[0] if exact else None


def weighs_retrieval(candidates: list[Choice], budget: AccuracyBudget) -> bool:
    """The run measured needle recall at this N for an approximation and the user asked no recall of their own: the
    verdict answers both uses it measured, continuation (error alone) and retrieval (`AccuracyBudget.for_retrieval`)."""
    return budget.min_recall is None and any(c.family != "exact" and c.recall == c.recall for c in candidates)


CONTINUATION = "For continuation (error alone): "
RETRIEVAL = "For retrieval (needle recall at least {recall}): "


def with_retrieval(
    answer: Answer, candidates: list[Choice], baseline: str, budget: AccuracyBudget, on: str, mode: Mode
) -> Answer:
    """`answer` (error alone) and the same candidates judged again asking needle recall, both said: 'For
    continuation (error alone): Use X … For retrieval (needle recall at least 90%): Nothing beats full here: …'. The
    offered choices and reasons stay the continuation answer's (the table shows each one's recall beside them)."""
    fresh = [replace(c, left_out="", ties=[], fastest_exact=False) for c in candidates]
    strict = budget.for_retrieval
    retrieval = judge(answer.n, fresh, baseline, strict, on, mode)
    assert retrieval is not None  # the same candidates: never none
    label = RETRIEVAL.format(recall=recall_text(strict.min_recall or 0.0))
    both = [f"{prefix}{one.sentence}" + (f" {one.asked}" if one.asked else "")
            for prefix, one in ((CONTINUATION, answer), (label, retrieval))]  # each use's answer, then its --min-speedup's
    return replace(answer, sentence=" ".join(both), asked="", retrieval_use=retrieval.use)


def over_budget(c: Choice, budget: AccuracyBudget) -> bool:
    """An approximation whose measured error vs uniform exceeds the budget (exact attention never does; an
    unmeasured error is not known to)."""
    return c.family != "exact" and c.error == c.error and c.error > budget.max_error


def judge(
    n: int,
    candidates: list[Choice],
    baseline: str,
    budget: AccuracyBudget | None = None,
    on: str = "",
    mode: Mode = FORWARD,
) -> Answer | None:
    """The verdict at one N: the fastest exact variant and the speed-error Pareto set of the approximations within
    the accuracy budget that beat averaging V (their error on the input `on`), every other candidate with its reason,
    the answer in one sentence (in `mode`'s words: per generated token and the cache, in decode), and the answer to
    `budget.min_speedup` where it is asked."""
    if not candidates:
        return None
    budget = budget or AccuracyBudget()
    exact = [c for c in candidates if c.family == "exact"]
    fastest_exact = _fastest_exact(exact, baseline)
    for c in exact:
        if c is not fastest_exact:
            slower = c.speed < fastest_exact.speed
            c.left_out = f"exact, slower than {fastest_exact.label}" if slower else (
                f"exact like {fastest_exact.label}, not faster beyond noise"
            )
    for c in candidates:
        if not c.approximates:
            c.left_out = DIFFERENT_OPERATOR
        elif c.no_better_than_uniform:
            c.left_out = "worse than averaging V" if c.error >= 1.05 else "no better than averaging V"
        elif over_budget(c, budget):
            c.left_out = f"{OVER_BUDGET} {budget.max_error:g}"
        elif lacks_recall(c, budget):
            measured = c.recall == c.recall
            c.left_out = f"{BELOW_RECALL} {recall_text(budget.min_recall)}" if measured else RECALL_UNMEASURED
    contenders = [c for c in candidates if not c.left_out]
    front = pareto_set(contenders)
    for c in contenders:
        if c not in front:
            dominators = [o for o in contenders if o is not c and _dominates(o, c)]  # never empty: c is not in front
            by = min(dominators, key=lambda o: (o not in front, o.speed))  # the nearest choice that beats it
            accuracy = " and not more accurate" if c.error == c.error else ""  # no claim without an error
            c.left_out = f"slower than {by.label} beyond noise{accuracy}"
    if fastest_exact is not None:
        fastest_exact.fastest_exact = True
    chosen = [c for c in front if c is not fastest_exact]
    offered = ([fastest_exact] if fastest_exact else []) + chosen
    left_out = sorted((c for c in candidates if c.left_out), key=lambda c: -c.speed)
    use = recommended(offered, baseline)
    sentence = answer_sentence(offered, left_out, baseline, budget, on, mode)
    operators = [c for c in left_out if not c.approximates and c.clearly_faster]
    if use is None and operators:  # "nothing beats the baseline" must not hide a faster operator of another kind
        listed = ", ".join(f"{c.label} ({_speed(c)})" for c in operators)
        sentence += f" Faster, but different operators from softmax (not judged on error): {listed}."
    return Answer(
        n,
        offered,
        left_out,
        sentence,
        use=use.label if use else "",
        asked=asked_sentence(candidates, baseline, budget, on, mode),
    )


OVER_BUDGET = "over the error budget"  # a left-out reason: its error vs uniform exceeds the budget
# a left-out reason: gated linear attention and other operators a model is trained with, not approximations of
# softmax; their error vs softmax is shown, never a reason to use them
DIFFERENT_OPERATOR = "a different operator from softmax: not judged on its error"
BELOW_RECALL = "needle recall below"  # a left-out reason: it retrieves fewer planted needles than `min_recall` asks
RECALL_UNMEASURED = "needle recall not measured at this N (--min-recall asked for it)"


def lacks_recall(c: Choice, budget: AccuracyBudget) -> bool:
    """With `min_recall` asked, an approximation whose needle recall is below it, or was not measured at its N (the
    user asked for recall: an unmeasured one is not offered as meeting it); exact attention recalls by definition."""
    if c.family == "exact" or budget.min_recall is None:
        return False
    return c.recall != c.recall or c.recall < budget.min_recall


def recommended(offered: list[Choice], baseline: str) -> Choice | None:
    """The variant "Use X" names: the fastest offered approximation (all within the budget) whose error was measured
    and which is faster than the baseline beyond its 95% interval; else an exact variant that is; else none."""
    winners = [c for c in offered if c.family != "exact" and c.clearly_faster and c.error == c.error]
    if winners:
        return winners[0]  # the fastest of the Pareto set
    return next((c for c in offered if c.family == "exact" and c.label != baseline and c.clearly_faster), None)


def _on(on: str) -> str:
    """' on `realistic`': the input an error comes from ('' when not given)."""
    return f" on `{on}`" if on else ""


def answer_sentence(
    offered: list[Choice],
    left_out: list[Choice],
    baseline: str,
    budget: AccuracyBudget | None = None,
    on: str = "",
    mode: Mode = FORWARD,
) -> str:
    """'Use X, the fastest within the error budget 0.5: 3.1× [2.9–3.4] faster than full at error 0.12 vs uniform on
    `realistic`.' or 'Nothing beats full here: …', naming the input the error comes from. In decode: 'Use X, the
    fastest step within …: 3.1× […] faster per generated token than full's KV cache at error …, cache 0.5 MiB vs
    16 MiB.'"""
    budget = budget or AccuracyBudget()
    within = f"the error budget {budget.max_error:g}"
    base, per = mode.against(baseline), " per generated token" if mode.decode else ""
    reference = next((c for c in offered + left_out if c.label == baseline), None)

    def memory(c: Choice) -> str:
        return _memory(c, mode, reference)

    approximate = [c for c in offered if c.family != "exact"]
    paired = any(c.speedup == c.speedup for c in offered)
    if not offered:  # no exact variant ran, and every approximation is left out
        why = "; ".join(f"{c.label}: {c.left_out}" for c in left_out)
        return f"Nothing to recommend here: no exact variant ran and every other is left out ({why})."
    if not paired:  # the fastest by the one rule (`fastest`), and any it does not beat beyond noise
        lead, *ties = fastest(offered)
        tied = f" ({', '.join(c.label for c in ties)} within noise of it)" if ties else ""
        return (
            f"Fastest of the choices: {lead.label} ({format_number(lead.time_s * 1e3, '.3g')} ms {mode.per}){tied}; "
            f"{baseline} did not run here."
        )
    use = recommended(offered, baseline)
    over = [c for c in left_out if c.left_out.startswith(OVER_BUDGET)]
    if use is not None and use.family != "exact":
        text = (
            f"Use {use.label}, the fastest{' step' if mode.decode else ''} within {within}: {_speed(use)} faster{per} "
            f"than {base} at error {_error(use)} vs uniform{_on(on)}{_recalled(use)}{memory(use)}"
        )
        winners = [c for c in approximate if c.clearly_faster and c.error == c.error]
        accurate = min(winners, key=lambda c: c.error_rank)
        if accurate is not use:
            text += f"; {accurate.label} is more accurate ({_error(accurate)}) at {_speed(accurate)}"
        faster = [c for c in over if c.speed > use.speed]
        if faster:
            lead = faster[0]
            text += f"; {lead.label} is faster ({_speed(lead)}) but over the budget (error {_over(lead)})"
        return text + "."
    if use is not None:
        return f"Use {use.label}: exact, {_speed(use)} faster{per} than {base}{memory(use)}."
    unmeasured = [c for c in approximate if c.clearly_faster]  # recommended() takes every measured one
    if unmeasured:
        lead = unmeasured[0]
        return (
            f"Nothing measured within {within} beats {base} here: {lead.label} is {_speed(lead)} faster, but its "
            "error was not measured, so it cannot be checked against the budget."
        )
    judged = [c for c in approximate + left_out if c.family != "exact" and c.approximates and c.error == c.error]
    if judged and not any(not over_budget(c, budget) and not c.no_better_than_uniform for c in judged):
        least = min(judged, key=lambda c: c.error)
        useless = f" ({least.left_out})" if least.no_better_than_uniform else ""
        speed = f", at {_speed(least)}" if least.speedup == least.speedup else ""
        return (
            f"Nothing within {within} beats {base} here: no approximation has error vs uniform{_on(on)} of "
            f"{budget.max_error:g} or less; the least is {least.label}'s {_over(least)}{useless}{speed}."
        )
    maybe = [c for c in approximate if c.speedup > 1]  # offered, faster by the median, but its interval reaches 1×
    slower = [c.label for c in approximate if c.speedup <= 1]
    slower += [c.label for c in left_out if c.family != "exact" and c.left_out.startswith("slower")]
    useless = [c.label for c in left_out if "averaging V" in c.left_out]
    forgetful = [f"{c.label} {recall_text(c.recall)}" if c.recall == c.recall else c.label
                 for c in left_out if c.left_out.startswith(BELOW_RECALL) or c.left_out == RECALL_UNMEASURED]  # fmt: skip
    reasons = []
    if slower:
        reasons.append(f"slower ({', '.join(slower)})")
    if over:
        reasons.append(f"over {within}{_on(on)} ({', '.join(c.label for c in over)})")
    if useless:
        reasons.append(f"no better than averaging V{_on(on)} ({', '.join(useless)})")
    if forgetful:
        reasons.append(f"below the needle recall asked, {recall_text(budget.min_recall)}, or unmeasured ({', '.join(forgetful)})")
    if maybe:
        perhaps = ", ".join(f"{c.label} ({_speed(c)})" for c in maybe)
        others = "; the other approximate variants are " + " or ".join(reasons) if reasons else ""
        verb = "is" if len(maybe) == 1 else "are"
        return (
            f"Nothing clearly beats {base} here: {perhaps} {verb} faster by the median, but the interval "
            f"({_kinds(maybe)}) reaches 1×{others}."
        )
    because = ": the approximate variants are " + " or ".join(reasons) if reasons else ""
    return f"Nothing beats {base} here{because}."


def asked_sentence(
    candidates: list[Choice], baseline: str, budget: AccuracyBudget, on: str = "", mode: Mode = FORWARD
) -> str:
    """The answer to `min_speedup` S ('' when not asked): of the variants at least S× faster than the baseline beyond
    noise (their whole 95% interval at or above S), the one with the least error, and whether the budget holds it;
    or that none is, and the fastest."""
    if budget.min_speedup is None:
        return ""
    ask = budget.min_speedup
    per = " per generated token" if mode.decode else ""
    question = f"At least {ask:g}× faster{per} than {mode.against(baseline)}"
    # a different operator from softmax is no answer to "which to use" (the verdict leaves it out)
    paired = [c for c in candidates if c.speedup == c.speedup and c.label != baseline and c.approximates]
    forgetful = [c.label for c in paired if lacks_recall(c, budget)]  # recall asked: below it, or not measured
    paired = [c for c in paired if not lacks_recall(c, budget)]
    if forgetful:
        question += f" (leaving out {', '.join(forgetful)}: needle recall below {recall_text(budget.min_recall)})"
    if not paired and forgetful:
        return f"{question}: none is left."
    if not paired:
        others = any(not c.approximates for c in candidates)
        return f"{question}: no speedup against {baseline} was measured here{' but of other operators' if others else ''}."
    fast = [c for c in paired if c.trusted_interval and c.speedup_low >= ask]
    known = [c for c in fast if c.family == "exact" or c.error == c.error]
    if known:
        best = min(known, key=lambda c: (c.error_rank, -c.speed))
        if best.family == "exact":
            return f"{question}, least error: {best.label}, exact, at {_speed(best)}."
        if best.no_better_than_uniform:
            standing = "no better than averaging V"
        elif over_budget(best, budget):
            standing = f"over the error budget {budget.max_error:g}: not recommended"
        else:
            standing = f"within the error budget {budget.max_error:g}"
        shown = _over(best) if over_budget(best, budget) else _error(best)
        return (
            f"{question}, least error: {best.label}, error {shown} vs uniform{_on(on)} ({standing}), at {_speed(best)}."
        )
    if fast:
        listed = ", ".join(f"{c.label} ({_speed(c)})" for c in fast)
        return f"{question}: {listed}, but no error was measured to rank {'them' if len(fast) > 1 else 'it'} by."
    lead = max(paired, key=lambda c: c.speedup)
    error = f", error {_error(lead)}" if lead.family != "exact" and lead.error == lead.error else ""
    return f"{question}: none is, beyond noise; the fastest is {lead.label} at {_speed(lead)}{error}."


def _recalled(c: Choice) -> str:
    """', needle recall 6.2%' where the run measured it at this N ('' where not): said beside any "Use X"."""
    return f", needle recall {recall_text(c.recall)}" if c.recall == c.recall else ""


def _kinds(choices: list[Choice]) -> str:
    """What the choices' speedup intervals are: '95% CI', or 'min–max of 3 rounds, coverage 75%' (the widest kind)."""
    return interval_kind(min((c.coverage for c in choices if c.coverage == c.coverage), default=CONFIDENCE))


def _speed(c: Choice) -> str:
    return interval_text(c.speedup, c.speedup_low, c.speedup_high, ".3g")


def _error(c: Choice) -> str:
    return format_number(c.error, ".2g")


def _over(c: Choice) -> str:
    """An error beside the budget it exceeds: three digits, so 0.503 never reads as a budget of 0.5."""
    return format_number(c.error, ".3g")


def _memory(c: Choice, mode: Mode = FORWARD, baseline: Choice | None = None) -> str:
    """', 0.5× the peak memory of a call' (a forward's: a cache held is decode's); in decode the caches side by side: ', cache 0.508 MiB vs 16 MiB' ('' when unknown)."""
    ratio = c.memory_ratio
    if mode.decode and c.memory_bytes == c.memory_bytes:
        if baseline is not None and baseline.memory_bytes == baseline.memory_bytes:
            return f", cache {mib_text(c.memory_bytes)} MiB vs {mib_text(baseline.memory_bytes)} MiB"
        return f", cache {mib_text(c.memory_bytes)} MiB"
    return f", {ratio_text(ratio, '.2g')} the peak memory of a call" if ratio == ratio else ""  # not a cache kept


VERDICT_HEADERS = [
    "variant",
    "speedup vs {baseline} [95% CI]",
    "error vs uniform",
    "peak MiB (× {baseline})",
    "of roofline",
    "faster from N",
]
DECODE_HEADERS = [  # per generated token; the cache in place of the peak; the prompt's call beside it
    "variant",
    "speedup per token vs {baseline} [95% CI]",
    "error vs uniform",
    "cache MiB (× {baseline})",
    "prefill ms",
    "of bandwidth roofline",
    "faster from N",
]


def verdict_rows(verdict: InputVerdict, answer: Answer) -> tuple[list[str], list[list[str]]]:
    """The choices offered at one N as a table: a row per choice (in decode, its cache and prefill too)."""
    decode = verdict.mode.decode
    headers = [h.format(baseline=verdict.baseline) for h in (DECODE_HEADERS if decode else VERDICT_HEADERS)]
    lowest = min((c.coverage for c in answer.choices if c.coverage == c.coverage), default=CONFIDENCE)
    if lowest < CONFIDENCE:  # min–max of too few rounds: say what the interval is (`text.interval_kind`)
        headers[1] = headers[1].replace("95% CI", interval_kind(lowest))
    rows = []
    for choice in answer.choices:
        name = choice.label + (" (fastest exact)" if choice.fastest_exact else "")
        name += f" (speed ties {', '.join(choice.ties)})" if choice.ties else ""
        error = "exact" if choice.family == "exact" else error_text(choice.error)
        if choice.speedup == choice.speedup:
            speed = speedup_text(pd.Series(vars(choice))) + (" noisy" if choice.noisy else "")
        else:
            speed = f"– ({format_number(choice.time_s * 1e3, '.3g')} ms; no {verdict.baseline} here)"
        if decode:
            memory = f"{mib_text(choice.memory_bytes)} ({ratio_text(choice.memory_ratio)})"
            prefill = [ms_text(choice.prefill_s)]
        else:
            memory = f"{format_number(choice.memory_bytes / MIB, '.1f')} ({ratio_text(choice.memory_ratio)})"
            prefill = []
        rows.append([name, speed, error, memory, *prefill, format_percent(choice.of_roofline), choice.pays_off])
    if any(c.recall == c.recall for c in answer.choices):  # the run planted needles: each choice's recall beside
        headers.insert(3, RECALL_HEADER)
        for row, choice in zip(rows, answer.choices):
            row.insert(3, recall_text(choice.recall))
    return headers, rows


CROSSOVER_MARKS = {  # a mark in the 'faster from N' column (`_short_crossover`) -> what it means
    "≈": "≈ N: the crossover estimate, where the median speedup reaches 1× (interpolated between the N measured)",
    "≤": "≤ N: faster already at the smallest N measured",
    "> ": "> N: not faster up to the largest N measured",
    "clear ≥": "clear ≥ N: faster beyond noise (95% intervals) from that N on",
    "within noise": "within noise: faster by the median, but its 95% interval reaches 1× at the largest N",
    "not monotone": "not monotone: faster at some smaller N too, then slower again as N grows",
}


def crossover_legend(rows: list[list[str]], explained: set[str]) -> str:
    """The line under a verdict table that says what its 'faster from N' marks mean (the last column), those not
    `explained` above it only (they are added to it); '' when there is none new."""
    shown = [row[-1] for row in rows]
    new = [mark for mark in CROSSOVER_MARKS if mark not in explained and any(mark in text for text in shown)]
    explained.update(new)
    return "faster from N: " + "; ".join(CROSSOVER_MARKS[mark] for mark in new) + "." if new else ""


RECALL_HEADER = "needle recall (least)"  # the least share of needles retrieved over the setting's `needles` inputs


def left_out_text(answer: Answer) -> str:
    """'Left out: linear (slower than full and not more accurate, 0.54×); …' ('' when nothing is)."""
    if not answer.left_out:
        return ""
    parts = []
    for c in answer.left_out:
        figures = [speedup_text(pd.Series(vars(c))) if c.speedup == c.speedup else ""]
        figures.append("" if c.family == "exact" or c.error != c.error else f"error {format_number(c.error, '.3g')}")
        figures.append("" if c.recall != c.recall else f"recall {recall_text(c.recall)}")
        shown = ", ".join(f for f in figures if f and f != "–")
        parts.append(f"{c.label} ({c.left_out}" + (f"; {shown})" if shown else ")"))
    return "Left out: " + "; ".join(parts) + "."


def error_text(error: float) -> str:
    """'0.42', or '0.99 (≈ uniform)' / '1.8 (worse than uniform)' where it buys no accuracy over averaging V."""
    text = format_number(error, ".3g")
    if error == error and error >= 1.05:
        return text + " (worse than uniform)"
    if error == error and error >= UNIFORM_EQUIVALENT:
        return text + " (≈ uniform)"
    return text


def verdict_title(verdict: InputVerdict) -> str:
    return f"{verdict.input} — {verdict.setting}"


def timing_note(verdict: InputVerdict) -> str:
    """Where the speedups of an input timed on another input come from ('' when it was timed itself)."""
    if not verdict.timed_on or verdict.timed_on == verdict.input:
        return ""
    return (
        f"Speed and memory were measured on `{verdict.timed_on}` (time barely depends on the input); error on this one."
    )


VERDICT_INTRO = (
    "For each input and N: the answer in one sentence, then the fastest exact variant and the approximations "
    "within the accuracy budget that no other beats on both speed and error (the Pareto set, fastest first: a "
    "variant leaves it only when another is at least as accurate and faster beyond the noise in their own rounds; "
    "'speed ties X' marks one that a more accurate X is not slower than beyond the noise), then the variants left "
    "out and why (slower beyond noise and not more accurate, over the error budget, or no better than averaging "
    "V). Speedups are paired, in turns with {baseline}, with a "
    "95% interval; error is against exact attention relative to averaging V (0 exact, 1 no better than "
    "averaging); 'faster from N' is the N from which {baseline} is beaten at every larger N measured."
)


def verdict_intro(found: list[InputVerdict], baseline: str) -> str:
    """How to read the verdict (VERDICT_INTRO), and what decode's figures are where a setting is decode's."""
    text = VERDICT_INTRO.format(baseline=baseline)
    return text + " " + DECODE_NOTE if any(v.mode.decode for v in found) else text


def budget_line(budget: AccuracyBudget, baseline: str) -> str:
    """The accuracy budget a verdict used, where it came from and why, the rule for several inputs, and the
    `min_speedup` question where it was asked (Markdown)."""
    if budget.source.startswith("the default"):  # 0.5 (attnbench.plan.budget): said as the share of attention kept
        why = "a recommended variant keeps at least half of what attention adds over averaging V"
    else:
        why = f"a recommended variant's output is at most {budget.max_error:g} times as far from exact as averaging V's"
    text = (
        f"**Accuracy budget: error vs uniform ≤ {budget.max_error:g}** ({why}), from {budget.source}. 'Use X' names "
        "only a variant within it; each input's verdict holds the budget to that input's own error; "
        "`attnbench report RUN --max-error X` judges the run again with another."
    )
    if budget.min_speedup is not None:
        text += (
            f" **Asked (`--min-speedup {budget.min_speedup:g}`):** the least error among the variants at least "
            f"{budget.min_speedup:g}× faster than `{baseline}` (their whole 95% interval at or above it)."
        )
    if budget.min_recall is not None:
        text += (
            f" **Recall required (`--min-recall {budget.min_recall:g}`):** an approximation that retrieves fewer than "
            f"{recall_text(budget.min_recall)} of the planted needles at that N (the least over the setting's `needles` "
            "inputs), or whose recall was not measured there, is left out. The needle recall column is that least share "
            "under every input's heading."
        )
    return text


@dataclass
class VerdictBlock:
    """One block of the verdict as shown: its titles (several when their bodies are the same), the input's
    sentence, and per N the answer, the table of choices and the left-out line."""

    titles: list[str]
    sentence: str
    verdict: InputVerdict


def verdict_blocks(found: list[InputVerdict]) -> list[VerdictBlock]:
    """Every setting × input's verdict (`verdicts`), those whose content is the same merged into one block."""
    blocks: dict[str, VerdictBlock] = {}
    for verdict in found:
        sentence = " ".join(text for text in (verdict.sentence, timing_note(verdict)) if text)
        body = sentence + "\n" + "\n".join(  # the same figures on two inputs: one block (its sentences name the first)
            (answer.sentence + answer.asked).replace(f"`{verdict.input}`", "`<input>`")
            + str(verdict_rows(verdict, answer))
            + left_out_text(answer)
            for answer in verdict.answers
        )
        if body in blocks:
            blocks[body].titles.append(verdict_title(verdict))
        else:
            blocks[body] = VerdictBlock([verdict_title(verdict)], sentence, verdict)
    return list(blocks.values())


def block_title(block: VerdictBlock) -> str:
    if len(block.titles) == 1:
        return block.titles[0]
    return block.titles[0] + f" (and {len(block.titles) - 1} more with the same verdict: " + "; ".join(
        block.titles[1:]
    ) + ")"


def verdict_markdown(found: list[VerdictBlock]) -> str:
    """The verdicts of a run as Markdown: per block a heading and a sentence, per N the answer and a table."""
    if not found:
        return "No cell ran ok: there is nothing to recommend.\n"
    first = found[0].verdict
    parts = [budget_line(first.budget, first.baseline), VERDICT_INTRO.format(baseline=f"`{first.baseline}`")]
    explained: set[str] = set()  # each 'faster from N' mark is said once, under the first table showing it
    for block in found:
        parts.append(f"### {block_title(block)}")
        parts.append(block.sentence)
        if not block.verdict.answers:
            parts.append(f"No variant has both a speedup against `{block.verdict.baseline}` and a result here.")
        for answer in block.verdict.answers:
            parts.append(f"**N={answer.n}:** {answer.sentence}" + (f" {answer.asked}" if answer.asked else ""))
            headers, rows = verdict_rows(block.verdict, answer)
            parts.append(markdown_table(headers, rows))
            if legend := crossover_legend(rows, explained):
                parts.append(f"_{legend}_")
            if answer.left_out:
                parts.append(left_out_text(answer))
    return "\n\n".join(parts) + "\n"


def verdict_terminal(found: list[VerdictBlock], width: int) -> str:
    """The verdicts as plain text that fits `width` columns: per N the answer, an aligned table, the left-out."""
    if not found:
        return "No cell ran ok: there is nothing to recommend."
    first = found[0].verdict
    parts = [textwrap.fill(budget_line(first.budget, first.baseline).replace("`", "").replace("**", ""), width)]
    explained: set[str] = set()  # each 'faster from N' mark is said once, under the first table showing it
    for block in found:
        parts.append(
            textwrap.fill(f"== {block_title(block)}", width) + "\n" + textwrap.fill(block.sentence.replace("`", ""), width)
        )
        for answer in block.verdict.answers:
            said = f"N={answer.n}: {answer.sentence}" + (f" {answer.asked}" if answer.asked else "")
            lines = [textwrap.fill(said.replace("`", ""), width)]
            headers, rows = verdict_rows(block.verdict, answer)
            table = aligned_table(headers, rows, width=width - 2, breakable=(0,))  # names may break
            lines.append(textwrap.indent(table, "  "))  # the blank line between wrapped rows stays empty
            if legend := crossover_legend(rows, explained):
                lines.append(textwrap.fill(legend, width, initial_indent="  ", subsequent_indent="    "))
            if answer.left_out:
                lines.append(textwrap.fill(left_out_text(answer), width, initial_indent="  ", subsequent_indent="    "))
            parts.append("\n".join(lines))
    return "\n\n".join(parts)
