"""How the presses rank in a grid beside kvpress's published order: its numbers are for 8B models on RULER-4K, ours
for a 135M model, so the figures are not comparable — the order is the question. Each published pair (press A above
press B at one compression ratio) is set against the grid's pooled accuracies at the same share kept (1 - ratio):
"agrees" when our intervals separate in the same direction, "reversed" when they separate the other way, "not
separated" otherwise (the verdict's rule, `attnbench.stats.intervals_separate`).

The published figures are the ones this project could read from this machine (the leaderboard itself, a Hugging Face
space, is out of reach): the leaderboard's figures as the project's issue 56 quotes them (read there, 2026-11), and the Compactor pull request's table
(NVIDIA/kvpress#143, Llama-3.1-8B-Instruct). kvpress's `expected_attention` on its leaderboard is AdaKV over
ExpectedAttention (evaluation/evaluate_registry.py: `AdaKVPress(ExpectedAttentionPress(epsilon=1e-2))`): ours
`adakv-expected-attention`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.stats import Interval, intervals_separate

LEADERBOARD = "kvpress's leaderboard, RULER-4K, huggingface.co/spaces/nvidia/kvpress-leaderboard"
COMPACTOR_PR = "NVIDIA/kvpress#143 (Compactor), RULER-4K, Llama-3.1-8B-Instruct"


@dataclass(frozen=True)
class Published:
    """A press's published RULER-4K score at a compression ratio (the share removed)."""

    method: str  # our method's label (an alias or a variant's name)
    ratio: float
    score: float
    source: str


PUBLISHED = (
    Published("full", 0.0, 95.7, LEADERBOARD),
    Published("kvzip", 0.5, 95.5, LEADERBOARD),
    Published("kvpress-snapkv", 0.25, 81.8, LEADERBOARD),  # SnapKVPress() (window 64, kernel 5, avg): the grid's label
    Published("adakv-snapkv", 0.25, 88.1, LEADERBOARD),
    Published("expected-attention", 0.25, 88.5, LEADERBOARD),
    Published("adakv-expected-attention", 0.25, 93.6, LEADERBOARD),
    Published("compactor", 0.25, 94.0, COMPACTOR_PR),
    Published("compactor", 0.5, 87.7, COMPACTOR_PR),
    Published("compactor", 0.75, 77.8, COMPACTOR_PR),
)


def published_pairs() -> list[tuple[Published, Published]]:
    """Every (higher, lower) pair of published scores at one ratio, one source, higher first."""
    pairs = []
    for a in PUBLISHED:
        for b in PUBLISHED:
            if a.ratio == b.ratio and a.source == b.source and a.ratio > 0 and a.score > b.score:
                pairs.append((a, b))
    return sorted(pairs, key=lambda pair: (pair[0].ratio, -pair[0].score, -pair[1].score))


def standing(ours_a: Interval | None, ours_b: Interval | None) -> str:
    """Our pair's order against the published one (a above b)."""
    if ours_a is None or ours_b is None:
        return "not in the grid"
    if not intervals_separate(ours_a, ours_b):
        return "not separated"
    return "agrees" if ours_a.low > ours_b.high else "reversed"


def order_table(pooled: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Rows of (ratio, N, protocol, published pair, their scores, ours, standing) for every published pair, from the
    verdict's pooled accuracies (`generation_verdict.pooled`: seq_len, protocol, method, share, accuracy, low, high)."""
    header = ["ratio", "N", "protocol", "published order", "published", "ours", "order here"]
    rows = []
    for (n, protocol), here in pooled.groupby(["seq_len", "protocol"], sort=True):
        for a, b in published_pairs():
            ours = {method: _interval(here, method, 1 - a.ratio) for method in (a.method, b.method)}
            rows.append([
                f"{a.ratio:g}", str(n), protocol, f"{a.method} > {b.method}", f"{a.score:g} > {b.score:g}",
                " vs ".join(_percent(ours[m]) for m in (a.method, b.method)), standing(ours[a.method], ours[b.method]),
            ])  # fmt: skip
    return header, rows


def _interval(here: pd.DataFrame, method: str, share: float) -> Interval | None:
    found = here[(here.method == method) & ((here.share - share).abs() < 1e-9)]
    if found.empty:
        return None
    row = found.iloc[0]
    return Interval(float(row.accuracy), float(row.low), float(row.high))


def _percent(interval: Interval | None) -> str:
    if interval is None:
        return "—"
    return f"{100 * interval.estimate:.0f}% [{100 * interval.low:.0f}–{100 * interval.high:.0f}]"
