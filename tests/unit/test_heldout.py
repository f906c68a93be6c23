"""The held-out judgement of `realistic`: rank agreement orders every variant the real heads put below 0.95 (ties
only where both inputs are no better than averaging V), the splits hold out the text and the layers they fit on,
and the fit's minimiser finds a minimum."""

from __future__ import annotations

import pytest
from attnbench.model.heldout import nelder_mead, sampled_rows, splits
from attnbench.model.ranking import rank_agreement


def test_rank_agreement_counts_a_variant_the_synthetic_input_calls_uniform_but_the_real_heads_do_not():
    real = [0.1, 0.3, 0.8, 1.0, 1.1]
    assert rank_agreement(real, [0.2, 0.4, 0.9, 1.05, 0.99]) == pytest.approx(1.0)  # both >= 0.95: one tie
    wrong = rank_agreement(real, [0.2, 0.4, 1.2, 0.99, 1.0])  # 0.8 on real heads, "uniform" on the synthetic
    assert wrong < 0.8
    assert rank_agreement([0.1, 0.2, 0.3], [0.3, 0.2, 0.1]) == pytest.approx(-1.0)


def test_each_split_holds_out_the_text_and_the_layers_it_fits_on():
    found = splits(10)
    assert len(found) == 4
    for fit_text, fit_layers, test_text, test_layers in found:
        assert fit_text != test_text and not set(fit_layers) & set(test_layers)
        assert sorted(fit_layers + test_layers) == list(range(10))  # each half spans the depth


def test_nelder_mead_finds_the_minimum_of_a_bowl():
    best = nelder_mead(lambda x: (x[0] - 1.5) ** 2 + 3 * (x[1] + 0.5) ** 2, [0.0, 0.0], evaluations=200)
    assert best == pytest.approx([1.5, -0.5], abs=1e-2)


def test_rows_are_sampled_evenly_and_every_row_when_few():
    rows = sampled_rows(8192, 512)
    assert len(rows) == 512 and rows[0] == 0 and rows[-1] == 8191
    assert sampled_rows(100, 512).tolist() == list(range(100))
