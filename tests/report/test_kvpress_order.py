"""The grid's order of presses beside kvpress's published one: each published pair, ours agreeing, reversed or not
separated by the verdict's interval rule."""

from __future__ import annotations

import pandas as pd

from attnbench.report.kvpress_order import PUBLISHED, order_table, published_pairs, standing
from attnbench.stats import Interval


def test_published_pairs_are_ordered_within_one_ratio_and_source() -> None:
    pairs = published_pairs()
    assert pairs, "the published figures give at least one pair"
    for higher, lower in pairs:
        assert higher.ratio == lower.ratio and higher.source == lower.source and higher.score > lower.score
    assert all(p.ratio < 1 for p in PUBLISHED)
    names = {(a.method, b.method) for a, b in pairs}
    assert ("adakv-expected-attention", "expected-attention") in names and ("kvzip", "compactor") not in names


def test_standing_follows_the_interval_rule() -> None:
    high, low, wide = Interval(0.9, 0.85, 0.95), Interval(0.5, 0.4, 0.6), Interval(0.7, 0.3, 0.95)
    assert standing(high, low) == "agrees"
    assert standing(low, high) == "reversed"
    assert standing(high, wide) == "not separated"
    assert standing(high, None) == "not in the grid"


def test_the_table_reads_the_pooled_accuracies_at_the_share_kept() -> None:
    pooled = pd.DataFrame([
        dict(seq_len=2048, protocol="question-agnostic", method="adakv-expected-attention", share=0.75, accuracy=0.9, low=0.85, high=0.95),
        dict(seq_len=2048, protocol="question-agnostic", method="expected-attention", share=0.75, accuracy=0.5, low=0.4, high=0.6),
        dict(seq_len=2048, protocol="question-agnostic", method="expected-attention", share=0.5, accuracy=0.99, low=0.98, high=1.0),
    ])  # fmt: skip
    header, rows = order_table(pooled)
    assert header[-1] == "order here"
    row = next(r for r in rows if r[3] == "adakv-expected-attention > expected-attention")
    assert row[0] == "0.25" and row[-1] == "agrees" and row[5].startswith("90%")
    assert all(r[-1] == "not in the grid" for r in rows if "kvzip" in r[3])


def test_the_report_shows_the_order_only_when_the_grid_ran_a_published_pair() -> None:
    from attnbench.report.generation import kvpress_order_blocks

    pooled = pd.DataFrame([
        dict(seq_len=2048, protocol="question-agnostic", method="adakv-expected-attention", share=0.75, accuracy=0.9, low=0.85, high=0.95),
        dict(seq_len=2048, protocol="question-agnostic", method="expected-attention", share=0.75, accuracy=0.5, low=0.4, high=0.6),
    ])  # fmt: skip
    heading, table = kvpress_order_blocks(pooled)
    assert heading.text == "Beside kvpress's published order"
    assert all(row[-1] != "not in the grid" for row in table.rows) and len(table.rows) == 1
    assert kvpress_order_blocks(pooled[pooled.method == "expected-attention"]) == []
