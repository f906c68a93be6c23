"""The arithmetic of the kvpress overlap check (`kvpress_overlap.py`, `make kvpress-overlap`), without kvpress or the
model: the budget, the overlap and its summary, reading what our states keep, matching kept keys, the table, and the
cases naming our variants as they are."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from kvpress_overlap import (  # noqa: E402
    CASES,
    KNOBS,
    Case,
    Overlap,
    all_cases,
    n_kept,
    our_kept,
    overlap,
    table_markdown,
)
from kvpress_side import kept_channels, kept_positions, rows_matched  # noqa: E402

from attnbench.ops import KVCache  # noqa: E402
from attnbench.registry import registry  # noqa: E402


def positions(*values: int) -> torch.Tensor:
    return torch.tensor(values)


def test_n_kept_is_kvpress_compute_n_kept() -> None:
    assert [n_kept(1024, r) for r in (0.25, 0.5, 0.75, 0.875)] == [768, 512, 256, 128]
    assert n_kept(10, 0.99) == 1  # floored to one, as kvpress's
    assert n_kept(7, 0.5) == 3  # int(), not round()


def test_overlap_is_the_share_of_kvpress_kept_that_ours_keeps() -> None:
    assert overlap(positions(1, 2, 3, 4), positions(2, 4, 6, 8)) == 0.5
    assert overlap(positions(1, 2, 3), positions(3, 2, 1)) == 1.0  # order does not matter
    assert overlap(positions(1, 2, 3, 4, 5), positions(5)) == 1.0  # keeping more is not penalised: see the counts
    assert overlap(positions(), positions()) == 1.0
    assert overlap(positions(1), positions()) == 0.0


def test_overlap_summary_mean_least_and_counts() -> None:
    ours = [[positions(0, 1), positions(0, 1)], [positions(0, 1), positions(2, 3)]]
    theirs = [[positions(0, 1), positions(0, 2)], [positions(0, 1), positions(0, 1)]]
    summary = Overlap.of(ours, theirs)
    assert summary.table == [[1.0, 0.5], [1.0, 0.0]]
    assert summary.mean == pytest.approx(0.625)
    assert summary.least == (0.0, 1, 1)
    assert (summary.ours_kept, summary.theirs_kept) == (2.0, 2.0)


def test_rows_matched_finds_each_kept_key_and_refuses_a_changed_one() -> None:
    keys = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    assert rows_matched(keys[[4, 1]], keys).tolist() == [4, 1]
    with pytest.raises(ValueError, match="re-rotate"):
        rows_matched(keys[[4]] + 1.0, keys)


def test_kvpress_side_reads_kept_masked_and_channels() -> None:
    keys = torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(1))
    kept = keys[:, :, [4, 0, 2]]  # a gather, in kvpress's topk order
    assert [h.tolist() for h in kept_positions(kept, keys, None)] == [[0, 2, 4], [0, 2, 4]]
    masked = (torch.tensor([0, 0]), torch.tensor([1, 1]), torch.tensor([0, 3]))  # head 1's slots 0 and 3
    assert [h.tolist() for h in kept_positions(keys, keys, masked)] == [[0, 1, 2, 3, 4], [1, 2, 4]]
    zeroed = keys.clone()
    zeroed[0, 0, :, 1] = 0
    assert [h.tolist() for h in kept_channels(zeroed)] == [[0, 2, 3], [0, 1, 2, 3]]


def test_our_kept_reads_a_cache_a_ragged_cache_and_channels() -> None:
    from attnbench.variants.headwise import RaggedCache
    from attnbench.variants.think import ChannelCache

    k = torch.randn(1, 2, 6, 4, generator=torch.Generator().manual_seed(2))
    v = torch.randn(1, 2, 6, 4, generator=torch.Generator().manual_seed(3))
    assert [h.tolist() for h in our_kept(KVCache.of(k[:, :, [1, 5]], v[:, :, [1, 5]]), k)] == [[1, 5], [1, 5]]
    keep = torch.tensor([[[True, False, True, False, False, False], [False] * 5 + [True]]])
    assert [h.tolist() for h in our_kept(RaggedCache.of_mask(k, v, keep), k)] == [[0, 2], [5]]
    channels = ChannelCache.of(k, v, torch.tensor([[[0, 3], [1, 2]]]), room=0, prune_new=False)
    assert [h.tolist() for h in our_kept(channels, k)] == [[0, 3], [1, 2]]


def test_table_gives_mean_least_counts_and_notes() -> None:
    ratio = {"ratio": 0.5, "mean": 0.9, "min": 0.5, "ours_kept": 4, "kvpress_kept": 4}
    rows = [{"label": "x", "ours": "x()", "kvpress": "XPress()", "note": "why", "ratios": [ratio]},
            {"label": "y", "ours": "y()", "kvpress": "YPress()", "note": "", "error": "ours failed: boom"}]  # fmt: skip
    table = table_markdown(rows, (0.5,))
    assert "| x | `x()` | `XPress()` | 0.900 / 0.50 | 4/4 | why |" in table
    assert "| y | `y()` | `YPress()` | ours failed: boom |" in table


def test_kvpress_label_nests_the_wrappers() -> None:
    wrappers = (("AdaKVPress", {"alpha_safeguard": 0.2}),)
    case = Case("c", "snapkv", {}, "SnapKVPress", {"window_size": 64}, wrappers=wrappers)
    assert case.kvpress_label() == "AdaKVPress(SnapKVPress(window_size=64), alpha_safeguard=0.2)"


def test_a_registered_press_with_no_case_of_its_name_is_compared_at_its_defaults() -> None:
    from attnbench.registry import Registry
    from attnbench.variants.press import ScoredPress
    from attnbench.variants.press_attention import SnapKV

    class FooPress(ScoredPress):
        name, press = "foo", "FooPress"

        def score(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return -k.norm(dim=-1)

    local = Registry("attnbench.no-such-group")
    local.register(SnapKV)
    local.register(FooPress)
    cases = all_cases(local)
    assert [c.label for c in cases] == [c.label for c in CASES] + ["foo"]  # snapkv has its own case
    assert (cases[-1].ours, cases[-1].press, cases[-1].hparams, cases[-1].kwargs) == ("foo", "FooPress", {}, {})


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_each_case_names_our_variant_with_hyperparameters_it_takes(case: Case) -> None:
    assert case.knob in KNOBS
    registry.create(case.ours, **{case.knob: KNOBS[case.knob](1024, 0.5)}, **case.hparams)
