"""Budgets: once a variant is over its time budget, out of memory, crashed or timed out at some N, its larger N
are skipped; kept while a run goes and replayed from the rows on resume."""

from __future__ import annotations

from attnbench.measure.group import memory_limit
from attnbench.plan.cells import Cell
from attnbench.plan.config import Settings


class Budgets:
    """Once a variant is over its time budget, out of memory, crashed or timed out at some N, or measured a peak
    over the memory limit (its cost() understated it), its larger N (same series: every other axis equal) are
    skipped with that reason."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.time_budget_s = settings.time_budget_s
        self.over: dict[str, tuple[int, str]] = {}  # series -> (the N it went over at, why)

    def note(self, cell: Cell, status: str, median_s: float | None, peak_bytes: float | None = None) -> None:
        reason = None
        if status in ("oom", "crashed", "timeout"):
            reason = f"{'out of memory' if status == 'oom' else status} at N={cell.seq_len}"
        elif status == "ok" and median_s is not None and median_s == median_s and median_s > self.time_budget_s:
            reason = (
                f"{cell.label()} took {median_s:.3g} s at N={cell.seq_len}, "
                f"over time_budget_s={self.time_budget_s:g}"
            )
        elif status == "ok" and peak_bytes is not None and peak_bytes == peak_bytes:
            limit, source = memory_limit(self.settings, cell.device)
            if peak_bytes > limit:
                reason = (
                    f"{cell.label()} measured a peak of {peak_bytes / 2**20:,.0f} MiB at N={cell.seq_len}, "
                    f"over the limit {limit / 2**20:,.0f} MiB ({source}): its cost() understates its memory"
                )
        known = self.over.get(cell.series_key())
        if reason is not None and (known is None or cell.seq_len < known[0]):
            self.over[cell.series_key()] = (cell.seq_len, reason)

    def skip_reason(self, cell: Cell) -> str | None:
        """Why `cell` is skipped: its series went over at a smaller N (any input: time barely depends on it)."""
        known = self.over.get(cell.series_key())
        return None if known is None or cell.seq_len <= known[0] else f"larger N skipped: {known[1]}"
