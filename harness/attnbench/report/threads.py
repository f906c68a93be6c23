"""What a report says of a run's torch threads: the user's count, or fitted to the idle cores before each timed group
(meta.json's `threads`, written by the run: `attnbench.measure.threads`), and the groups whose times were the
scheduler's."""

from __future__ import annotations

from typing import Any

import pandas as pd


def threads_sentence(recorded: object, frame: pd.DataFrame) -> str:
    """One sentence: how the threads were chosen and why (meta.json's `threads`), what the timed groups ran at, and
    the groups measured again at one thread or left unusable. '' for a run before threads were chosen."""
    if not isinstance(recorded, dict) or not recorded:
        return ""
    at_start: dict[str, Any] = recorded.get("at_start") or {}
    by_group = recorded.get("groups_by_threads") or _groups_by_threads(frame)
    ran = ", ".join(f"{t} thread{'s' * (t != '1')} in {n} group{'s' * (n != 1)}" for t, n in by_group.items())
    if recorded.get("requested"):
        said = f"Threads: {recorded['requested']}, set by the user (`--threads` or the config's `threads`)"
    else:
        why = at_start.get("why")
        said = (f"Threads: fitted to the idle cores (no `--threads` given): {recorded.get('rule', 'the idle cores')}"
                + (f"; as the run started, {why}" if why else ""))  # fmt: skip
    said += f"; timed at {ran}" if ran else ""
    again, unusable = int(recorded.get("measured_again") or 0), int(recorded.get("unusable") or 0)
    if again:
        retry = f"at {recorded['requested']} threads" if recorded.get("requested") else "at 1 thread"
        said += (f"; {again} group{'s were' if again > 1 else ' was'} scheduler-bound (a thread waiting for a core "
                 f"another process held) and measured once more, {retry}")  # fmt: skip
    if unusable:
        said += (f"; {unusable} group{'s' * (unusable > 1)} stayed scheduler-bound: unusable, no speedup or verdict "
                 f"is drawn from {'them' if unusable > 1 else 'it'}")  # fmt: skip
    return said + "."


def _groups_by_threads(frame: pd.DataFrame) -> dict[str, int]:
    """Timed groups per thread count, from the rows (a run that did not finish has no count in meta.json)."""
    if frame.empty or "threads" not in frame:
        return {}
    groups = frame[frame.time_median_s.notna()].drop_duplicates("group_key")
    return {str(int(t)): int(n) for t, n in groups.threads.dropna().value_counts().sort_index().items()}
