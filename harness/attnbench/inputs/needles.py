"""Needles: P key -> value pairs planted in a background context, each key queried later. A training-free recall test.

Error against softmax says how far one output moves; it does not say whether the fact a query asks for survives.
Here each of P positions p gets a fresh value, and its key a component along a direction u (per head, orthonormal
when P <= d, in the span the context's queries and keys use least) so that it projects on u 1.5 times more than any
other visible key; a later position t gets the probe query along the same u, long enough that its logit on the
needle exceeds the log-sum-exp of its other visible logits by `margin` nats: exact attention puts
1 / (1 + e^-margin) of the probe's mass on its needle (99.97% at the default 8) and so retrieves it, while the other
queries of a causal context attend the needle as they did the key it was (nothing else in the context moves). A variant retrieves the needle when its output at t is
nearer (by cosine) to the planted value than to any other visible value (`needle_accuracy`); chance is about
1 / (visible keys).

Distances t - p are drawn uniform over the whole context: δ ~ U[1, L - 2], then t uniform among the allowed query
positions with t - δ >= 1 (position 0 keeps its sink). Decode places every query among the generated steps and every
key in the prompt (`queries_from` = the prompt's length). Padded keys are never planted on. P <= head_dim: the
directions are orthonormal, so what one needle adds is invisible to another's probe and the margin holds exactly.

b - batch, h - heads, n - position, d - head dim, e - value dim, p - planted pair
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

from attnbench.ops import real_lengths

NEEDLE_DEFAULTS = {"pairs": 16, "margin": 8.0, "background": "realistic"}
MAX_MARGIN = 30.0  # nats: beyond, float32 sees no difference (1 - 1e-13 of the mass) and the probes only grow
MIN_VALUE_DIM = 8  # narrower values: another value can lie nearer by cosine to the output than the planted one
MIN_POSITIONS_PER_PAIR = 4  # a context of N holds at most N / 4 pairs: keys and queries stay a minority
SEPARATION = 1.5  # a needle projects this many times the most any other visible key does on its direction
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
        problems.append(f"needles: pairs={pairs} needs decode_steps >= {pairs} (each needle's probe is a step), "
                        f"got decode_steps={query_room}")  # fmt: skip
    return problems


def needle_cell_problems(
    params: dict, *, seq_len: int, n_k: int, padding: float, head_dim: int, value_dim: int, decode_steps: int | None
) -> list[str]:
    """Why this input's needles cannot be planted in one cell (its N, padding, head_dim, and in decode the steps
    that hold the queries), or []. Such a cell is skipped with these reasons; the rest of the run goes on."""
    if n_k != seq_len:
        return ["needles: a needle's query asks for a key of its own sequence: leave kv_lens at 0"]
    pairs = {**NEEDLE_DEFAULTS, **params}["pairs"]
    shortest = real_lengths(1, seq_len, padding)[0]  # real keys of the most padded batch row, whatever the batch
    found = needle_problems(pairs, shortest, head_dim=head_dim, query_room=decode_steps)
    found = [f"{p} (N after padding)" if padding > 0 and "needs N" in p else p for p in found]
    if (value_dim or head_dim) < MIN_VALUE_DIM:
        found.append(f"needles: values of width {value_dim or head_dim} are too narrow to tell the planted value from "
                     f"the others by cosine: use value_dim (or head_dim) >= {MIN_VALUE_DIM}")  # fmt: skip
    return found


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


def _quiet_directions(generator: torch.Generator, q: Tensor, k: Tensor, real: Tensor, pairs: int) -> Tensor:
    """(b, h, p, d) unit directions, orthonormal per row and head, in the span the row's queries and keys use least
    (the eigenvectors of the sum of their trace-normalized second moments with the smallest half of its eigenvalues,
    or P of them when P > d/2). Other keys barely project on such a direction, so a needle along it stands out for
    the probe along it; other queries barely project on it either, so to them the needle is an ordinary key."""
    b, h, n, d = k.shape
    moment = torch.zeros(b, h, d, d, dtype=torch.float64)
    for x in (q, k):
        kept = (x * real[:, None, :, None]).double()  # (b, h, n, d): padding takes no part
        second = torch.einsum("bhnd,bhne->bhde", kept, kept)  # (b, h, d, d)
        moment += second / torch.diagonal(second, dim1=-2, dim2=-1).sum(-1)[..., None, None].clamp(min=1e-30)
    _, vectors = torch.linalg.eigh(moment)  # eigenvalues ascending
    room = max(pairs, d // 2)
    mix = torch.linalg.qr(torch.randn(b, h, room, pairs, generator=generator, dtype=torch.float64)).Q  # (b, h, r, p)
    return rearrange(vectors[..., :room] @ mix, "b h d p -> b h p d").float()


def _ordinary_norm(x: Tensor, lengths: list[int]) -> Tensor:
    """(b, h): the median length of each row and head's vectors among its real positions (padding left out)."""
    return torch.stack([torch.linalg.vector_norm(x[row, :, :length], dim=-1).median(dim=-1).values
                        for row, length in enumerate(lengths)])  # fmt: skip


