"""Rows whose group's times were the scheduler's, not its variants' (a thread waiting for a core held by another
process): `attnbench.measure` marks them, their `noisy` starting with UNUSABLE, and withholds their speedups. The
report draws no verdict and no "fastest" from them, and says why where the verdict would stand."""

from __future__ import annotations

import pandas as pd

UNUSABLE = "unusable: scheduler-bound"  # the words attnbench.measure.noise writes (tests/unit/test_stalls.py)


def is_unusable(noisy: object) -> bool:
    """Whether a row's `noisy` marks its timing unusable."""
    return isinstance(noisy, str) and noisy.startswith(UNUSABLE)


def unusable_mask(frame: pd.DataFrame) -> pd.Series:
    """True on each row whose timing is marked unusable."""
    if "noisy" not in frame or frame.empty:
        return pd.Series(False, index=frame.index)
    return frame.noisy.map(is_unusable).astype(bool)


def usable(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows whose timing may be read (those not marked unusable)."""
    return frame[~unusable_mask(frame)]


def unusable_sentence(rows: pd.DataFrame) -> str:
    """Why the verdict is silent at the N whose timed rows (of one setting and input) are unusable, and what to do;
    '' when none is."""
    marked = rows[unusable_mask(rows) & rows.time_median_s.notna()]
    if marked.empty:
        return ""
    parts = []
    for n, at_n in marked.groupby("seq_len"):
        why = str(at_n.noisy.iloc[0]).removeprefix(UNUSABLE).removeprefix(": ").split("; ")[0]
        threads = sorted({int(t) for t in at_n.threads.dropna()}) if "threads" in at_n else []
        said = threads and "thread" not in why  # the collapse's reason names them already
        at = f", at {'/'.join(map(str, threads))} thread{'s' * (threads != [1])}" if said else ""
        parts.append(f"N={n} ({why}{at})")
    return (f"No speed verdict at {'; '.join(parts)}: those times are the scheduler's, not the variants' (a thread "
            "waited for a core another process held), so no speedup is drawn from them; measure again on a quieter "
            "machine, or leave `--threads` unset so the run fits the idle cores.")  # fmt: skip
