"""The answer first: for each setting, input and N, which variant to use, how much faster and smaller it is
than the baseline, and what it costs in accuracy.

A setting is every group column but input and N. Its time and memory come from its timed rows (its first
input, unless every input was timed); each input's error from its own rows. Per N the verdict names the
fastest exact variant and the speed-error Pareto set (no other variant is both faster and more accurate),
each with its paired speedup interval, error vs uniform and peak memory, and when it starts to pay off
(the crossover N against the baseline). One sentence per input says what its error figures can tell.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import pandas as pd
from attnbench.analysis import ERROR_RESOLUTION, crossover_table
from attnbench.reference import LOCALITY_WINDOW
from attnbench.summary import (
    GROUP_COLUMNS,
    MACHINE,
    with_machine,
    aligned_table,
    baseline_of,
    format_number,
    markdown_table,
    speedup_text,
)

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
    peak_mem_bytes: float
    memory_ratio: float  # to the baseline's at the same N
    pays_off: str  # N from which it is faster than the baseline, e.g. "≈ 700", "≤ 256", "> 4096"
    time_s: float = float("nan")  # median time per call
    noisy: bool = False  # its timing is flagged noisy
    fastest_exact: bool = False

    @property
    def speed(self) -> float:
        """The paired speedup, or 1 / time where the baseline did not run."""
        return self.speedup if self.speedup == self.speedup else 1 / self.time_s

    @property
    def speed_high(self) -> float:
        return self.speedup_high if self.speedup == self.speedup else self.speed

    @property
    def error_rank(self) -> float:
        """Error for ranking: exact attention and unmeasured error count as 0, float rounding ties."""
        if self.family == "exact" or self.error != self.error:
            return 0.0
        return max(self.error, ERROR_RESOLUTION)


@dataclass
class Answer:
    """The verdict at one N."""

    n: int
    choices: list[Choice]  # the fastest exact variant first, then the rest of the Pareto set by speedup


@dataclass
class InputVerdict:
    """The verdict for one setting and input, N by N."""

    setting: str  # the setting in words
    input: str
    baseline: str
    sentence: str  # what this input's error figures can tell
    timed_on: str  # the input whose timing the speedups come from
    answers: list[Answer] = field(default_factory=list)


def setting_words(values: pd.Series, varying: set[str]) -> str:
    """'cpu, float32, forward, non-causal, batch 1 × 8 heads × head_dim 64' (+ the axes a run varies)."""
    parts = [
        str(values["device"]),
        str(values["dtype"]),
        "forward" if values["mode"] == "fwd" else "forward + backward",
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
        return "No cell ran ok on this input: the reasons are in summary.md and the report's detail."
    stats = rows.dropna(subset=["input_entropy"])
    if stats.empty:
        return "Error was not measured on this input."
    entropy = stats.input_entropy.mean()
    local, sink = stats.input_band_mass.mean(), stats.input_sink_mass.mean()
    spread = stats.input_head_spread.mean()
    figures = (
        f"entropy {entropy:.2f} of uniform, {format_number(100 * local, '.0f')}% of the mass within "
        f"±{LOCALITY_WINDOW} positions, {format_number(100 * sink, '.0f')}% on the first token"
        + (f", heads differing by {spread:.2f}" if spread == spread and spread >= 0.05 else "")
    )
    if entropy >= NEAR_UNIFORM_ENTROPY:
        return (
            f"Attention on this input is near-uniform ({figures}): averaging V is already close to exact, so "
            "accuracy barely separates the variants; judge accuracy on a structured input (realistic, captured)."
        )
    shape = "peaked" if entropy < PEAKED_ENTROPY else "structured"
    return (
        f"Attention on this input is {shape} ({figures}): error separates the variants; below 1 a variant "
        "beats averaging V, above 1 it does worse."
    )


def _short_crossover(text: str) -> str:
    """'N ≈ 1,234 (between …)' -> '≈ 1,234'; 'already at N=256 …' -> '≤ 256'; 'not within … (N ≤ 4096)' -> '> 4096'."""
    if text.startswith("N ≈"):
        return "≈ " + text.split()[2]
    if text.startswith("already at N="):
        return "≤ " + text.split("N=")[1].split()[0]
    if text.startswith("not within"):
        return "> " + text.rsplit("≤ ", 1)[1].rstrip(")")
    return "–"


def _speed_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The timed ok rows: the speed and memory of each setting, input, variant and N."""
    timed = frame[(frame.status == "ok") & frame.time_median_s.notna()]
    return timed.drop_duplicates(SETTING_COLUMNS + ["input", "label", "seq_len"])


