"""The generation report's cost table: per method, budget and N, the cache it holds after the prompt and at its end and
the cache a step reads (each a share of the exact model's), its time inside attention per token with its ratio to the
exact model's, and its continuation's perplexity against the exact model's.

Every time here comes from the timed rows alone: those with an `attention_ratio`, the first sample of each unit, whose
method's layer step was timed on the main thread one method at a time, in turns with the exact model's step, round
after round (`attnbench.generation.step_timing`); the other rows carry no time (NaN), and a run from before that
timing carries none the report shows. Where several units were timed, the time is the median of theirs, the ratio the
median of their ratios and its interval the span of their intervals (wider than any one of them, never narrower).
"""

from __future__ import annotations

import math
from typing import Callable

import pandas as pd

from attnbench.report.generation_summary import EXACT, geometric_mean, is_exact, labelled
from attnbench.report.text import share_text

SAMPLE_KEY = ["task", "seq_len", "protocol", "sample"]  # the rows of one prompt: every method on one sample
TIMED = ("attention_s", "attention_ratio", "attention_low", "attention_high", "step_form", "final_cache_bytes")
FORMS = {  # a step form, in words
    "eager": "eager PyTorch (operations one by one, no compiled or fused kernel)",
    "fused": "fused (one call of attnbench's C kernels a step where the method has one, float32 on the CPU)",
}
COST_COLUMNS = ["method", "share", "seq_len", "cache_share", "final_share", "read_share", "attention_s", "ratio", "low",
                "high", "timed", "forms", "ppl_ratio", "exact_method"]  # fmt: skip


def with_timing_columns(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with every column the cost table reads (a run from before a column: all NaN, no form)."""
    missing = {column: "" if column == "step_form" else math.nan for column in TIMED if column not in rows}
    return rows.assign(**missing) if missing else rows


def final_shares(ok: pd.DataFrame) -> pd.Series:
    """Per row: what its states hold after its last token over what the exact model's hold after the exact model's
    last token on the same sample (NaN without either)."""
    exact = ok[is_exact(ok)].drop_duplicates(SAMPLE_KEY).set_index(SAMPLE_KEY).final_cache_bytes
    reference = exact.reindex(pd.MultiIndex.from_frame(ok[SAMPLE_KEY])).to_numpy(dtype=float)
    return pd.Series(ok.final_cache_bytes.to_numpy(dtype=float) / reference, index=ok.index)


def costs(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, share, N) (COST_COLUMNS): the mean shares held after the prompt (`cache_share`) and at
    the end (`final_share`) and read (`read_share`); from the timed rows only, the attention time per token and its
    ratio to the exact model's with the interval, how many rows were timed and their step forms; the continuation's
    perplexity ratio (geometric mean over samples)."""
    ok = with_timing_columns(labelled(rows[rows.status == "ok"]))
    ok = ok.assign(final_share=final_shares(ok), share_key=ok.share.fillna(-1.0), exact_row=is_exact(ok))
    out = []
    for (method, share, n), at in ok.groupby(["method", "share_key", "seq_len"], sort=False):
        timed = at[at.attention_s.notna() & at.attention_ratio.notna()]
        out.append(dict(
            method=method, share=None if share < 0 else float(share), seq_len=int(n), cache_share=at.cache_share.mean(),
            final_share=at.final_share.mean(), read_share=at.read_share.mean(), attention_s=timed.attention_s.median(),
            ratio=timed.attention_ratio.median(), low=timed.attention_low.min(), high=timed.attention_high.max(),
            timed=len(timed), forms=sorted(set(timed.step_form.fillna("").astype(str)) - {""}),
            ppl_ratio=geometric_mean(at.ppl_ratio.dropna().tolist()), exact_method=bool(at.exact_row.all()),
        ))  # fmt: skip
    return pd.DataFrame(out, columns=COST_COLUMNS)


def milliseconds_text(seconds: float) -> str:
    """'7.4 ms', '0.312 ms', '123 ms': a tenth of a millisecond, three digits below one."""
    ms = 1e3 * seconds
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 1 else f"{ms:.3g} ms"


def times_text(ratio: float, rounding: Callable[[float], float] = round) -> str:
    """'0.52': two decimals (`rounding` picks the way: math.floor and math.ceil round an interval's ends outward, so
    the interval shown holds the one computed); two significant digits below 0.1."""
    if ratio < 0.1:
        return f"{ratio:.2g}"
    return f"{rounding(round(100 * ratio, 9)) / 100:.2f}"


def attention_text(cost: object) -> str:
    """'7.4 ms (0.52× [0.49–0.55] of full, eager)': a cost row's time per token and its ratio to the exact model's
    with its interval and step form; the exact model's own '14.2 ms (the reference, eager)'; '–' untimed."""
    seconds, ratio, low, high = (getattr(cost, name) for name in ("attention_s", "ratio", "low", "high"))
    if seconds != seconds or ratio != ratio:
        return "–"
    form = ", ".join(cost.forms)  # type: ignore[attr-defined]
    if cost.exact_method:  # type: ignore[attr-defined]
        return f"{milliseconds_text(seconds)} (the reference{', ' + form if form else ''})"
    interval = f" [{times_text(low, math.floor)}–{times_text(high, math.ceil)}]" if low == low and high == high else ""
    return f"{milliseconds_text(seconds)} ({times_text(ratio)}×{interval} of {EXACT}{', ' + form if form else ''})"


def percent_text(share: float) -> str:
    return "–" if share != share else f"{share:.1%}"


def cost_table(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The `costs` frame as a table: method, budget, N, held after the prompt and at the end, read by a step,
    attention per token, continuation perplexity against the exact model's."""
    headers = ["method", "kept", "N", "holds after the prompt", "holds at the end", "a step reads",
               "attention / token", "continuation ppl ×exact"]  # fmt: skip
    table = [[c.method, share_text(c.share), f"{c.seq_len:,}" if c.seq_len else "own", percent_text(c.cache_share),
              percent_text(c.final_share), percent_text(c.read_share), attention_text(c),
              "–" if c.ppl_ratio != c.ppl_ratio else f"{c.ppl_ratio:.3f}"] for c in frame.itertuples()]  # fmt: skip
    return headers, table


def cost_caption(frame: pd.DataFrame) -> str:
    """What the cost table's columns are, and how its times were taken (the timed rows' step forms named)."""
    forms = sorted({form for forms in frame.forms for form in forms})
    how = " and ".join(FORMS.get(form, f"`{form}`") for form in forms) or "of a form the rows do not name"
    timing = (
        "Attention / token: its time inside attention per generated token, every layer, on this machine. The steps "
        f"are {how}: one layer's step timed alone on the main thread, one method at a time in turns with the exact "
        "model's step, round after round, on the first sample of each unit, and counted over every layer (one it "
        "keeps exact at the exact step's time); in brackets, its time over the exact model's, taken within each "
        "round: the median over rounds with its 95% interval (where several units were timed, the median of their "
        "ratios and the span of their intervals); – where none of its rows was timed."
        if frame.timed.sum()
        else "Attention / token: – where no row was timed in turns with the exact model (a run from before that "
        "timing): no time is shown for it."
    )  # fmt: skip
    return (
        "What each method holds, as a share of the exact model's KV cache (every layer), after the prompt (the "
        "positions it holds, not the room kept for later tokens) and at its end (after its last token, against the exact "
        "model's after its own: under kvpress's rule a cache grows by the question and the answer, under fixed-total "
        "a method stays at its share); the share a step reads; and the continuation's perplexity against the exact model's on the same "
        f"tokens (geometric mean over samples). {timing}"
    )
