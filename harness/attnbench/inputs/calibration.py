"""Calibration targets as data: what real attention heads show, per sequence length, and how close `realistic` must
stay to them.

Two sources:
- a causal decoder, per length: `calibration/smollm2-135m.json`, written by `attnbench calibrate` (SmolLM2-135M,
  every head of its 30 layers, post-rotary, N = 512, 2048 and 8192, three windows of the shipped prose each; the
  file records how it was made). `realistic` with causal=True is held to it;
- a bidirectional encoder at N = 512: `ENCODER` below (MiniLM-L6, the first calibration). `realistic` with
  causal=False is held to it: a decoder's causal statistics do not describe bidirectional attention (every key is
  visible, so the first token, the window and the top keys are shares of a different set).

The tolerance of a mean is a third of the real heads' spread across heads, at least 0.03. A gap that small is
little next to how one model's layers differ from each other (the mean of the first third of SmolLM2's layers and
of the last differ by 0.07-0.50 per statistic), so a synthetic head population inside it is as close to "the model"
as one of the model's own layer groups is; and it is wider than the spread of the real means across text windows
(0.002-0.015), so no single window's accident is being fitted. The spread across heads must be within half of
itself (at least 0.04).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

DECODER_FILE = "smollm2-135m.json"


@dataclass(frozen=True)
class Target:
    """One statistic of real attention heads: its mean over heads, its spread across heads, and how close the
    synthetic input's mean must stay (absolute)."""

    mean: float
    spread: float  # standard deviation across heads
    tolerance: float

    @property
    def spread_tolerance(self) -> float:
        return max(0.04, self.spread / 2)


ENCODER = {  # MiniLM-L6-H384 (sentence-transformers all-MiniLM-L6-v2), 6 layers x 12 heads, head_dim 32,
    # N=512 tokens of English prose, non-causal. `realistic` at the same shape (3 seeds x 24 heads) gives
    # entropy 0.69 (spread 0.17), within +-64 0.51 (0.23), first token 0.10 (0.10).
    "entropy": Target(mean=0.69, spread=0.19, tolerance=0.05),  # H(p) / log N, mean over rows
    "local_mass": Target(mean=0.51, spread=0.20, tolerance=0.07),  # mass within |i - j| <= 64
    "sink_mass": Target(mean=0.094, spread=0.075, tolerance=0.04),  # mass on the first token
}


@lru_cache(maxsize=None)
def decoder_table(name: str = DECODER_FILE) -> dict[str, Any]:
    """The calibration file shipped with attnbench (see `attnbench calibrate`), as written."""
    text = resources.files("attnbench.inputs").joinpath("calibration", name).read_text(encoding="utf-8")
    return json.loads(text)


def targets_from(table: dict[str, Any], n: int) -> dict[str, Target]:
    """The targets at length `n` of a calibration table (KeyError when it was not measured at `n`)."""
    statistics = table["lengths"][str(n)]["statistics"]
    return {
        name: Target(s["mean"], s["spread_heads"], round(max(0.03, s["spread_heads"] / 3), 3))
        for name, s in statistics.items()
    }


def decoder_targets(n: int) -> dict[str, Target]:
    """The shipped causal decoder's targets at length `n` (512, 2048 or 8192)."""
    return targets_from(decoder_table(), n)


def decoder_lengths() -> list[int]:
    return sorted(int(n) for n in decoder_table()["lengths"])
