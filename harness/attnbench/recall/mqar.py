"""Multi-query associative recall (MQAR): Zoology's synthetic recall task (Arora et al. 2023, `multiquery_ar`).

An example of length N holds P key-value pairs at its start, k_1 v_1 ... k_P v_P, then every key once more as a
query, at gaps drawn from a power law (most queries soon after the pairs, a few far away); every other position is
a random token. The label at a query's position is its key's value (the model predicts the next token there),
IGNORE elsewhere. As Zoology: keys from [1, vocab // 2), values from [vocab // 2, vocab), both distinct within an
example; the filler tokens from the whole vocabulary; query i at position 2P + 2 g_i, the gaps g_i distinct in
[0, (N - 2P) // 2) with P(g) proportional to (g + 1)^(alpha - 1) (alpha = 1: uniform; Zoology's 0.01: about 1 / g).

b - example, n - position, p - pair, g - gap slot
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from einops import repeat
from torch import Tensor

IGNORE = -100  # the label of a position that is not a query (torch's cross_entropy ignore_index)


@dataclass(frozen=True)
class MQARData:
    """Examples of one MQAR task: token ids and the labels a model is scored on."""

    inputs: Tensor  # (b, n) int64
    labels: Tensor  # (b, n) int64: the value at each query's position, IGNORE elsewhere

    @property
    def queries(self) -> Tensor:
        """(b, n) bool: the positions that are scored."""
        return self.labels != IGNORE


@dataclass(frozen=True)
class MQARTask:
    """The sizes of one MQAR task, checked when built: sequence length N, P key-value pairs, the vocabulary, the
    power law of the query gaps."""

    seq_len: int = 64
    pairs: int = 4
    vocab: int = 1024
    alpha: float = 0.01  # Zoology's power_a

    def __post_init__(self) -> None:
        if self.pairs < 1:
            raise ValueError(f"pairs must be at least 1, got {self.pairs}")
        if self.seq_len < 4 * self.pairs:
            raise ValueError(
                f"seq_len {self.seq_len} is too short for {self.pairs} pairs: the pairs take 2P = {2 * self.pairs} "
                f"positions and their P queries need P distinct gap slots among (N - 2P) // 2; use seq_len >= 4P = "
                f"{4 * self.pairs} or fewer pairs"
            )
        if len(self.keys) < self.pairs or len(self.values) < self.pairs:
            raise ValueError(
                f"vocab {self.vocab} is too small for {self.pairs} distinct keys and values: keys come from "
                f"[1, vocab // 2) ({len(self.keys)} ids), values from [vocab // 2, vocab); use vocab >= "
                f"{2 * self.pairs + 2}"
            )
        if not self.alpha > 0:
            why = "1: uniform gaps; Zoology's 0.01: about 1 / gap"
            raise ValueError(f"alpha must be positive ({why}); got {self.alpha}")

    @property
    def keys(self) -> range:
        """The token ids a key is drawn from (token 0 is never a key, as Zoology's)."""
        return range(1, self.vocab // 2)

    @property
    def values(self) -> range:
        """The token ids a value is drawn from."""
        return range(self.vocab // 2, self.vocab)

    @property
    def gap_slots(self) -> int:
        """How many places a query may take after the pairs: every second position."""
        return (self.seq_len - 2 * self.pairs) // 2

    def gap_probabilities(self) -> Tensor:
        """(g,) float64: the power law P(g) proportional to (g + 1)^(alpha - 1) over the gap slots."""
        weights = torch.arange(1, self.gap_slots + 1, dtype=torch.float64) ** (self.alpha - 1)
        return weights / weights.sum()

    def sample(self, examples: int, generator: torch.Generator) -> MQARData:
        """`examples` fresh examples drawn from `generator` (the same generator state gives the same examples)."""
        if examples < 1:
            raise ValueError(f"examples must be at least 1, got {examples}")
        b, p, n = examples, self.pairs, self.seq_len
        keys = _distinct(b, p, self.keys, generator)  # (b, p)
        values = _distinct(b, p, self.values, generator)  # (b, p)
        gap_weights = repeat(self.gap_probabilities(), "g -> b g", b=b)
        gaps = torch.multinomial(gap_weights, p, replacement=False, generator=generator)  # (b, p), query of pair p
        query_positions = 2 * p + 2 * gaps  # (b, p)

        inputs = torch.randint(self.vocab, (b, n), generator=generator)  # the filler: any token
        inputs[:, 0 : 2 * p : 2], inputs[:, 1 : 2 * p : 2] = keys, values
        inputs.scatter_(1, query_positions, keys)
        labels = torch.full((b, n), IGNORE, dtype=torch.int64).scatter_(1, query_positions, values)
        return MQARData(inputs, labels)


def _distinct(examples: int, count: int, ids: range, generator: torch.Generator) -> Tensor:
    """(examples, count) int64: `count` distinct ids from `ids` in each row, uniformly."""
    uniform = torch.ones(examples, len(ids))
    return torch.multinomial(uniform, count, replacement=False, generator=generator) + ids.start


def multiquery_ar(task: MQARTask, examples: int, seed: int) -> MQARData:
    """`examples` examples of `task`, the same for the same seed."""
    return task.sample(examples, torch.Generator().manual_seed(seed))


@functools.lru_cache(maxsize=None)  # one figure per task: every training of a grid's (N, pairs) point asks for it
def within_reach(task: MQARTask, reach: int, examples: int = 4000) -> float:
    """The share of queries whose key lies at most `reach` positions back (a model whose mixer sees nothing still
    recalls those through its short convolutions), measured on `examples` drawn from a fixed seed."""
    data = multiquery_ar(task, examples, seed=123)
    rows, positions = data.queries.nonzero(as_tuple=True)
    keys = data.inputs[rows, positions]
    key_positions = 2 * (data.inputs[rows, : 2 * task.pairs : 2] == keys[:, None]).int().argmax(dim=1)
    return float((positions - key_positions <= reach).float().mean())
