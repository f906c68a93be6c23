"""`realistic` with a causal mask holds the statistics of a real decoder's heads (SmolLM2-135M, every head, post-rotary,
attnbench/inputs/calibration/smollm2-135m.json) at every length they were measured at; no model needed."""

from __future__ import annotations

import pytest
import torch
from attnbench.inputs.calibration import decoder_table, decoder_targets
from attnbench.inputs.catalogue import make_inputs
from attnbench.inputs.statistics import STATISTICS, head_statistics

HEADS = {512: (48, 3), 2048: (32, 2), 8192: (16, 3)}  # heads per seed, seeds: 48 heads at every length


def realistic_statistics(n: int) -> dict[str, torch.Tensor]:
    heads, seeds = HEADS[n]
    values: dict[str, list[torch.Tensor]] = {name: [] for name in STATISTICS}
    for seed in range(seeds):
        x = make_inputs("realistic", {}, batch=1, heads=heads, seq_len=n, head_dim=64, dtype=torch.float32,
                        device=torch.device("cpu"), seed=seed, causal=True)  # fmt: skip
        for name, per_head in head_statistics(x.q, x.k, causal=True).items():
            values[name].append(per_head)
    return {name: torch.cat(parts) for name, parts in values.items()}


def off_target(n: int) -> list[str]:
    measured = realistic_statistics(n)
    misses = []
    for name, target in decoder_targets(n).items():
        mean, spread = measured[name].mean().item(), measured[name].std().item()
        if abs(mean - target.mean) > target.tolerance:
            misses.append(f"{name} mean {mean:.3f} vs {target.mean:.3f} ± {target.tolerance}")
        if abs(spread - target.spread) > target.spread_tolerance:
            misses.append(f"{name} spread {spread:.3f} vs {target.spread:.3f} ± {target.spread_tolerance:.3f}")
    return misses


@pytest.mark.parametrize("n", [512, 2048])
def test_realistic_causal_holds_the_real_decoders_statistics(n: int) -> None:
    assert off_target(n) == []


@pytest.mark.slow
def test_realistic_causal_holds_the_real_decoders_statistics_at_8192() -> None:
    assert off_target(8192) == []


def test_the_calibration_says_how_it_was_made() -> None:
    table = decoder_table()
    assert table["model_type"] == "llama" and table["layers"] == 30 and table["heads"] == 9
    assert "post-rotary" in table["recorded_at"] and table["text"] == "python_tutorial.txt"
    assert sorted(map(int, table["lengths"])) == [512, 2048, 8192]
    for entry in table["lengths"].values():
        assert entry["windows"] >= 2 and set(entry["statistics"]) == set(STATISTICS)
        assert all(len(s["per_head"]) == 270 for s in entry["statistics"].values())


def test_non_causal_realistic_is_the_encoder_calibration_unchanged() -> None:
    """The decoder's mix applies to causal cells only: a non-causal cell draws what it always drew."""
    common = dict(batch=1, heads=4, seq_len=256, head_dim=64, dtype=torch.float32, device=torch.device("cpu"), seed=0)
    plain = make_inputs("realistic", {}, **common)
    assert torch.equal(plain.q, make_inputs("realistic", {}, causal=False, **common).q)
    assert not torch.equal(plain.q, make_inputs("realistic", {}, causal=True, **common).q)