def timed_input(timed: pd.DataFrame, source: str) -> str:
    """The input whose timed rows judge `source`: itself if it was timed, else its setting's first timed input."""
    if (timed["input"] == source).any():
        return source
    return str(timed["input"].iloc[0]) if len(timed) else ""


def verdicts(frame: pd.DataFrame) -> list[InputVerdict]:
    """Every setting × input of a run's rows, N by N, in the order the run measured them. An input that was
    timed itself is judged on its own speed; one whose error alone was measured, on its setting's first
    timed input's."""
    if frame.empty:
        return []
    frame = with_machine(frame)
    baseline = baseline_of(frame)
    varying = {c for c in SETTING_COLUMNS if frame[c].nunique(dropna=False) > 1}
    speed = _speed_rows(frame)
    out = []
    for setting, rows in frame.groupby(SETTING_COLUMNS, sort=False, dropna=False):
        timed = speed
        for column, value in zip(SETTING_COLUMNS, setting):
            timed = timed[timed[column] == value] if value == value else timed[timed[column].isna()]
        words = setting_words(rows.iloc[0], varying)
        for source, on_input in rows.groupby("input", sort=False):
            timed_on = timed_input(timed, source)
            own = timed[timed["input"] == timed_on]
            crossings = crossover_table(own, baseline) if len(own) else pd.DataFrame()
            pays_off = (
                {r.label: _short_crossover(r.faster_from) for r in crossings.itertuples()} if len(crossings) else {}
            )
            verdict = InputVerdict(words, str(source), baseline, input_sentence(on_input), str(timed_on))
            for n, at_n in on_input[on_input.status == "ok"].groupby("seq_len"):
                choices = _choices(at_n, own[own.seq_len == n], baseline, pays_off)
                if choices:
                    verdict.answers.append(Answer(int(n), choices))
            out.append(verdict)
    return out


def _dominates(a: Choice, b: Choice) -> bool:
    """`a` is at least as accurate as `b` and `b` is not clearly faster (its speed within or below a's interval);
    better on one of the two."""
    return (
        a.error_rank <= b.error_rank and a.speed_high >= b.speed and (a.error_rank < b.error_rank or a.speed > b.speed)
    )


def _choices(errors: pd.DataFrame, timed: pd.DataFrame, baseline: str, pays_off: dict[str, str]) -> list[Choice]:
    """The fastest exact variant and the speed-error Pareto set at one N. Speed is the paired speedup (or,
    where the baseline did not run, 1 / time); a variant is dropped only when another is at least as
    accurate and it is not faster beyond the other's interval."""
    speed = timed.set_index("label")
    base_memory = speed.peak_mem_bytes.get(baseline, float("nan")) if len(speed) else float("nan")
    candidates = []
    for row in errors.itertuples():
        if row.label not in speed.index:
            continue
        s = speed.loc[row.label]
        memory = float(s.peak_mem_bytes) if pd.notna(s.peak_mem_bytes) else float("nan")
        paired = pd.notna(s.speedup)
        candidates.append(
            Choice(
                label=row.label,
                family=str(s.family),
                speedup=float(s.speedup) if paired else float("nan"),
                speedup_low=float(s.speedup_low) if paired else float("nan"),
                speedup_high=float(s.speedup_high) if paired else float("nan"),
                error=float(row.err_vs_uniform) if pd.notna(row.err_vs_uniform) else float("nan"),
                peak_mem_bytes=memory,
                memory_ratio=memory / base_memory if base_memory and base_memory == base_memory else float("nan"),
                pays_off="–" if row.label == baseline else pays_off.get(row.label, "–"),
                time_s=float(s.time_median_s),
                noisy=bool(s.noisy),
            )
        )
    if not candidates:
        return []
    exact = [c for c in candidates if c.family == "exact"]
    fastest_exact = max(exact, key=lambda c: c.speed) if exact else None
    if fastest_exact is not None:
        fastest_exact.fastest_exact = True
    front = [c for c in candidates if not any(_dominates(other, c) for other in candidates if other is not c)]
    chosen = sorted((c for c in front if c is not fastest_exact), key=lambda c: -c.speed)
    return ([fastest_exact] if fastest_exact else []) + chosen


