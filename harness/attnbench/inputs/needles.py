"""Needles: P key -> value pairs planted in a background context, each key queried later. A training-free recall test.

Error against softmax says how far one output moves; it does not say whether the fact a query asks for survives.
Here each of P positions p gets a key along a direction u (per head; orthonormal when P <= d) and a fresh value,
and a later position t gets a query along the same u. The key's length is set so that the planted logit exceeds
the log-sum-exp of the query's other visible logits by `margin` nats: exact attention puts 1 / (1 + e^-margin) of
the query's mass on its needle (99.97% at the default 8) and so retrieves it. A variant retrieves the needle when
its output at t is nearer (by cosine) to the planted value than to any other visible value (`needle_accuracy`);
chance is about 1 / (visible keys).

Distances t - p are drawn uniform over the whole context: δ ~ U[1, L - 2], then t uniform among the allowed query
positions with t - δ >= 1 (position 0 keeps its sink). Decode places every query among the generated steps and every
key in the prompt (`queries_from` = the prompt's length). Padded keys are never planted on. P <= head_dim: the
directions are orthonormal, so a probe sees no other needle and the margin holds exactly.

b - batch, h - heads, n - position, d - head dim, e - value dim, p - planted pair
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

NEEDLE_DEFAULTS = {"pairs": 16, "margin": 8.0, "background": "realistic"}
MAX_MARGIN = 30.0  # nats: beyond, nothing changes in float32 and the planted keys overflow float16
MIN_POSITIONS_PER_PAIR = 4  # a context of N holds at most N / 4 pairs: keys and queries stay a minority
_TRIES = 1000  # draws of one pair's positions before giving up (only a crowded context gets near it)


@dataclass(frozen=True)
class Needles:
    """Where the pairs are: for batch row b and pair p, the key at `key_positions[b, p]` and its query at
    `query_positions[b, p]` (key < query). The same positions in every head; each head has its own directions."""

    key_positions: Tensor  # (b, p) long
    query_positions: Tensor  # (b, p) long

    @property
    def pairs(self) -> int:
        return self.key_positions.shape[1]


def needle_problems(
    pairs: int, length: int, *, head_dim: int | None = None, query_room: int | None = None
) -> list[str]:
    """Why `pairs` needles cannot be planted in a context of `length` real positions with heads of `head_dim`
    (queries confined to the last `query_room` of them in decode), or []: a clear error before any work."""
    problems = []
    if head_dim is not None and pairs > head_dim:
        problems.append(
            f"needles: pairs={pairs} needs head_dim >= {pairs} (each pair its own orthogonal direction, so exact "
            f"attention retrieves every one by the margin), got head_dim={head_dim}"
        )
    if pairs * MIN_POSITIONS_PER_PAIR > length:
        problems.append(
            f"needles: pairs={pairs} needs N >= {MIN_POSITIONS_PER_PAIR * pairs} "
            f"({MIN_POSITIONS_PER_PAIR} positions a pair), got N={length}"
        )
    if query_room is not None and pairs > query_room:
        problems.append(f"needles: pairs={pairs} queries need as many decode steps (decode_steps={query_room})")
    return problems


def needle_cell_problems(
    params: dict, *, seq_len: int, n_k: int, padding: float, head_dim: int, decode_steps: int | None
) -> list[str]:
    """Why this input's needles cannot be planted in one cell (its N, padding, head_dim, and in decode the steps
    that hold the queries), or []. Such a cell is skipped with these reasons; the rest of the run goes on."""
    if n_k != seq_len:
        return ["needles: a needle's query asks for a key of its own sequence: leave kv_lens at 0"]
    pairs = {**NEEDLE_DEFAULTS, **params}["pairs"]
    shortest = seq_len - min(seq_len - 1, round(padding * seq_len))  # real keys of the most padded batch row
    found = needle_problems(pairs, shortest, head_dim=head_dim, query_room=decode_steps)
    return [f"{p} (N after padding)" if padding > 0 else p for p in found]


def _positions(
    generator: torch.Generator, pairs: int, length: int, queries_from: int
) -> tuple[list[int], list[int]]:
    """One batch row's key and query positions: distinct, key < query, distance uniform over the context."""
    used: set[int] = {0}
    keys, queries = [], []
    for _ in range(pairs):
        for _ in range(_TRIES):
            distance = int(torch.randint(1, length - 1, (1,), generator=generator))  # δ in [1, L - 2]
            low = max(distance + 1, queries_from)
            if low > length - 1:
                continue
            t = int(torch.randint(low, length, (1,), generator=generator))
            key_in_prompt = not queries_from or t - distance < queries_from  # decode: the steps hold queries only
            if t not in used and t - distance not in used and key_in_prompt:
                break
        else:
            raise ValueError(f"needles: could not place {pairs} pairs in {length} positions (queries from "
                             f"{queries_from}); plant fewer")  # fmt: skip
        used |= {t, t - distance}
        keys.append(t - distance)
        queries.append(t)
    return keys, queries


