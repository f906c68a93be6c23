"""The cache a method keeps, as a share of the prompt: each family's knob, set from the share and the prompt's length.

kvpress sweeps the compression ratio (the share of key/value pairs removed); the share kept here is 1 minus it. A
share s of a prompt of n tokens is round(s n) positions per key/value head (at least the method's smallest
setting):
- `band` (StreamingLLM's sinks + window): window = s n - sinks - 1 (the sinks, the window and the token itself);
- `h2o`, `snapkv`: budget = s n (SnapKV's observation window is part of it);
- `topk` (Quest): top_k = s n / page - 2 pages ranked, besides the first and the newest (Quest keeps every key and
  reads that share: its cache is the exact one, what a step reads is the budget).
A method without a knob (an RNN state, full) is run once, whatever the share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Knob:
    """The hyperparameter that sets a family's cache, and its value for a number of kept tokens per head."""

    parameter: str
    value: Callable[[int, dict[str, Any]], int]  # (tokens kept, the variant's hyperparameters) -> the knob's value
    reads_only: bool = False  # the knob sets what a step reads; the cache keeps everything (Quest)


KNOBS: dict[str, Knob] = {
    "band": Knob("window", lambda tokens, p: max(1, tokens - p["sinks"] - 1)),
    "h2o": Knob("budget", lambda tokens, p: max(2, tokens)),
    "snapkv": Knob("budget", lambda tokens, p: max(p["window"] + 1, tokens)),
    "topk": Knob("top_k", lambda tokens, p: max(1, tokens // p["block_size"] - 2), reads_only=True),
}


def knob_of(name: str) -> Knob | None:
    return KNOBS.get(name)


def tokens_kept(share: float, n: int) -> int:
    """Positions per key/value head a share of a prompt of n tokens keeps."""
    return max(1, round(share * n))


def at_share(name: str, hparams: dict[str, Any], share: float, n: int) -> dict[str, Any]:
    """The variant's hyperparameters (every one resolved) with its knob set for `share` of a prompt of n tokens."""
    knob = KNOBS[name]
    return {**hparams, knob.parameter: knob.value(tokens_kept(share, n), hparams)}