def _probe_lengths(planted: Tensor, others: Tensor, margin: float, scale: float) -> Tensor:
    """(b, h, p) length λ of each probe u such that its logit on the needle, λ |k| / scale, exceeds the
    log-sum-exp of its logits on the other visible keys, λ (u . k_j) / scale, by `margin`. The gap grows
    monotonically in λ (the needle's key projects most on u), so bisection finds it. `planted` (b, h, p): |k| of
    each needle; `others` (b, h, p, n): u . k_j, -inf where not visible."""
    def gap(length: Tensor) -> Tensor:
        return length * planted / scale - torch.logsumexp(length[..., None] * others / scale, dim=-1)

    visible = torch.isfinite(others).sum(dim=-1).clamp(min=1)  # (b, h, p)
    top = others.amax(dim=-1).clamp(min=0)
    low, high = torch.zeros_like(planted), scale * (margin + visible.log()) / (planted - top)  # gap(high) >= margin
    for _ in range(60):  # float64: the margin to ~1e-12 nats
        middle = (low + high) / 2
        short = gap(middle) < margin
        low, high = torch.where(short, middle, low), torch.where(short, high, middle)
    return high


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

    Each needle's key is the context's own key at its position plus a component along a direction the context's
    queries and keys use least (`_quiet_directions`), just long enough that the key projects SEPARATION times the
    most any other visible key does on it. Its probe query lies along that direction, made long enough
    (`_probe_lengths`) that exact attention puts 1 / (1 + e^-margin) of the probe's mass on it. So the needle stands
    out for its own query only: a cache policy that ranks keys by the attention other queries paid them has no
    more reason to keep it than any key.

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
    rows = torch.arange(b)[:, None]  # (b, 1)
    position = torch.arange(n)
    real = position[None, :] < torch.tensor(lengths)[:, None]  # (b, n)
    directions = _quiet_directions(generator, q, k, real, pairs)  # (b, h, p, d)
    v_norm = _ordinary_norm(v, lengths)[..., None, None]  # (b, h, 1, 1): each head's ordinary value
    values = torch.randn(b, h, pairs, v.shape[-1], generator=generator)
    values = values / torch.linalg.vector_norm(values, dim=-1, keepdim=True) * v_norm  # (b, h, p, e)

    key_norm = _ordinary_norm(k, lengths)  # (b, h): an ordinary key's length
    v[rows, :, key_at] = rearrange(values, "b h p e -> b p h e")
    visible = real[:, None, :] & (position[None, None, :] <= query_at[:, :, None] if causal else True)  # (b, p, n)
    visible = visible & (position[None, None, :] != key_at[:, :, None])  # the needle itself is not among the others
    at = torch.einsum("bhpd,bhnd->bhpn", directions.double(), k.double())  # (b, h, p, n): u . k_j before planting
    others = at.masked_fill(~visible[:, None], -math.inf)
    own = torch.gather(at, -1, key_at[:, None, :, None].expand(b, h, pairs, 1))[..., 0]  # (b, h, p): u . k, the key's own
    # the needle's key: its own key plus `added` along u, just enough to project SEPARATION times the most any other
    # visible key does (a tenth of an ordinary key's length at least), so other queries barely see the addition
    floor = (0.1 * key_norm[..., None].double()).clamp(min=1e-6)  # (b, h, 1): all-zero keys too
    planted = torch.maximum(torch.maximum(own, SEPARATION * others.amax(dim=-1)), floor)  # (b, h, p)
    added = planted - own
    probe = _probe_lengths(planted, others, margin, math.sqrt(d))  # (b, h, p)
    k[rows, :, key_at] += rearrange(added.float()[..., None] * directions, "b h p d -> b p h d")
    q[rows, :, query_at] = rearrange(probe.float()[..., None] * directions, "b h p d -> b p h d")
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