def _directions(generator: torch.Generator, heads: int, pairs: int, dim: int) -> Tensor:
    """(h, p, d) unit directions, orthonormal per head when p <= d (a probe then sees no other needle)."""
    draw = torch.randn(heads, dim, max(pairs, 1), generator=generator)
    if pairs <= dim:
        return rearrange(torch.linalg.qr(draw).Q[..., :pairs], "h d p -> h p d")
    return rearrange(draw / torch.linalg.vector_norm(draw, dim=1, keepdim=True), "h d p -> h p d")


def plant_needles(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    generator: torch.Generator,
    *,
    pairs: int,
    margin: float,
    causal: bool,
    lengths: list[int] | None = None,
    queries_from: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Needles]:
    """Plant `pairs` needles into float32 q, k, v (b, h, n, d|e) on the CPU (copies; the inputs are untouched).

    `lengths[b]`: the real (unpadded) keys of row b, default n. `queries_from`: the first position a query may take.
    """
    q, k, v = q.clone(), k.clone(), v.clone()
    b, h, n, d = q.shape
    lengths = lengths or [n] * b
    for problem in needle_problems(pairs, min(lengths), head_dim=d):
        raise ValueError(problem)
    placed = [_positions(generator, pairs, length, queries_from) for length in lengths]
    key_at = torch.tensor([keys for keys, _ in placed], dtype=torch.long)  # (b, p)
    query_at = torch.tensor([queries for _, queries in placed], dtype=torch.long)  # (b, p)
    directions = _directions(generator, h, pairs, d)  # (h, p, d)
    rows = torch.arange(b)[:, None]  # (b, 1)
    q_norm = torch.linalg.vector_norm(q, dim=-1).median()
    v_norm = torch.linalg.vector_norm(v, dim=-1).median()
    values = torch.randn(b, h, pairs, v.shape[-1], generator=generator)
    values = values / torch.linalg.vector_norm(values, dim=-1, keepdim=True) * v_norm  # (b, h, p, e)

    probes = q_norm * directions[None]  # (b, h, p, d): every probe of a head along its pair's direction
    q[rows, :, query_at] = rearrange(probes, "b h p d -> b p h d")
    k[rows, :, key_at] = 0.0  # the needles' own logits are set below; other needles' are 0 (orthogonal) meanwhile
    v[rows, :, key_at] = rearrange(values, "b h p e -> b p h e")
    logits = torch.einsum("bhpd,bhnd->bhpn", probes, k) / math.sqrt(d)  # (b, h, p, n)
    position = torch.arange(n)
    visible = position[None, :] < torch.tensor(lengths)[:, None]  # (b, n)
    visible = visible[:, None, :] & (position[None, None, :] <= query_at[:, :, None] if causal else True)  # (b, p, n)
    logits = logits.masked_fill(~visible[:, None], -math.inf)
    rest = torch.logsumexp(logits, dim=-1)  # (b, h, p): the key row is 0 now, so its logit 0 is in the sum: harmless
    target = torch.clamp(rest + margin, min=margin)  # the planted logit
    lengths_k = target * math.sqrt(d) / q_norm  # |k| with q.k / sqrt(d) = target
    k[rows, :, key_at] = rearrange(lengths_k[..., None] * directions[None], "b h p d -> b p h d")
    return q, k, v, Needles(key_at, query_at)


def needle_hits(
    output: Tensor,
    v: Tensor,
    needles: Needles,
    *,
    causal: bool,
    key_padding_mask: Tensor | None = None,
    first_position: int = 0,
) -> Tensor:
    """(b, h, p) bool: whether the output at each needle's query is nearer by cosine to its planted value than to
    any other visible value (padding is not visible). `output` (b, h, i, e) holds positions first_position.. (decode:
    the steps)."""
    rows = torch.arange(output.shape[0])[:, None]  # (b, 1)
    at = rearrange(output[rows, :, needles.query_positions - first_position], "b p h e -> b h p e").double()
    candidates = torch.nn.functional.normalize(v.double(), dim=-1)  # (b, h, n, e)
    similarity = torch.einsum("bhpe,bhne->bhpn", torch.nn.functional.normalize(at, dim=-1), candidates)
    position = torch.arange(v.shape[2], device=v.device)
    if causal:
        late = position[None, None, :] > needles.query_positions.to(v.device)[:, :, None]  # (b, p, n)
        similarity = similarity.masked_fill(late[:, None], -math.inf)
    if key_padding_mask is not None:
        similarity = similarity.masked_fill(key_padding_mask[:, None, None, :], -math.inf)
    return similarity.argmax(dim=-1) == needles.key_positions.to(v.device)[:, None, :]