VERDICT_HEADERS = [
    "N",
    "variant",
    "speedup vs {baseline} [95% CI]",
    "error vs uniform",
    "peak MiB (× {baseline})",
    "faster from N",
]


def verdict_rows(verdict: InputVerdict) -> tuple[list[str], list[list[str]]]:
    """The verdict of one setting and input as a table: a row per choice, N by N."""
    headers = [h.format(baseline=verdict.baseline) for h in VERDICT_HEADERS]
    rows = []
    for answer in verdict.answers:
        for index, choice in enumerate(answer.choices):
            name = choice.label + (" (fastest exact)" if choice.fastest_exact else "")
            error = "exact" if choice.family == "exact" else error_text(choice.error)
            memory = (
                f"{format_number(choice.peak_mem_bytes / MIB, '.1f')} ({format_number(choice.memory_ratio, '.2f')}×)"
            )
            if choice.speedup == choice.speedup:
                speed = speedup_text(pd.Series(vars(choice))) + (" noisy" if choice.noisy else "")
            else:
                speed = f"– ({format_number(choice.time_s * 1e3, '.3g')} ms; no {verdict.baseline} here)"
            rows.append([str(answer.n) if index == 0 else "", name, speed, error, memory, choice.pays_off])
    return headers, rows


def error_text(error: float) -> str:
    """'0.42', or '0.99 (≈ uniform)' / '1.8 (worse than uniform)' where it buys no accuracy over averaging V."""
    text = format_number(error, ".3g")
    if error == error and error >= 1.05:
        return text + " (worse than uniform)"
    if error == error and error >= 0.95:
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
    "For each input and N: the fastest exact variant, then the variants no other beats on both speed and "
    "error (the Pareto set), fastest first. Speedups are paired, in turns with {baseline}, with a 95% interval; "
    "error is against exact attention relative to averaging V (0 exact, 1 no better than averaging); "
    "'faster from N' is where a variant starts to beat {baseline}."
)


def verdict_markdown(frame: pd.DataFrame) -> str:
    """The verdicts of a run as Markdown: a heading, a sentence and a table per setting and input."""
    found = verdicts(frame)
    if not found:
        return "No cell ran ok: there is nothing to recommend.\n"
    parts = [VERDICT_INTRO.format(baseline=f"`{found[0].baseline}`")]
    for verdict in found:
        parts.append(f"### {verdict_title(verdict)}")
        parts.append(" ".join(text for text in (verdict.sentence, timing_note(verdict)) if text))
        if verdict.answers:
            parts.append(markdown_table(*verdict_rows(verdict)))
        else:
            parts.append(f"No variant has both a speedup against `{verdict.baseline}` and a result here.")
    return "\n\n".join(parts) + "\n"


def verdict_terminal(frame: pd.DataFrame, width: int) -> str:
    """The verdicts as aligned plain tables that fit `width` columns."""
    found = verdicts(frame)
    if not found:
        return "No cell ran ok: there is nothing to recommend."
    parts = []
    for verdict in found:
        sentence = " ".join(text for text in (verdict.sentence, timing_note(verdict)) if text).replace("`", "")
        parts.append(textwrap.fill(f"== {verdict_title(verdict)}", width) + "\n" + textwrap.fill(sentence, width))
        if verdict.answers:
            parts.append(aligned_table(*verdict_rows(verdict), width=width, cuttable=(3, 4, 1)))
    return "\n\n".join(parts)
